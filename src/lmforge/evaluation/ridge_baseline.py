"""Ridge regression on TF-IDF features: the linear baseline of ``--task regress`` (scikit-learn).

The features are ``tfidf-logreg``'s (word uni- and bigrams, sublinear tf, rows L2-normalised; see
:mod:`lmforge.evaluation.linear_baselines`), and the model is ``sklearn.linear_model.Ridge`` with penalty
``alpha`` (least squares plus ``alpha * ||w||^2``, the intercept unpenalised). Stored as tensors (idf, weights,
intercept) plus the n-gram vocabulary, never pickled; :func:`from_state` rebuilds a pipeline that predicts the same.

Example:
    >>> pipe = pipeline(alpha=0.1).fit(["good film", "bad film", "good", "bad"], [1.0, 0.0, 1.0, 0.0])
    >>> bool(pipe.predict(["good"])[0] > pipe.predict(["bad"])[0])
    True
    >>> tensors, vocabulary = to_state(pipe)
    >>> from_state(tensors, vocabulary).predict(["good"]).round(6).tolist() == pipe.predict(["good"]).round(6).tolist()
    True
"""

from __future__ import annotations

import numpy as np
import torch

from lmforge.evaluation.linear_baselines import _vectorizer


def pipeline(alpha: float = 1.0):
    """The unfitted pipeline: TF-IDF -> Ridge(alpha)."""
    from sklearn.linear_model import Ridge  # the finetune extra, imported where it is used (--help stays light)
    from sklearn.pipeline import Pipeline

    return Pipeline([("features", _vectorizer("tfidf-logreg")), ("regressor", Ridge(alpha=alpha))])


def to_state(pipe) -> tuple[dict[str, torch.Tensor], list[str]]:
    features, reg = pipe.named_steps["features"], pipe.named_steps["regressor"]
    return ({"coef": torch.from_numpy(np.ascontiguousarray(reg.coef_, dtype=np.float64)),
             "intercept": torch.tensor([float(reg.intercept_)], dtype=torch.float64),
             "idf": torch.from_numpy(np.ascontiguousarray(features.idf_, dtype=np.float64))},
            features.get_feature_names_out().tolist())


def from_state(tensors: dict[str, torch.Tensor], vocabulary: list[str], alpha: float = 1.0):
    pipe = pipeline(alpha)
    features = _vectorizer("tfidf-logreg", vocabulary)
    features.idf_ = tensors["idf"].numpy()
    reg = pipe.named_steps["regressor"]
    reg.coef_, reg.intercept_ = tensors["coef"].numpy(), float(tensors["intercept"][0])
    reg.n_features_in_ = len(vocabulary)
    pipe.steps[0] = ("features", features)
    return pipe
