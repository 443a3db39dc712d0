"""Task metrics against the libraries that define them (and SQuAD's rule / perplexity's formula), on fixed inputs."""

from __future__ import annotations

import importlib

import math

import pytest

from lmforge.tasks import metrics

GOLD = ["a", "b", "c", "a", "b", "a", "c", "c", "b", "a"]
PRED = ["a", "b", "b", "a", "c", "a", "c", "a", "b", "b"]


def test_classification_matches_scikit_learn():
    sk = importlib.import_module("sklearn.metrics")
    got = metrics.classification(GOLD, PRED)
    assert got["accuracy"] == pytest.approx(sk.accuracy_score(GOLD, PRED)) == pytest.approx(0.6)
    assert got["f1_macro"] == pytest.approx(sk.f1_score(GOLD, PRED, average="macro"))
    assert got["f1_micro"] == pytest.approx(sk.f1_score(GOLD, PRED, average="micro"))
    assert got["mcc"] == pytest.approx(sk.matthews_corrcoef(GOLD, PRED))
    # By hand: "c" is predicted twice (once right) and is gold three times -> P = 1/2, R = 1/3, F1 = 0.4.
    assert sk.f1_score(GOLD, PRED, labels=["c"], average=None)[0] == pytest.approx(0.4)


def test_correlations_match_scipy_and_constant_input_is_nan():
    stats = importlib.import_module("scipy.stats")
    gold, pred = [0.0, 1.5, 2.0, 3.5, 4.0, 5.0], [0.5, 1.0, 2.5, 3.0, 4.5, 4.0]
    got = metrics.correlations(gold, pred)
    assert got["pearson"] == pytest.approx(stats.pearsonr(gold, pred)[0])
    assert got["spearman"] == pytest.approx(stats.spearmanr(gold, pred)[0])
    assert got["mse"] == pytest.approx(sum((g - p) ** 2 for g, p in zip(gold, pred)) / 6)
    assert math.isnan(metrics.correlations(gold, [1.0] * 6)["pearson"])


def test_multilabel_matches_scikit_learn_on_indicators():
    sk = importlib.import_module("sklearn.metrics")
    labels = ["x", "y", "z"]
    gold, pred = [["x"], ["x", "y"], [], ["z"]], [["x"], ["y"], ["z"], ["z"]]
    y = [[1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 1]]
    p = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]]
    got = metrics.multilabel(gold, pred, labels)
    assert got["f1_micro"] == pytest.approx(sk.f1_score(y, p, average="micro"))
    assert got["f1_macro"] == pytest.approx(sk.f1_score(y, p, average="macro", zero_division=0))
    assert got["subset_accuracy"] == pytest.approx(0.5)


def test_entity_f1_matches_seqeval_and_is_entity_level():
    seqeval = importlib.import_module("seqeval.metrics")
    gold = [["B-per", "I-per", "O", "B-loc"], ["O", "B-org", "I-org"]]
    pred = [["B-per", "O", "O", "B-loc"], ["O", "B-org", "I-org"]]
    got = metrics.entity_f1(gold, pred)
    assert got["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
    # Entity level: the cut person span is wrong as a whole -> 2 of 3 right each way.
    assert got["precision"] == pytest.approx(2 / 3) and got["recall"] == pytest.approx(2 / 3)
    assert got["accuracy"] == pytest.approx(6 / 7)


def test_bleu_chrf_rouge_match_the_libraries():
    sacrebleu = importlib.import_module("sacrebleu")
    rouge_scorer = importlib.import_module("rouge_score.rouge_scorer")
    hyps = ["the cat sat on the mat", "a quick brown fox jumps", "hello there"]
    refs = ["the cat sat on a mat", "the quick brown fox jumped", "hello world"]
    assert metrics.bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert metrics.chrf(hyps, refs) == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {k: sum(scorer.score(r, h)[k].fmeasure for h, r in zip(hyps, refs)) / 3
                for k in ("rouge1", "rouge2", "rougeL")}
    assert metrics.rouge(hyps, refs) == pytest.approx(expected)
    assert metrics.bleu(refs, refs) == pytest.approx(100.0)


def test_squad_exact_match_and_f1_follow_the_v1_1_rule():
    # Normalisation drops case, punctuation and articles; F1 is over the bag of remaining tokens.
    assert metrics.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert metrics.squad_em_f1("the Eiffel Tower", ["Eiffel tower", "Paris"]) == (1.0, 1.0)
    em, f1 = metrics.squad_em_f1("in Paris France", ["Paris"])
    assert em == 0.0 and f1 == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))  # P = 1/3, R = 1
    em, f1 = metrics.squad_em_f1("London", ["Paris", "the city of Paris"])
    assert (em, f1) == (0.0, 0.0)
    got = metrics.qa(["Paris", "in Paris France"], [["Paris"], ["Paris"]])
    assert got["exact_match"] == pytest.approx(0.5) and got["f1"] == pytest.approx((1 + 0.5) / 2)


def test_perplexity_and_best_checkpoint_direction():
    assert metrics.perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert metrics.perplexity(1000.0) == math.inf
    assert metrics.better("accuracy", 0.9, 0.8) and not metrics.better("accuracy", 0.8, 0.9)
    assert metrics.better("loss", 0.5, 0.6) and not metrics.better("sentiment/loss", 0.7, 0.6)
    assert metrics.better("f1", 0.1, None) and not metrics.better("f1", float("nan"), None)
