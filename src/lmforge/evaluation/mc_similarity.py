"""A TF-IDF similarity baseline for multiple choice: pick the choice whose words are most like the context's.

Each context and choice becomes a TF-IDF vector (word unigrams, sublinear tf, rows L2-normalised; the idf learned
from the training contexts and choices); the answer is the choice with the largest cosine similarity to its
context (ties: the first). Nothing else is learned, so it measures how far word overlap alone gets on a task.
Stored as the idf tensor plus the vocabulary, as :mod:`lmforge.evaluation.linear_baselines` stores its features.

Example:
    >>> v = fit(["the cat sat", "a dog ran", "the cat slept", "birds fly"])
    >>> similarities(v, ["the cat sat"], [["birds fly", "the cat slept"]]).argmax(1).tolist()
    [1]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def vectorizer(vocabulary=None):
    from sklearn.feature_extraction.text import TfidfVectorizer  # the finetune extra, imported where used

    return TfidfVectorizer(sublinear_tf=True, vocabulary=vocabulary)


def fit(texts: Sequence[str]):
    """A TF-IDF vectorizer fitted on ``texts`` (the training contexts and choices)."""
    return vectorizer().fit(texts)


def similarities(v, contexts: Sequence[str], choices: Sequence[Sequence[str]]) -> np.ndarray:
    """(N, C) cosine similarities of each context to each of its choices."""
    n, c = len(contexts), len(choices[0])
    x = v.transform(list(contexts))  # rows are L2-normalised, so a dot product is the cosine
    y = v.transform([a for row in choices for a in row])
    sims = np.zeros((n, c))
    for k in range(c):
        sims[:, k] = np.asarray(x.multiply(y[k::c]).sum(1)).ravel()
    return sims


def to_state(v) -> tuple[dict[str, torch.Tensor], list[str]]:
    return {"idf": torch.from_numpy(np.ascontiguousarray(v.idf_, dtype=np.float64))}, v.get_feature_names_out().tolist()


def from_state(tensors: dict[str, torch.Tensor], vocabulary: list[str]):
    v = vectorizer(vocabulary)
    v.idf_ = tensors["idf"].numpy()
    return v
