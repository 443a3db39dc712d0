"""``model.generate`` on converted GPT-2, T5 and BART is token-identical to ``transformers``' ``generate``.

Both sides run the same weights (random-init HF models, perturbed so that logits are sharp and near-ties
rare) with the same settings: greedy, beam search (length penalty, the three early-stopping modes,
n-best, an EOS that really ends hypotheses; beam scores compared too), seeded sampling with every
filter, and greedy with repetition penalty / no-repeat-n-gram. GPT-2 is also checked left-padded.
"""

from __future__ import annotations

import copy
import importlib
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
tf = importlib.import_module("transformers")

import lmforge  # noqa: E402

V = 211
N = 10  # new tokens


@torch.no_grad()
def _perturbed(model):
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def _build(family: str):
    torch.manual_seed(0)
    if family == "gpt2":
        hf = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                              bos_token_id=None, eos_token_id=None))
    elif family == "t5":
        hf = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                       num_heads=4, decoder_start_token_id=0, eos_token_id=1,
                                                       pad_token_id=0))
    else:
        hf = tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            forced_eos_token_id=None, forced_bos_token_id=None, bos_token_id=0, pad_token_id=1, eos_token_id=2,
            decoder_start_token_id=2))
    hf = _perturbed(hf)
    ours = lmforge.from_hf(hf)
    if family == "gpt2":
        ids = torch.randint(0, V, (2, 6))
        mask = torch.ones_like(ids)
    else:
        mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])  # a right-padded source
        ids = torch.randint(3, V, (2, 9)).masked_fill(mask == 0, ours.config.pad_token_id)
    return hf, ours, ids, mask


FAMILIES = ["gpt2", "t5", "bart"]
_CACHE: dict[str, tuple] = {}


@pytest.fixture(params=FAMILIES)
def family(request):
    if request.param not in _CACHE:
        _CACHE[request.param] = _build(request.param)
    return _CACHE[request.param]


def _hf_generate(hf, ids, mask, **settings):
    """HF's new tokens (B, T), or its output object when ``return_dict_in_generate``."""
    config = tf.GenerationConfig(max_new_tokens=N, pad_token_id=0, forced_eos_token_id=None, forced_bos_token_id=None,
                                 decoder_start_token_id=getattr(hf.config, "decoder_start_token_id", None), **settings)
    out = hf.generate(ids, attention_mask=mask, generation_config=config)
    prefix = 1 if hf.config.is_encoder_decoder else ids.shape[1]  # the start token / the prompt
    if settings.get("return_dict_in_generate"):
        return out.sequences[:, prefix:], out
    return out[:, prefix:]


def _until_eos(rows: torch.Tensor, eos: int) -> list[list[int]]:
    out = []
    for row in rows.tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def _eos_for(ours, ids, mask) -> int:
    """A token that beam search picks mid-way, so hypotheses really end on it."""
    return int(ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, num_beams=4).sequences[1, 3])


def test_greedy_matches_hf(family, device):
    hf, ours, ids, mask = family
    if device != "cpu":  # the cached CPU models stay where they are for the other tests
        hf, ours = copy.deepcopy(hf).to(device), copy.deepcopy(ours).to(device)
        ids, mask = ids.to(device), mask.to(device)
    expected = _hf_generate(hf, ids, mask, do_sample=False, eos_token_id=None)
    got = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True)
    assert torch.equal(got.sequences, expected)
    assert got.lengths.tolist() == [N, N]


BEAM_SETTINGS = [
    dict(num_beams=4, num_return_sequences=2, length_penalty=1.0, early_stopping=False),
    dict(num_beams=3, num_return_sequences=3, length_penalty=2.0, early_stopping=False),
    dict(num_beams=4, num_return_sequences=2, length_penalty=-1.0, early_stopping=True),
    dict(num_beams=4, num_return_sequences=1, length_penalty=1.5, early_stopping="never"),
]


