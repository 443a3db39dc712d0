"""Task metrics, computed by the libraries that define them.

    metric                      function           computed by
    accuracy                    accuracy           scikit-learn ``accuracy_score``
    F1 (macro / micro)          f1                 scikit-learn ``f1_score``
    Matthews correlation        mcc                scikit-learn ``matthews_corrcoef``
    Pearson / Spearman          correlations       scipy ``pearsonr`` / ``spearmanr``
    multi-label F1, subset acc  multilabel         scikit-learn on the (N, C) indicator matrix
    entity-level P/R/F1         entity_f1          seqeval (CoNLL-style span matching, BIO/IOB2)
    exact match / F1 (QA)       squad_em_f1        the SQuAD v1.1 rule (normalise, bag-of-tokens F1), here
    SQuAD 2.0 (HasAns/NoAns)    squad_v2           the official v2.0 evaluation's rules and threshold search, here
    BLEU, chrF                  bleu, chrf         sacrebleu (13a tokenisation, corpus level)
    ROUGE-1/2/L                 rouge              rouge-score (F-measure, Porter stemming), mean over items
    perplexity                  perplexity         exp(mean token cross-entropy)

The libraries are imported when a metric is first used, so ``import lmforge`` stays light; a missing one
raises an ImportError that names the pip package. BLEU and ROUGE are on sacrebleu's and rouge-score's
0-100 and 0-1 scales respectively; everything else is in [0, 1] (correlations in [-1, 1]).

Example:
    >>> accuracy(["a", "b", "a"], ["a", "b", "b"])
    0.6666666666666666
    >>> round(f1([0, 1, 1, 0], [0, 1, 0, 0], average="macro"), 4)
    0.7333
    >>> squad_em_f1("the Eiffel Tower", ["Eiffel tower", "Paris"])
    (1.0, 1.0)
"""

from __future__ import annotations

import collections
import importlib
import math
import re
import string
from typing import Any, Sequence

_PIP_NAMES = {"sklearn": "scikit-learn", "scipy": "scipy", "seqeval": "seqeval", "sacrebleu": "sacrebleu",
              "rouge_score": "rouge-score"}


def _library(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise ImportError(f"this metric needs the '{_PIP_NAMES.get(top, top)}' package: "
                          f"pip install {_PIP_NAMES.get(top, top)}") from exc


# ------------------------------------------------------------------------------------------- classes
def accuracy(gold: Sequence, pred: Sequence) -> float:
    """Share of items with ``pred == gold``."""
    return float(_library("sklearn.metrics").accuracy_score(list(gold), list(pred)))


def f1(gold: Sequence, pred: Sequence, average: str = "macro", labels: Sequence | None = None) -> float:
    """F1 over classes: ``"macro"`` (unweighted mean of per-class F1), ``"micro"`` or ``"binary"``.

    ``labels`` fixes the classes averaged over (default: those present in gold or pred).
    """
    metrics = _library("sklearn.metrics")
    return float(metrics.f1_score(list(gold), list(pred), average=average, labels=labels, zero_division=0))


def mcc(gold: Sequence, pred: Sequence) -> float:
    """Matthews correlation coefficient (CoLA's metric): 0 for chance, 1 for perfect, -1 for inverted."""
    return float(_library("sklearn.metrics").matthews_corrcoef(list(gold), list(pred)))


def classification(gold: Sequence, pred: Sequence, labels: Sequence | None = None) -> dict[str, float]:
    """``{"accuracy", "f1_macro", "f1_micro", "mcc"}`` for single-label predictions."""
    return {"accuracy": accuracy(gold, pred), "f1_macro": f1(gold, pred, "macro", labels),
            "f1_micro": f1(gold, pred, "micro", labels), "mcc": mcc(gold, pred)}


def correlations(gold: Sequence[float], pred: Sequence[float]) -> dict[str, float]:
    """``{"pearson", "spearman", "mse"}`` (STS-B reports the two correlations). NaN when a side is constant."""
    stats = _library("scipy.stats")
    gold, pred = [float(g) for g in gold], [float(p) for p in pred]
    mse = sum((g - p) ** 2 for g, p in zip(gold, pred)) / max(len(gold), 1)
    if len(gold) < 2 or len(set(gold)) < 2 or len(set(pred)) < 2:
        return {"pearson": math.nan, "spearman": math.nan, "mse": mse}
    return {"pearson": float(stats.pearsonr(gold, pred)[0]), "spearman": float(stats.spearmanr(gold, pred)[0]),
            "mse": mse}


def multilabel(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], labels: Sequence[str]) -> dict[str, float]:
    """Multi-label scores from label sets: ``{"f1_micro", "f1_macro", "subset_accuracy"}``.

    Subset accuracy counts an item as right only when its whole label set is right.
    """
    metrics = _library("sklearn.metrics")
    index = {label: i for i, label in enumerate(labels)}

    def indicator(sets):
        return [[int(label in set(s)) for label in index] for s in sets]

    y, p = indicator(gold), indicator(pred)
    return {"f1_micro": float(metrics.f1_score(y, p, average="micro", zero_division=0)),
            "f1_macro": float(metrics.f1_score(y, p, average="macro", zero_division=0)),
            "subset_accuracy": float(metrics.accuracy_score(y, p))}


