"""The rows of BART's objective comparison beside its own: MASS, XLNet's permuted LM (two-stream attention) and
UniLM's per-row attention masks. Batch layouts by hand, the masks' visibility rules, and pretrain end to end."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_config
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer
from lmforge.models.two_stream import TwoStreamLM
from lmforge.objectives import Mass, PermutedLM, UniLM, check_architecture
from lmforge.objectives.permuted_lm import permutation_masks
from lmforge.objectives.unilm import BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ, unilm_mask
from test_training_pretrain import data_root, prepared  # noqa: F401  (a module-scoped fixture)

PAD, MASK = 0, 3


# ------------------------------------------------------------------ MASS
def test_mass_batch_by_hand(monkeypatch):
    mass = Mass(mask_token_id=MASK, pad_token_id=PAD, decoder_start_token_id=1)
    spans = iter([(1, 4), (2, 4)])  # x[1:4] of 6 tokens (k = 3), x[2:4] of 4 tokens (k = 2)
    monkeypatch.setattr(mass, "fragment", lambda length: next(spans))
    batch = mass([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23]])
    assert batch["input_ids"].tolist() == [[10, 3, 3, 3, 14, 15], [20, 21, 3, 3, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[11, 12, 13], [22, 23, -100]]
    assert batch["decoder_input_ids"].tolist() == [[1, 11, 12], [1, 22, 23]]
    assert batch["position_ids"].tolist() == [[1, 2, 3], [2, 3, 3]]  # padding repeats the last position


def test_mass_masks_one_contiguous_half_and_predicts_exactly_it():
    mass = Mass(mask_token_id=MASK, pad_token_id=PAD, seed=1)
    for m in (2, 7, 10, 31):
        x = torch.arange(10, 10 + m)
        batch = mass([x])
        masked = (batch["input_ids"][0] == MASK).nonzero().squeeze(1)
        u, k = int(masked[0]), len(masked)
        assert k == min(max(round(m / 2), 1), m - 1) and masked.tolist() == list(range(u, u + k))  # contiguous
        assert batch["labels"][0].tolist() == x[u:u + k].tolist()  # exactly the fragment, nothing else
        assert batch["position_ids"][0].tolist() == list(range(u, u + k))
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1))
    assert model(**mass([torch.arange(10, 20), torch.arange(10, 16)])).loss.isfinite()


def test_mass_masks_a_one_token_sentence_whole():
    # windows cut from documents end in short tails; a one-token one has no context, so it is the k = m case
    batch = Mass(mask_token_id=MASK, pad_token_id=PAD, decoder_start_token_id=1)([[10, 11, 12, 13], [20]])
    assert batch["input_ids"][1].tolist() == [MASK, PAD, PAD, PAD]
    assert (batch["input_ids"][0] == MASK).sum() == 2  # the longer row keeps its half
    assert batch["labels"][1].tolist() == [20, -100] and batch["position_ids"][1].tolist() == [0, 0]
    with pytest.raises(ValueError, match="empty sentence"):
        Mass(mask_token_id=MASK, pad_token_id=PAD)([[]])


def test_the_permuted_lm_predicts_nothing_in_a_one_token_row():
    batch = PermutedLM(pad_token_id=PAD, partial_k=2, seed=0)([[10, 11, 12, 13], [20]])
    assert (batch["labels"][1] == -100).all() and (batch["labels"][0] != -100).sum() == 2
    assert batch["content_mask"][1, 0, 0] and not batch["query_mask"][1, 0].any()  # it sees only itself
    with pytest.raises(ValueError, match="empty sequence"):
        PermutedLM(pad_token_id=PAD)([[]])


def test_mass_on_a_decoder_names_both():
    with pytest.raises(UserInputError, match="objective 'mass' does not fit arch='decoder': .*needs arch='encoder-decoder'"):
        check_architecture("mass", "decoder")


# ------------------------------------------------------------------ permuted LM (XLNet)
def test_permutation_masks_by_hand():
    ranks = torch.tensor([[1, 3, 0, 2]])  # order z = (2, 0, 3, 1)
    real = torch.tensor([[True, True, True, True]])
    content, query = permutation_masks(ranks, real)
    assert content[0].int().tolist() == [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 1, 0], [1, 0, 1, 1]]
    assert query[0].int().tolist() == [[0, 0, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]]


def test_permuted_lm_batch_and_partial_prediction():
    plm = PermutedLM(pad_token_id=PAD, partial_k=3, seed=0)
    batch = plm([list(range(10, 22)), [30, 31, 32, 33, 34, 35]])
    content, query, labels = batch["content_mask"], batch["query_mask"], batch["labels"]
    assert batch["input_ids"][1].tolist() == [30, 31, 32, 33, 34, 35] + [PAD] * 6
    for b, n in enumerate((12, 6)):
        assert not query[b].diagonal()[:n].any() and content[b].diagonal()[:n].all()  # own content: content only
        assert not content[b, :, n:].any() and not query[b, :, n:].any()  # padding is never a key
        ranks = content[b, :n, :n].sum(1) - 1  # rank(i) = number of positions ranked before i
        assert sorted(ranks.tolist()) == list(range(n))  # a permutation of the real positions
        predicted = labels[b, :n] != -100
        assert predicted.sum() == n // 3 and (ranks[predicted] >= n - n // 3).all()  # the last 1/K of the order
        assert labels[b, :n][predicted].tolist() == batch["input_ids"][b, :n][predicted].tolist()
        # A query sees exactly the positions ranked before it.
        assert torch.equal(query[b, :n, :n], ranks[None, :] < ranks[:, None])


def test_query_stream_never_sees_its_own_content():
    torch.manual_seed(0)
    model = TwoStreamLM(Transformer(tiny_config(arch="encoder", head="mlm", n_layers=2))).eval()
    batch = PermutedLM(pad_token_id=PAD, partial_k=2, seed=3)([list(range(10, 20))])
    labels = batch.pop("labels")
    logits = model(**batch).logits  # (1, T, V)
    for i in (labels[0] != -100).nonzero().squeeze(1).tolist():
        changed = batch["input_ids"].clone()
        changed[0, i] = 77
        again = model(**{**batch, "input_ids": changed}).logits
        torch.testing.assert_close(again[0, i], logits[0, i], rtol=0, atol=0)  # x_i cannot reach its own query
        later = batch["content_mask"][0, :, i] & (torch.arange(10) != i)  # content rows that see x_i
        if later.any():  # ... while the content stream does pass it on to later queries
            assert not torch.allclose(again[0, later], logits[0, later])


def test_two_stream_loss_and_refusals():
    body = Transformer(tiny_config(arch="encoder", head="mlm"))
    model = TwoStreamLM(body)
    out = model(**PermutedLM(pad_token_id=PAD, seed=0)([list(range(10, 22)), list(range(10, 16))]))
    out.loss.backward()
    assert out.loss.isfinite() and model.query_init.grad is not None and model.saved_model is body
    with pytest.raises(ConfigError, match="position='t5-bias'"):
        TwoStreamLM(Transformer(tiny_config(arch="encoder", head="mlm", position="t5-bias")))
    with pytest.raises(ConfigError, match="arch='decoder'"):
        TwoStreamLM(Transformer(tiny_config(arch="decoder")))


# ------------------------------------------------------------------ UniLM
def test_unilm_masks_by_hand():
    real = torch.tensor([[True] * 4, [True, True, True, False]])
    kinds, prefix = torch.tensor([SEQ2SEQ, SEQ2SEQ]), torch.tensor([2, 1])
    masks = unilm_mask(kinds, prefix, real).int()
    assert masks[0].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert masks[1].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    row = real[:1]
    assert unilm_mask(torch.tensor([BIDIRECTIONAL]), prefix[:1], row).all()
    assert unilm_mask(torch.tensor([LEFT_TO_RIGHT]), prefix[:1], row)[0].int().tolist() == \
        torch.ones(4, 4, dtype=torch.int).tril().tolist()
    assert unilm_mask(torch.tensor([RIGHT_TO_LEFT]), prefix[:1], row)[0].int().tolist() == \
        torch.ones(4, 4, dtype=torch.int).triu().tolist()


def test_unilm_seq2seq_rows_are_bidirectional_on_the_source_and_causal_on_the_target():
    unilm = UniLM(vocab_size=60, mask_token_id=MASK, pad_token_id=PAD, mixture=(0, 0, 0, 1), seed=0)
    batch = unilm([list(range(10, 10 + n)) for n in (9, 5, 7, 12)])
    for b, mask in enumerate(batch["attention_mask"]):
        n = int(mask[0].sum()) if mask[0].all() else None
        real = batch["input_ids"][b] != PAD
        n = int(real.sum())
        P = int(mask[0, :n].sum())  # the first query sees exactly the source
        assert 1 <= P <= n - 1
        assert mask[:P, :P].all() and not mask[:P, P:].any()  # source: bidirectional, never the target
        target = mask[P:n, P:n]
        assert torch.equal(target, torch.ones_like(target).tril())  # target: causal
        assert mask[P:n, :P].all() and not mask[:, n:].any()  # ... after the whole source; padding never


def test_unilm_mixes_the_four_masks_and_trains_an_encoder():
    unilm = UniLM(vocab_size=60, mask_token_id=MASK, pad_token_id=PAD, seed=0)
    batch = unilm([list(range(10, 18))] * 48)
    masks = batch["attention_mask"]
    full = masks.flatten(1).all(1)
    lower = (masks == torch.ones(8, 8, dtype=torch.bool).tril()).flatten(1).all(1)
    upper = (masks == torch.ones(8, 8, dtype=torch.bool).triu()).flatten(1).all(1)
    assert full.any() and lower.any() and upper.any() and (~(full | lower | upper)).any()  # all four kinds
    model = Transformer(tiny_config(arch="encoder", head="mlm", vocab_size=60))
    assert model(**unilm([list(range(10, 18)), list(range(20, 25))])).loss.isfinite()
    with pytest.raises(ValueError, match="mixture must be 4"):
        UniLM(vocab_size=60, mask_token_id=MASK, pad_token_id=PAD, mixture=(1, 1))


# ------------------------------------------------------------------ pretrain end to end
RUNS = {  # run -> (objective, preset, tokenizer family, model overrides, objective options)
    "mass": ("mass", "bart-tiny", "bart", {"n_decoder_layers": 1}, {}),
    "permuted-lm": ("permuted-lm", "bert-tiny", "bert", {}, {}),
    "unilm": ("unilm", "bert-tiny", "bert", {}, {}),
    "span-corruption-decoder": ("span-corruption", "gpt-tiny", "t5", {}, {}),  # layout decoder by default
    "denoising-prefix-lm": ("denoising", "gpt-tiny", "bart", {}, {"layout": "prefix-lm"}),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_pretrain_end_to_end(run, data_root, tmp_path):  # noqa: F811
    objective, preset, family, overrides, options = RUNS[run]
    data = prepared(data_root, family)
    args = ["pretrain", "--no-progress", "--model", preset, "--objective", objective, "--data", str(data),
            "--out", str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "2", "--seq-len", "32",
            "--precision", "fp32", "--warmup", "1", "--eval-every", "0"]
    for key, value in {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64,
                       **overrides}.items():
        args += ["--override", f"{key}={value}"]
    for key, value in options.items():
        args += ["--objective-option", f"{key}={value}"]
    assert main(args) == 0
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_pretrain_refuses_a_layout_that_does_not_fit(data_root, tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "bart")
    args = ["pretrain", "--no-progress", "--model", "bart-tiny", "--objective", "denoising", "--data", str(data),
            "--out", str(tmp_path / "run"), "--max-steps", "1", "--objective-option", "layout=decoder"]
    assert main(args) != 0
    assert "layout='decoder' does not fit arch='encoder-decoder'; use layout='seq2seq'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
