"""Linear baselines on n-gram features: TF-IDF + logistic regression, and an n-gram SVM (scikit-learn).

"Often not much better than simple baselines": before pre-training, a linear model on bag-of-n-gram features
was the bar to clear on sentence classification (Wang & Manning 2012, "Baselines and Bigrams"). Both are
scikit-learn pipelines, fitted as they are:

    name          features                                              classifier
    tfidf-logreg  TF-IDF of word uni- and bigrams, sublinear tf         LogisticRegression (L2, C, lbfgs)
                  (1 + log tf) x idf, rows L2-normalised
    ngram-svm     binary presence of word uni- and bigrams              LinearSVC (L2, squared hinge, C)

    idf(t) = ln((1 + n) / (1 + df(t))) + 1      (scikit-learn's smoothed idf; n documents, df(t) containing t)

A fitted pipeline is stored as tensors (safetensors: idf, weights, bias, classes) plus its n-gram vocabulary
(JSON), never pickled; :func:`from_state` rebuilds the same pipeline, whose predictions equal the original's.

Example:
    >>> pipe = pipeline("tfidf-logreg").fit(["good film", "bad film", "good", "bad"], [1, 0, 1, 0])
    >>> pipe.predict(["a good one"]).tolist()
    [1]
    >>> tensors, vocabulary = to_state(pipe)
    >>> from_state("tfidf-logreg", tensors, vocabulary).predict(["a good one"]).tolist()
    [1]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

# scikit-learn (the finetune extra) is imported where a pipeline is built: it pulls in scipy and pandas, seconds
# that every command importing the baselines (``lmforge finetune --help`` too) would pay, and a user without the
# extra could not start those commands at all. The names are static for the same reason (``--baseline`` choices).
LINEAR = ("tfidf-logreg", "ngram-svm")


def _vectorizer(name: str, vocabulary=None):
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    if name == "tfidf-logreg":
        return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, vocabulary=vocabulary)
    return CountVectorizer(ngram_range=(1, 2), binary=True, vocabulary=vocabulary)


def _classifier(name: str, C: float, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    if name == "tfidf-logreg":
        return LogisticRegression(C=C, max_iter=1000)
    return LinearSVC(C=C, random_state=seed)


def pipeline(name: str, C: float = 1.0, seed: int = 0) -> Pipeline:
    """The unfitted scikit-learn pipeline of baseline ``name`` (``tfidf-logreg`` or ``ngram-svm``)."""
    if name not in LINEAR:
        raise ValueError(f"unknown linear baseline {name!r} (known: {', '.join(LINEAR)})")
    from sklearn.pipeline import Pipeline

    return Pipeline([("features", _vectorizer(name)), ("classifier", _classifier(name, C, seed))])


def to_state(pipe: Pipeline) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A fitted pipeline as (tensors, n-gram vocabulary in feature order)."""
    features, clf = pipe.named_steps["features"], pipe.named_steps["classifier"]
    tensors = {"coef": torch.from_numpy(np.ascontiguousarray(clf.coef_, dtype=np.float64)),
               "intercept": torch.from_numpy(np.ascontiguousarray(clf.intercept_, dtype=np.float64)),
               "classes": torch.from_numpy(np.asarray(clf.classes_, dtype=np.int64))}
    if hasattr(features, "idf_"):
        tensors["idf"] = torch.from_numpy(np.ascontiguousarray(features.idf_, dtype=np.float64))
    return tensors, features.get_feature_names_out().tolist()


def from_state(name: str, tensors: dict[str, torch.Tensor], vocabulary: list[str], C: float = 1.0) -> Pipeline:
    """The fitted pipeline that :func:`to_state` stored (the classes are label ids)."""
    pipe = pipeline(name, C)
    features = _vectorizer(name, vocabulary)
    if "idf" in tensors:
        features.idf_ = tensors["idf"].numpy()
    clf = pipe.named_steps["classifier"]
    clf.coef_, clf.intercept_ = tensors["coef"].numpy(), tensors["intercept"].numpy()
    clf.classes_ = tensors["classes"].numpy()
    pipe.steps[0] = ("features", features)
    return pipe