# ------------------------------------------------------------------------------------------- tagging
def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level ``{"precision", "recall", "f1"}`` (an entity counts when its type and span match
    exactly) plus token ``"accuracy"``; tags are BIO/IOB2 strings, one list per sentence."""
    seqeval = _library("seqeval.metrics")
    gold, pred = [list(s) for s in gold], [list(s) for s in pred]
    return {"precision": float(seqeval.precision_score(gold, pred, zero_division=0)),
            "recall": float(seqeval.recall_score(gold, pred, zero_division=0)),
            "f1": float(seqeval.f1_score(gold, pred, zero_division=0)),
            "accuracy": float(seqeval.accuracy_score(gold, pred))}


# ------------------------------------------------------------------------------------------- QA
def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, drop punctuation and the articles a/an/the, squash spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(gold: str, pred: str) -> float:
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    common = sum((collections.Counter(g) & collections.Counter(p)).values())
    if not g or not p:
        return float(g == p)  # both empty: 1; one empty: 0
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_em_f1(pred: str, golds: Sequence[str]) -> tuple[float, float]:
    """(exact match, token F1) of one predicted answer, each the max over the gold answers (SQuAD v1.1)."""
    golds = list(golds) or [""]
    em = max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
    return em, max(_token_f1(g, pred) for g in golds)


def qa(preds: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"exact_match", "f1"}``: means over questions of :func:`squad_em_f1`, in [0, 1]."""
    scores = [squad_em_f1(p, g) for p, g in zip(preds, golds)]
    n = max(len(scores), 1)
    return {"exact_match": sum(s[0] for s in scores) / n, "f1": sum(s[1] for s in scores) / n}