@pytest.mark.parametrize("settings", BEAM_SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_beam_search_matches_hf(family, settings):
    hf, ours, ids, mask = family
    eos = _eos_for(ours, ids, mask)
    new, out = _hf_generate(hf, ids, mask, do_sample=False, eos_token_id=eos, return_dict_in_generate=True,
                            output_scores=True, **settings)
    got = ours.generate(ids, mask, max_new_tokens=N, eos_token_id=eos, **settings)
    expected = _until_eos(new, eos)
    assert got.tolist() == expected
    assert got.lengths.tolist() == [len(r) for r in expected]
    torch.testing.assert_close(got.scores, out.sequences_scores, rtol=1e-4, atol=1e-4)


def test_beam_search_hypotheses_end_on_eos(family):
    """The EOS chosen above does end hypotheses, so the parity checks cover finishing, not only the length limit."""
    hf, ours, ids, mask = family
    eos = _eos_for(ours, ids, mask)
    got = ours.generate(ids, mask, max_new_tokens=N, eos_token_id=eos, num_beams=4, num_return_sequences=4)
    assert any(row[-1] == eos and len(row) < N for row in got.tolist())


def test_one_beam_is_greedy(family):
    hf, ours, ids, mask = family
    greedy = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True)
    assert torch.equal(ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, strategy="beam").sequences,
                       greedy.sequences)
    # The beam-search loop itself, run with one beam, makes greedy's choices too.
    from lmforge.generation import search
    from lmforge.generation.config import GenerationConfig
    from lmforge.generation.generate import _Run

    cfg = GenerationConfig(max_new_tokens=N, num_beams=1, ignore_eos=True)
    with torch.inference_mode():
        run = _Run(ours, ids, mask, cfg, None)
        beam = search.beam_search(run.stepper, cfg, run.eos, run.pad_id)
    assert torch.equal(beam.sequences, greedy.sequences)


SAMPLE_SETTINGS = [
    dict(top_k=20, temperature=0.7),
    dict(top_k=0, top_p=0.8, min_p=0.1, temperature=1.3),
    dict(top_k=30, top_p=0.9, min_p=0.05, temperature=0.8, repetition_penalty=1.2, num_return_sequences=2),
]


@pytest.mark.parametrize("seed, settings", list(enumerate(SAMPLE_SETTINGS)),
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) if isinstance(s, dict) else str(s))
def test_seeded_sampling_matches_hf(family, seed, settings):
    hf, ours, ids, mask = family
    ours_settings = {k: v for k, v in settings.items() if k != "top_k"}
    if settings["top_k"]:  # HF's default is top_k=50; 0 switches it off
        ours_settings["top_k"] = settings["top_k"]
    torch.manual_seed(seed)  # HF draws from the global generator; ours from a private one, seeded alike
    expected = _hf_generate(hf, ids, mask, do_sample=True, eos_token_id=None, **settings)
    got = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, strategy="sample", seed=seed, **ours_settings)
    assert torch.equal(got.sequences, expected)


@pytest.mark.parametrize("penalty, ngram", [(1.4, 0), (0.7, 0), (1.0, 2), (1.3, 3)])
def test_penalties_match_hf_greedy(family, penalty, ngram):
    hf, ours, ids, mask = family
    expected = _hf_generate(hf, ids, mask, do_sample=False, eos_token_id=None, repetition_penalty=penalty,
                            no_repeat_ngram_size=ngram)
    got = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, repetition_penalty=penalty,
                        no_repeat_ngram_size=ngram)
    assert torch.equal(got.sequences, expected)
    plain = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True).sequences
    if penalty > 1 or ngram:
        assert not torch.equal(got.sequences, plain)  # the setting changed something


def test_penalties_match_hf_beam_search():
    hf, ours, ids, mask = _CACHE.get("gpt2") or _build("gpt2")
    new = _hf_generate(hf, ids, mask, do_sample=False, eos_token_id=None, num_beams=3, num_return_sequences=2,
                       repetition_penalty=1.3, no_repeat_ngram_size=2)
    got = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, num_beams=3, num_return_sequences=2,
                        repetition_penalty=1.3, no_repeat_ngram_size=2)
    assert torch.equal(got.sequences, new)


def test_left_padded_gpt2_batch_matches_hf():
    torch.manual_seed(1)
    hf = _perturbed(tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                     bos_token_id=None, eos_token_id=None)))
    ids = torch.randint(0, V, (3, 7))
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
    expected = _hf_generate(hf, ids, mask, do_sample=False, eos_token_id=None)
    got = lmforge.from_hf(hf).generate(ids, mask, max_new_tokens=N, ignore_eos=True)
    assert torch.equal(got.sequences, expected)
