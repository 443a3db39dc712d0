"""UL2's mixture of denoisers: each denoiser's measured rate and mean span against its configuration, the
mixture's proportions, mode tokens, reconstruction of the text from input + target, the refusals, and a tiny
`lmforge pretrain --objective ul2` run that resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import command_args
import lmforge
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.objectives import UL2, build_objective, check_architecture
from lmforge.objectives.ul2 import DEFAULT_DENOISERS, mode_token_ids
from lmforge.tokenization import Tokenizer
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining
from test_training_pretrain import TINY, data_root, prepared  # noqa: F401
from test_training_resume import assert_stop_and_resume_is_exact

PAD, EOS = 0, 1
TEXT_IDS = (10, 10_000)  # ordinary tokens are drawn from here
SENTINELS = list(range(10_000, 10_600))  # enough for 50% noise in spans of 3 on 3072 tokens
VOCAB = 10_600
NLU, NLG, S2S = VOCAB, VOCAB + 1, VOCAB + 2


def ul2(**options) -> UL2:
    return UL2(sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB, **options)


def is_sentinel(t: torch.Tensor) -> torch.Tensor:
    return (t >= SENTINELS[0]) & (t <= SENTINELS[-1])


def reconstruct(source: list[int], target: list[int]) -> list[int]:
    """The text back from a span-corruption pair, by hand: each sentinel of the input replaced by what follows
    the same sentinel in the target."""
    pieces, current = {}, None
    for t in target[:-1]:  # without EOS
        if SENTINELS[0] <= t <= SENTINELS[-1]:
            current = pieces.setdefault(t, [])
        else:
            current.append(t)
    out = []
    for t in source[1:-1]:  # without the mode token and EOS
        out.extend(pieces[t] if SENTINELS[0] <= t <= SENTINELS[-1] else [t])
    return out


def test_mode_token_ids_follow_the_vocabulary():
    assert mode_token_ids(VOCAB) == {"[NLU]": NLU, "[NLG]": NLG, "[S2S]": S2S}


@pytest.mark.parametrize("index", range(len(DEFAULT_DENOISERS) - 1))  # the six span denoisers
def test_span_denoiser_rate_and_mean_span_match_the_configuration(index):
    # ~150k tokens per denoiser (about 1M over the seven), lengths varied so that rounding averages out.
    objective = ul2(seed=index)
    d = objective.denoisers[index]
    g = torch.Generator().manual_seed(index)
    lengths = torch.randint(2048, 3073, (58,), generator=g).tolist()
    noise = spans = total = 0
    for n in lengths:
        tokens = torch.randint(*TEXT_IDS, (n,), generator=g)
        source, target = objective.corrupt(tokens, index)
        assert int(source[0]) == (NLU if d.kind == "R" else NLG) and int(source[-1]) == EOS
        noise += len(target) - 1 - int(is_sentinel(target).sum())  # target: sentinels, noise tokens, EOS
        spans += int(is_sentinel(source).sum())  # one sentinel per noise span in the input
        total += n
    assert abs(noise / total - d.rate) < 0.001, (noise / total, d.rate)
    assert abs(noise / spans / d.mean_span - 1) < 0.01, (noise / spans, d.mean_span)


@pytest.mark.parametrize("spec", [s for s in DEFAULT_DENOISERS if not s.startswith("S")])
def test_span_denoisers_targets_reconstruct_the_text(spec):
    objective = ul2(denoisers=[spec], seed=3)
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 64, 300):
        tokens = torch.randint(*TEXT_IDS, (n,), generator=g)
        source, target = objective.corrupt(tokens, 0)
        assert reconstruct(source.tolist(), target.tolist()) == tokens.tolist()


def test_s_denoiser_prefix_and_suffix_give_the_text_and_the_target_share_is_the_rate():
    objective = ul2(denoisers=["S:0.25"], seed=5)
    g = torch.Generator().manual_seed(5)
    shares = []
    for n in [200] * 5000 + [1, 2, 3]:
        tokens = torch.randint(*TEXT_IDS, (n,), generator=g)
        source, target = objective.corrupt(tokens, 0)
        assert int(source[0]) == S2S and int(source[-1]) == EOS and int(target[-1]) == EOS
        assert torch.cat([source[1:-1], target[:-1]]).tolist() == tokens.tolist()  # prefix + suffix = text
        assert len(target) >= 2  # at least one token to predict
        shares.append((len(target) - 1) / n)
    # k uniform on 1..99 for n=200: mean share 50/200; 5000 draws give a standard error of about 0.002.
    assert abs(sum(shares[:5000]) / 5000 - 0.25) < 0.01


def test_default_mixture_is_uniform_over_the_seven_denoisers():
    counts = torch.bincount(ul2(seed=0).choose(200_000), minlength=7).double() / 200_000
    assert torch.allclose(counts, torch.full((7,), 1 / 7, dtype=torch.double), atol=0.004), counts


def test_configured_proportions_and_each_example_begins_with_its_mode_token():
    options = dict(denoisers="R:3:0.15, X:32:0.5, S:0.25", proportions=[5, 3, 2], seed=1)
    counts = torch.bincount(ul2(**options).choose(200_000), minlength=3).double() / 200_000
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.2], dtype=torch.double), atol=0.004), counts
    # A batch draws its denoisers first: a twin with the same seed replays the draw, row by row.
    objective, twin = ul2(**options), ul2(**options)
    batch = objective([list(range(20, 32))] * 64)
    expected = torch.tensor([NLU, NLG, S2S])[twin.choose(64)]
    assert torch.equal(batch["input_ids"][:, 0], expected)


def test_seq2seq_and_decoder_layouts():
    tokens = list(range(20, 40))
    seq2seq = ul2(denoisers=["S:0.25"], seed=0)([tokens])
    assert seq2seq["input_ids"][0, 0] == S2S and seq2seq["labels"][0, -1] == EOS
    assert seq2seq["decoder_input_ids"][0, 0] == PAD  # T5 starts decoding from pad
    decoder = ul2(denoisers=["S:0.25"], seed=0, layout="prefix-lm")([tokens])
    # The same split: the decoder reads input then target, and only the target carries loss.
    source_len = int(seq2seq["attention_mask"].sum())
    target = seq2seq["labels"][0].tolist()
    assert decoder["input_ids"][0].tolist() == seq2seq["input_ids"][0].tolist() + target[:-1]
    assert decoder["labels"][0].tolist() == [-100] * (source_len - 1) + target
    assert decoder["attention_mask"].shape == (1, source_len + len(target) - 1, source_len + len(target) - 1)
    check_architecture("ul2", "decoder")
    check_architecture("ul2", "encoder-decoder")


def test_state_dict_replays_the_next_batch():
    a = ul2(seed=4)
    examples = [list(range(20, 80))] * 4
    a(examples)
    state = a.state_dict()
    expected = a(examples)
    b = ul2(seed=99)
    b.load_state_dict(state)
    got = b(examples)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("options, names", [
    ({"denoisers": ["Q:3:0.15"]}, "'Q:3:0.15' has kind 'Q'"),
    ({"denoisers": ["R:3"]}, "'R:3' has 2 fields"),
    ({"denoisers": ["X:64:1.5"]}, "'X:64:1.5': the rate must be in (0, 1)"),
    ({"denoisers": ["R:0.5:0.15"]}, "the mean span must be at least 1"),
    ({"denoisers": ["R:three:0.15"]}, "must be numbers"),
    ({"denoisers": []}, "denoisers=[] must be a non-empty list"),
    ({"proportions": [1, 2]}, "proportions has 2 weights for 7 denoisers"),
    ({"proportions": [1, 1, 1, 1, 1, 1, -1]}, "must be non-negative"),
])
def test_bad_options_are_one_line_naming_the_option(options, names):
    with pytest.raises(ConfigError) as info:
        ul2(**options)
    message = str(info.value)
    assert names in message and "\n" not in message and message.startswith("objective_options: ")


def test_too_few_sentinels_for_the_sequence_length_are_refused():
    # 1022 tokens of text: 511 noise tokens in round(511 / 3) = 170 spans, plus a closing sentinel.
    with pytest.raises(ConfigError, match=r"'X:3:0.5' needs up to 171 sentinels on 1022 tokens of text, the "
                                          r"tokenizer has 100; lower --seq-len"):
        UL2(sentinel_ids=SENTINELS[:100], eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB, max_length=1024)
    # On a decoder, input and target share the sequence: each gets half, and 1024 fits (510 tokens: 86 sentinels).
    UL2(sentinel_ids=SENTINELS[:100], eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB, max_length=1024,
        layout="decoder")
    # 512 for an encoder-decoder: 85 spans + 1 of 100.
    UL2(sentinel_ids=SENTINELS[:100], eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB, max_length=512)
    with pytest.raises(ConfigError, match="R and X denoisers need sentinel ids"):
        UL2(sentinel_ids=[], eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB)
    # The S-denoiser alone needs none (e.g. a GPT tokenizer on a decoder).
    UL2(sentinel_ids=[], eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB, denoisers=["S:0.25"])
    assert build_objective("ul2", sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, vocab_size=VOCAB)


# ------------------------------------------------------------------ lmforge pretrain --objective ul2
PRESET, _, OVERRIDES = TINY["span-corruption"]  # t5-tiny, made tiny


def test_pretrain_cli_end_to_end_records_the_mode_tokens(data_root, tmp_path):
    data = prepared(data_root, "t5")
    out = tmp_path / "run"
    options = {"model": PRESET, "objective": "ul2", "data": data, "out": out, "max_steps": 3, "batch_size": 4,
               "seq_len": 32, "eval_every": 2, "eval_batches": 1, "save_every": 2, "precision": "fp32", "warmup": 1}
    assert main(command_args(["pretrain", "--no-progress"], options, OVERRIDES)) == 0
    tok = Tokenizer.load(data / "tokenizer")
    model = lmforge.load(out / "model")
    assert model.config.vocab_size == tok.vocab_size + 3  # the three mode tokens
    assert json.loads((out / "model" / "mode_tokens.json").read_text()) == mode_token_ids(tok.vocab_size)
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert losses and all(loss == loss for loss in losses)  # finite numbers, no NaN


def test_pretrain_cli_refuses_a_bad_denoiser_in_one_line(data_root, tmp_path, capsys):
    data = prepared(data_root, "t5")
    options = {"model": PRESET, "objective": "ul2", "data": data, "out": tmp_path / "bad", "max_steps": 1,
               "seq_len": 32, "precision": "fp32", "objective_option": "denoisers=[R:3:0.15,Z:1:0.5]"}
    assert main(command_args(["pretrain", "--no-progress"], options, OVERRIDES)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "denoisers: 'Z:1:0.5' has kind 'Z'" in err[0], err
    assert not (tmp_path / "bad").exists()


def test_pretrain_stop_and_resume_is_exact(data_root, tmp_path):
    data = prepared(data_root, "t5")

    assert_stop_and_resume_is_exact(tmp_path, PRESET, "ul2", data, OVERRIDES)


@pytest.mark.parametrize("layout", ["decoder", "prefix-lm"])
def test_pretrain_a_decoder_with_input_and_target_concatenated(layout, data_root, tmp_path):
    data = prepared(data_root, "t5")  # a T5 tokenizer: its sentinels serve the R- and X-denoisers
    cfg = TrainConfig.from_dict(dict(
        model="gpt-tiny", objective="ul2", data=str(data), out=str(tmp_path / layout), overrides=TINY["clm"][2],
        objective_options={"layout": layout}, max_steps=2, batch_size=2, seq_len=64, precision="fp32",
        progress=False, tensorboard=False, eval_every=0))
    run = build_pretraining(cfg)
    assert run.model.config.arch == "decoder" and run.trainer.fit().step == 2
    assert run.model.config.vocab_size == Tokenizer.load(data / "tokenizer").vocab_size + 3


def test_a_vocabulary_without_room_for_the_mode_tokens_is_refused(data_root, tmp_path):
    data = prepared(data_root, "t5")
    vocab = Tokenizer.load(data / "tokenizer").vocab_size
    cfg = TrainConfig.from_dict(dict(model=PRESET, objective="ul2", data=str(data), out=str(tmp_path / "run"),
                                     overrides={**OVERRIDES, "vocab_size": vocab + 2}, max_steps=1, seq_len=32,
                                     progress=False))
    with pytest.raises(ConfigError, match=rf"vocab_size={vocab + 2} has no room for the tokens "
                                          rf"\[NLU\], \[NLG\], \[S2S\] of objective 'ul2' .* it needs {vocab + 3}"):
        build_pretraining(cfg)
    assert not (tmp_path / "run").exists()
