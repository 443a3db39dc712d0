"""Logits processors against their definitions, written out the slow, obvious way."""

from __future__ import annotations

import pytest
import torch

from lmforge.generation import (
    GenerationConfig,
    LogitsPipeline,
    min_p_filter,
    no_repeat_ngram_mask,
    repetition_penalty,
    top_k_filter,
    top_p_filter,
)


def _kept(scores: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in scores]


@pytest.mark.parametrize("k", [1, 3, 10, 50])
def test_top_k_keeps_the_k_highest_and_ties(k):
    scores = torch.randn(6, 40)
    scores[0, :5] = 3.0  # a five-way tie at the top
    for row, kept in zip(scores.tolist(), _kept(top_k_filter(scores, k))):
        kth = sorted(row, reverse=True)[min(k, len(row)) - 1]
        assert kept == {i for i, s in enumerate(row) if s >= kth}


@pytest.mark.parametrize("p", [0.05, 0.3, 0.7, 0.95, 1.0])
def test_top_p_keeps_the_smallest_most_likely_set_reaching_p(p):
    scores = torch.randn(8, 30) * 2
    for row, kept in zip(scores, _kept(top_p_filter(scores, p))):
        probs = row.double().softmax(-1).tolist()
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        n = next(n for n in range(1, len(order) + 1) if sum(probs[i] for i in order[:n]) >= p - 1e-6)
        assert kept == set(order[:n])


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.2, 0.9, 1.0])
def test_min_p_keeps_tokens_above_the_scaled_top_probability(min_p):
    scores = torch.randn(8, 30) * 2
    for row, kept in zip(scores, _kept(min_p_filter(scores, min_p))):
        probs = row.double().softmax(-1)
        expected = {i for i, q in enumerate(probs.tolist()) if q >= min_p * probs.max().item() - 1e-9}
        assert kept == expected | {int(probs.argmax())}


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores_once():
    scores = torch.randn(3, 12)
    history = torch.randint(0, 12, (3, 9))
    valid = torch.rand(3, 9) > 0.3
    out = repetition_penalty(scores, history, valid, 1.7)
    for b in range(3):
        seen = {int(t) for t, v in zip(history[b], valid[b]) if v}
        for i in range(12):
            s = scores[b, i].item()
            want = (s / 1.7 if s > 0 else s * 1.7) if i in seen else s
            assert out[b, i].item() == pytest.approx(want)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_bans_exactly_the_tokens_that_repeat_an_ngram(n):
    gen = torch.Generator().manual_seed(n)
    history = torch.randint(0, 4, (16, 11), generator=gen)  # a small vocabulary makes repeats common
    valid = torch.ones_like(history, dtype=torch.bool)
    valid[::3, :4] = False  # left padding on some rows: never part of an n-gram
    banned = no_repeat_ngram_mask(history, valid, n, vocab_size=6)
    for b in range(16):
        real = [int(t) for t, v in zip(history[b], valid[b]) if v]
        grams = {tuple(real[i:i + n]) for i in range(len(real) - n + 1)}
        tail = tuple(real[len(real) - n + 1:]) if n > 1 else ()
        expected = {g[-1] for g in grams if g[:-1] == tail}
        assert set(torch.nonzero(banned[b]).flatten().tolist()) == expected
    assert banned.any()  # the check above is not vacuous


def test_pipeline_applies_only_what_is_configured_and_in_hf_order():
    scores = torch.randn(2, 20)
    history = torch.randint(0, 20, (2, 5))
    valid = torch.ones_like(history, dtype=torch.bool)
    assert not LogitsPipeline(GenerationConfig(), sampling=True)
    greedy = LogitsPipeline(GenerationConfig(temperature=0.5, top_k=3, repetition_penalty=1.3), sampling=False)
    assert torch.equal(greedy(scores, history, valid), repetition_penalty(scores, history, valid, 1.3))
    cfg = GenerationConfig(strategy="sample", temperature=0.5, top_k=5, top_p=0.8, min_p=0.1, repetition_penalty=1.3)
    expected = min_p_filter(top_p_filter(top_k_filter(repetition_penalty(scores, history, valid, 1.3) / 0.5, 5), 0.8), 0.1)
    assert torch.equal(LogitsPipeline(cfg, sampling=True)(scores, history, valid), expected)


def test_filters_that_keep_one_token_make_sampling_greedy():
    import lmforge

    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(0, 64, (2, 4))
    greedy = model.generate(prompt, max_new_tokens=8, ignore_eos=True).sequences
    for keep_one in (dict(top_k=1), dict(min_p=1.0), dict(top_p=1e-6)):
        for seed in range(3):
            sampled = model.generate(prompt, max_new_tokens=8, ignore_eos=True, strategy="sample", seed=seed, **keep_one)
            assert torch.equal(sampled.sequences, greedy), keep_one


def test_sampling_follows_the_filtered_distribution():
    """Frequencies of many draws match softmax(filtered / T): temperature and top-k by their definitions."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0]])
    pipeline = LogitsPipeline(GenerationConfig(strategy="sample", temperature=0.7, top_k=3), sampling=True)
    probs = pipeline(logits, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.bool)).softmax(-1)
    draws = torch.multinomial(probs.expand(20000, 5), 1, generator=torch.Generator().manual_seed(0)).flatten()
    freq = torch.bincount(draws, minlength=5).float() / 20000
    expected = torch.zeros(5)
    expected[:3] = (logits[0, :3] / 0.7).softmax(-1)
    assert torch.allclose(freq, expected, atol=0.015)
    assert freq[3:].sum() == 0


@pytest.mark.parametrize(
    "field, settings",
    [("top_p", dict(top_p=0.0)), ("top_p", dict(top_p=1.5)), ("temperature", dict(temperature=0.0)),
     ("min_p", dict(min_p=2.0)), ("max_new_tokens", dict(max_new_tokens=0)), ("num_beams", dict(num_beams=0)),
     ("strategy", dict(strategy="nucleus")), ("early_stopping", dict(early_stopping="sometimes")),
     ("num_beams", dict(strategy="sample", num_beams=2)), ("num_beams", dict(strategy="greedy", num_beams=3)), ("num_return_sequences", dict(num_return_sequences=2)),
     ("num_return_sequences", dict(num_beams=2, num_return_sequences=3)),
     ("repetition_penalty", dict(repetition_penalty=0.0)), ("stop_strings", dict(stop_strings=[""]))],
)
def test_bad_settings_name_the_field(field, settings):
    with pytest.raises(ValueError, match=f"GenerationConfig.{field}="):
        GenerationConfig(**settings)