def squad_v2(spans: Sequence[str], golds: Sequence[Sequence[str]], null_diffs: Sequence[float],
             threshold: float = 0.0) -> dict[str, float]:
    """SQuAD 2.0 scores, by the official ``evaluate-v2.0.py``'s definitions, on the [0, 1] scale.

    Args:
        spans: each question's best non-null answer text.
        golds: each question's gold texts; golds that normalise to nothing are dropped, and a question left
            with none is unanswerable (its only gold is the empty answer).
        null_diffs: ``s_null - s_best`` per question (the null span's score minus the best span's): the
            "no-answer probability" of the official script, in score units.
        threshold: answer "no answer" where ``null_diff > threshold`` (BERT's tau, Devlin et al. 2019, 4.3).

    Returns:
        ``exact_match``/``f1`` (all questions, at ``threshold``), ``HasAns_*`` and ``NoAns_*`` (the two
        subsets; absent when a subset is empty), and ``best_exact``/``best_f1`` with ``best_exact_thresh``/
        ``best_f1_thresh``: the official search, which answers the questions in order of increasing
        ``null_diff`` and keeps the cut that scores best. Its "all unanswered" start point is a threshold
        below every ``null_diff`` (the official script's 0.0 is that point for probabilities).

    Example:
        >>> m = squad_v2(["Paris", "Rome"], [["Paris"], []], [-2.0, 1.0])
        >>> m["exact_match"], m["HasAns_exact"], m["NoAns_exact"], m["best_f1_thresh"]
        (1.0, 1.0, 1.0, -2.0)
    """
    golds = [[g for g in gs if normalize_answer(g)] or [""] for gs in golds]
    has_answer = [gs != [""] for gs in golds]
    raw = [squad_em_f1(p, gs) for p, gs in zip(spans, golds)]  # scores of the non-null answers
    out: dict[str, float] = {}
    n = max(len(raw), 1)
    for k, name in enumerate(("exact", "f1")):
        scored = [float(not has) if diff > threshold else r[k]
                  for r, has, diff in zip(raw, has_answer, null_diffs)]
        out["exact_match" if name == "exact" else "f1"] = sum(scored) / n
        for subset, want in (("HasAns", True), ("NoAns", False)):
            part = [x for x, has in zip(scored, has_answer) if has == want]
            if part:
                out[f"{subset}_{name}"] = sum(part) / len(part)
                out[f"{subset}_total"] = float(len(part))
        # The official find_best_thresh: start with every question unanswered, then answer them by rising diff.
        current = best = float(sum(not h for h in has_answer))
        best_thresh = min(null_diffs, default=0.0) - 1.0
        for i in sorted(range(len(raw)), key=lambda i: null_diffs[i]):
            current += raw[i][k] if has_answer[i] else (-1.0 if spans[i] else 0.0)
            if current > best:
                best, best_thresh = current, float(null_diffs[i])
        out[f"best_{name}"], out[f"best_{name}_thresh"] = best / n, best_thresh
    return out


# ------------------------------------------------------------------------------------------- generation
def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, exponential smoothing off), 0-100."""
    return float(_library("sacrebleu").corpus_bleu(list(hypotheses), [list(references)]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (sacrebleu), 0-100: character n-grams, kinder than BLEU to short or morphologically rich output."""
    return float(_library("sacrebleu").corpus_chrf(list(hypotheses), [list(references)]).score)


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """``{"rouge1", "rouge2", "rougeL"}``: mean F-measure over items (rouge-score, Porter stemming), 0-1."""
    scorer = _library("rouge_score.rouge_scorer").RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for hyp, ref in zip(hypotheses, references):
        for key, score in scorer.score(ref, hyp).items():
            totals[key] += score.fmeasure
    n = max(len(hypotheses), 1)
    return {k: v / n for k, v in totals.items()}


def generation(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """BLEU, chrF and ROUGE-1/2/L of generated texts against one reference each."""
    return {"bleu": bleu(hypotheses, references), "chrf": chrf(hypotheses, references),
            **rouge(hypotheses, references)}


def perplexity(mean_loss: float) -> float:
    """exp of a mean token cross-entropy (nats); inf when it would overflow."""
    return math.exp(mean_loss) if mean_loss < 700 else math.inf


# ------------------------------------------------------------------------------------------- selection
# Metrics where smaller is better; every other metric is maximised when choosing the best checkpoint.
LOWER_IS_BETTER = frozenset({"loss", "perplexity", "mse"})


def better(metric: str, new: Any, old: Any) -> bool:
    """Whether ``new`` improves on ``old`` for ``metric`` (``old=None``: anything finite does)."""
    if not isinstance(new, (int, float)) or math.isnan(new):
        return False
    if old is None:
        return True
    name = metric.rsplit("/", 1)[-1]
    return new < old if name in LOWER_IS_BETTER else new > old
