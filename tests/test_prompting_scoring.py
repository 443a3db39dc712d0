"""Verbalizer scoring against brute-force log-likelihoods, and KV-cache-shared scoring against uncached scoring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prompting_helpers import body, tokenizer
from lmforge.prompting import Template, Verbalizer, score_continuations, score_continuations_batch, score_seq2seq

VERB = Verbalizer({"positive": ["great", "superbly lovely"], "negative": ["bad", "terrible"], "neutral": "dull"})
TEMPLATE = Template("Review: {x} Overall, it was a {z} movie.")
TEXTS = ["the plot was really good", "a dull and awful film"]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt_tok")
    return {fam: tokenizer(root, fam) for fam in ("gpt", "t5", "bert")}


def brute_decoder(model, tok, prompt, answer) -> float:
    """One full forward of prompt + answer; sum of the answer tokens' log-probabilities."""
    ctx, ans = tok.encode(prompt.prefix), tok.encode(prompt.space + answer, add_special_tokens=False)
    logp = F.log_softmax(model(torch.tensor([ctx + ans])).logits[0].double(), -1)  # (T, V)
    return sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(ans))


def brute_seq2seq(model, tok, prompt, answer) -> float:
    src, ans = tok.encode(prompt.prefix), tok.encode(prompt.space + answer, add_special_tokens=False)
    dec = [model._decoder_start_id()] + ans[:-1]
    logp = F.log_softmax(model(torch.tensor([src]), decoder_input_ids=torch.tensor([dec])).logits[0].double(), -1)
    return sum(logp[j, t].item() for j, t in enumerate(ans))


def brute_cloze(model, tok, prompt, answer) -> float:
    ans = tok.encode(prompt.space + answer, add_special_tokens=False)
    ids = tok.encode(prompt.prefix + prompt.space + " ".join(["[MASK]"] * len(ans)) + prompt.suffix)
    masks = [i for i, t in enumerate(ids) if t == tok.token_to_id("[MASK]")]
    logp = F.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return sum(logp[p, t].item() for p, t in zip(masks, ans))


CASES = [("gpt", "gpt-tiny", brute_decoder), ("gpt", "llama-tiny", brute_decoder), ("t5", "t5-tiny", brute_seq2seq),
         ("bert", "bert-tiny", brute_cloze)]


@pytest.mark.parametrize("family,preset,brute", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_verbalizer_scores_equal_brute_force_likelihood(toks, family, preset, brute, reduction):
    tok = toks[family]
    model = body(preset, tok)
    prompts = [TEMPLATE.split(t) for t in TEXTS]
    got = VERB.score(model, tok, prompts, reduction=reduction)  # (N, C)
    assert got.shape == (2, 3)
    for n, prompt in enumerate(prompts):
        for c, answers in enumerate(VERB.mapping.values()):
            per_answer = []
            for a in answers:
                length = len(tok.encode(prompt.space + a, add_special_tokens=False))
                per_answer.append(brute(model, tok, prompt, a) / (length if reduction == "mean" else 1))
            expected = torch.logsumexp(torch.tensor(per_answer, dtype=torch.float64), 0).item()
            assert got[n, c].item() == pytest.approx(expected, abs=1e-4)
    # the scores discriminate: a jittered random model does not give every label the same score
    assert got.std() > 1e-2


def test_multi_token_answers_are_really_multi_token(toks):
    for fam in ("gpt", "t5", "bert"):
        assert len(toks[fam].encode(" superbly lovely", add_special_tokens=False)) >= 2


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_shared_kv_cache_scoring_equals_uncached(toks, preset):
    tok = toks["gpt"]
    model = body(preset, tok, seed=1)
    ctx = tok.encode("review : the film was very good and it was")
    answers = [[5], [7, 9, 11], [12, 3], [40, 41, 42, 43, 44]]  # different lengths: right padding is exercised
    cached = score_continuations(model, ctx, answers, use_cache=True)
    full = score_continuations(model, ctx, answers, use_cache=False)
    assert [len(c) for c in cached] == [1, 3, 2, 5]
    for c, f in zip(cached, full):
        torch.testing.assert_close(c, f, atol=1e-5, rtol=1e-5)


def test_shared_encoder_scoring_equals_per_row_encoding(toks):
    tok = toks["t5"]
    model = body("t5-tiny", tok, seed=2)
    src = tok.encode("the plot was really good")
    answers = [[5], [7, 9, 11], [12, 3]]
    for a, b in zip(score_seq2seq(model, src, answers, share_encoder=True),
                    score_seq2seq(model, src, answers, share_encoder=False)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_long_decoder_context_is_cut_from_the_left(toks):
    tok = toks["gpt"]
    model = body("gpt-tiny", tok, max_seq_len=16)
    ctx = list(range(5, 45))  # 40 tokens > 16 positions
    got = score_continuations(model, ctx, [[7, 8, 9]])[0]
    ref = score_continuations(model, ctx[-14:], [[7, 8, 9]], use_cache=False)[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_verbalizer_validation(tmp_path):
    with pytest.raises(ValueError, match="non-empty"):
        Verbalizer({"a": []})
    f = tmp_path / "v.json"
    f.write_text('{"1": ["good"], "0": "bad"}', encoding="utf-8")
    v = Verbalizer.from_json(f)
    assert v.labels == ["1", "0"] and v.answer("0") == "bad"
    assert Verbalizer.from_json('{"x": "y"}').labels == ["x"]


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_batched_contexts_equal_one_context_at_a_time(toks, preset):
    tok = toks["gpt"]
    model = body(preset, tok, seed=3)
    contexts = [tok.encode(t) for t in ("a", "the film was very good and it was", "review : dull plot")]
    answers = [[5], [7, 9, 11], [12, 3]]
    batched = score_continuations_batch(model, contexts, answers)
    for ctx, row in zip(contexts, batched):
        for got, ref in zip(row, score_continuations(model, ctx, answers, use_cache=False)):
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_verbalizer_batch_size_does_not_change_scores(toks):
    tok = toks["gpt"]
    model = body("gpt-tiny", tok, seed=4)
    prompts = [TEMPLATE.split(t) for t in TEXTS + ["a", "the movie was really lovely and very superb"]]
    one = VERB.score(model, tok, prompts, batch_size=1)
    torch.testing.assert_close(VERB.score(model, tok, prompts, batch_size=3), one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(VERB.score(model, tok, prompts, use_cache=False), one, atol=1e-5, rtol=1e-5)
