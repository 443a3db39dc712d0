"""Templates, demonstration selection (random / balanced / knn), prompt building, calibration and chain-of-thought."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from prompting_helpers import body, sentiment_rows, tokenizer
from lmforge.prompting import (
    ChainOfThought, FewShot, Template, Verbalizer, calibrate, classify, content_free_prediction, embed_texts,
    select_balanced, select_knn,
)

VERB = Verbalizer({"1": ["great"], "0": ["bad"]})
TEMPLATE = Template("{x} It was {z}.")


def test_template_fills_single_and_pair_slots():
    t = Template("Premise: {x} Hypothesis: {x2} Answer: {z}")
    assert t.slots == ["x", "x2"]
    assert t.fill("A.", "B.", z="yes") == "Premise: A. Hypothesis: B. Answer: yes"
    assert t.split("A.", x2="B.") == ("Premise: A. Hypothesis: B. Answer:", " ", "")
    cloze = Template("Review: {x} Overall, it was a {z} movie.").split("Fun.")
    assert cloze.with_answer("great") == "Review: Fun. Overall, it was a great movie."
    assert Template("{x} =>").split("hi") == ("hi =>", " ", "")  # no {z}: the answer follows
    with pytest.raises(ValueError, match="no input slot"):
        Template("It was {z}.")
    with pytest.raises(ValueError, match="missing"):
        t.split("only one")


def test_prompts_are_deterministic_per_seed_and_query():
    pool, queries = sentiment_rows(40, seed=1), sentiment_rows(6, seed=2)
    fs = FewShot(TEMPLATE, VERB, k=4, selection="random", seed=3)
    a, b = fs.prompts(pool, queries), FewShot(TEMPLATE, VERB, k=4, selection="random", seed=3).prompts(pool, queries)
    assert a == b
    assert FewShot(TEMPLATE, VERB, k=4, seed=4).prompts(pool, queries) != a
    # the prompt of query i depends on (seed, i) only, not on the other queries
    assert fs.prompts(pool, queries[:3]) == a[:3]
    chosen = fs.select(pool, queries)
    assert all(len(set(c)) == 4 for c in chosen) and len({tuple(c) for c in chosen}) > 1
    first = a[0].prefix.split("\n\n")
    assert len(first) == 5 and first[-1] == queries[0]["text"] + " It was"
    assert first[0] == f"{pool[chosen[0][0]]['text']} It was {VERB.answer(pool[chosen[0][0]]['label'])}."


def test_separator_and_order_are_configurable():
    pool, q = sentiment_rows(20), sentiment_rows(1, seed=5)
    given = FewShot(TEMPLATE, VERB, k=3, separator=" ||| ", seed=0)
    shuffled = FewShot(TEMPLATE, VERB, k=3, separator=" ||| ", seed=0, order="random")
    assert given.prompts(pool, q)[0].prefix.count(" ||| ") == 3
    assert sorted(given.select(pool, q)[0]) == sorted(shuffled.select(pool, q)[0])
    with pytest.raises(ValueError, match="knn"):
        FewShot(TEMPLATE, VERB, order="nearest-last")


@pytest.mark.parametrize("k", [2, 4, 5, 7])
def test_balanced_selection_is_balanced(k):
    labels = ["a"] * 30 + ["b"] * 5 + ["c"] * 12
    for seed in range(20):
        chosen = select_balanced(labels, k, random.Random(seed))
        counts = Counter(labels[i] for i in chosen)
        assert len(set(chosen)) == k
        assert max(counts.get(c, 0) for c in "abc") - min(counts.get(c, 0) for c in "abc") <= 1
    with pytest.raises(ValueError, match="too few"):
        select_balanced(["a"] * 10 + ["b"], 4, random.Random(0))


def test_knn_picks_the_nearest():
    pool = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0], [0.9, 0.1]])
    assert select_knn(torch.tensor([1.0, 0.09]), pool, 3) == [4, 0, 2]
    assert select_knn(torch.tensor([-0.1, 1.0]), pool, 1) == [1]


def test_knn_few_shot_uses_the_models_embeddings(tmp_path):
    tok = tokenizer(tmp_path, "gpt")
    model = body("gpt-tiny", tok)
    pool, queries = sentiment_rows(12), sentiment_rows(3, seed=9)
    fs = FewShot(TEMPLATE, VERB, k=3, selection="knn")
    chosen = fs.select(pool, queries, model, tok)
    emb_pool = embed_texts(model, tok, [r["text"] for r in pool])
    emb_q = embed_texts(model, tok, [r["text"] for r in queries])
    for i, c in enumerate(chosen):
        sims = torch.nn.functional.cosine_similarity(emb_pool, emb_q[i][None], dim=-1)
        assert c[-1] == int(sims.argmax())  # nearest-last: the most similar demonstration sits next to the query
        assert set(c) == set(sims.topk(3).indices.tolist())
    # mean pooling ignores padding: a text embeds the same alone and in a padded batch
    torch.testing.assert_close(embed_texts(model, tok, [pool[0]["text"]])[0], emb_pool[0], atol=1e-5, rtol=1e-5)


def test_contextual_calibration_matches_the_formula():
    torch.manual_seed(0)
    p = torch.rand(5, 3).softmax(-1)
    cf_scores = torch.randn(3, 3)
    p_cf = content_free_prediction(cf_scores)
    torch.testing.assert_close(p_cf, cf_scores.softmax(-1).mean(0))
    W = torch.diag(1 / p_cf)
    expected = (p @ W.T) / (p @ W.T).sum(-1, keepdim=True)
    torch.testing.assert_close(calibrate(p, p_cf), expected)
    torch.testing.assert_close(calibrate(p_cf[None], p_cf)[0], torch.full((3,), 1 / 3))  # content-free -> uniform


def test_classify_calibrates_with_the_content_free_prediction_of_the_same_prompt(tmp_path):
    tok = tokenizer(tmp_path, "gpt")
    model = body("gpt-tiny", tok)
    rows, pool = sentiment_rows(4, seed=7), sentiment_rows(10)
    raw = classify(model, tok, TEMPLATE, VERB, rows, pool=pool, shots=2, selection="balanced")
    cal = classify(model, tok, TEMPLATE, VERB, rows, pool=pool, shots=2, selection="balanced", calibrate=True)
    assert raw.demonstrations == cal.demonstrations
    fs = FewShot(TEMPLATE, VERB, k=2, selection="balanced")
    for i, idx in enumerate(raw.demonstrations):
        ctx = fs.context(pool, idx)
        free = VERB.score(model, tok, [fs.prompt(ctx, (t,)) for t in ("N/A", "", "[MASK]")])
        expected = calibrate(raw.probs[i][None], free.softmax(-1).mean(0))[0]
        torch.testing.assert_close(cal.probs[i], expected)
    assert cal.predictions == [VERB.labels[j] for j in cal.probs.argmax(-1).tolist()]


def test_chain_of_thought_formats_rationales_and_extracts_answers():
    cot = ChainOfThought()
    demos = [(("Is 7 odd?",), "7 = 2 * 3 + 1.", "yes"), (("Is 4 odd?",), "4 = 2 * 2.", "no")]
    prompt = cot.prompt(demos, "Is 9 odd?")
    assert prompt == ("Q: Is 7 odd?\nA: 7 = 2 * 3 + 1. The answer is yes.\n\n"
                      "Q: Is 4 odd?\nA: 4 = 2 * 2. The answer is no.\n\nQ: Is 9 odd?\nA:")
    assert cot.extract(" 9 = 2 * 4 + 1. The answer is yes.\n\nQ: next") == "yes"
    assert cot.extract(" the answer is 3.5") == "3.5"
    assert cot.extract(" I am not sure") is None
    custom = ChainOfThought(answer=" {rationale} So: {z}", pattern=r"So: (\w+)")
    assert custom.extract(custom.demonstration(("q",), "r.", "B")) == "B"


def test_chain_of_thought_predict_extracts_from_the_greedy_continuation(tmp_path):
    from lmforge.generation import generate_text

    tok = tokenizer(tmp_path, "gpt")
    model = body("gpt-tiny", tok)
    cot = ChainOfThought(pattern=r"(\w+)")  # a random model never writes "The answer is": take its first word
    demos = [(("the film",), "it was good.", "good")]
    queries = [("the plot",), ("a movie",)]
    got = cot.predict(model, tok, demos, queries, max_new_tokens=6)
    outputs = generate_text(model, tok, [cot.prompt(demos, *q) for q in queries], max_new_tokens=6,
                            stop_strings=["\n\n"])
    assert got == [cot.extract(o) for o in outputs] and len(got) == 2
