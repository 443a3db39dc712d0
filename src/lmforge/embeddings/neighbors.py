"""Contextual nearest neighbours of a word, against a static (one-vector-per-type) baseline.

The ELMo paper's Table 4 (Peters et al. 2018): GloVe gives "play" one vector, whose neighbours mix the
senses (playing, game, Play, football...); a contextual model gives each *occurrence* its own vector, and the
nearest other occurrences share its sense ("a Broadway play" -> "a successful play").

    static      word2vec (gensim, skip-gram; Mikolov et al. 2013) trained on the same corpus, or, without
                gensim, PPMI + truncated SVD of the co-occurrence counts (Levy & Goldberg 2014)
    contextual  the encoder's word vectors (sub-words averaged) of every occurrence; cosine between occurrences

Example:
    >>> sents = [s.split() for s in ["the cat sat on the mat", "the dog sat on the log"] * 20]
    >>> [w for w, _ in static_neighbors(sents, "cat", k=1, method="ppmi", dim=4)]
    ['dog']
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmforge.errors import InputFileNotFound, UserInputError

_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def read_sentences(file: str | Path, max_sentences: int | None = None) -> list[list[str]]:
    """One sentence per non-empty line, split into words and punctuation."""
    file = Path(file)
    if not file.is_file():
        raise InputFileNotFound(f"{file}: not found")
    out = []
    with open(file, encoding="utf-8") as f:
        for line in f:
            words = _WORD.findall(line)
            if words:
                out.append(words)
                if max_sentences and len(out) >= max_sentences:
                    break
    return out


def ppmi_svd_vectors(sentences: Sequence[Sequence[str]], *, window: int = 2, dim: int = 50,
                     min_count: int = 1) -> tuple[list[str], np.ndarray]:
    """Static word vectors: positive PMI of (word, context word) counts within ``window``, reduced by SVD.

    Returns the vocabulary (lower-cased) and a (V, dim) matrix ``U * sqrt(S)`` (the symmetric split of Levy
    et al. 2015, which works better for similarity than ``U * S``).
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import svds

    counts = Counter(w.lower() for s in sentences for w in s)
    vocab = sorted(w for w, c in counts.items() if c >= min_count)
    where = {w: i for i, w in enumerate(vocab)}
    rows, cols = [], []
    for s in sentences:
        ids = [where.get(w.lower(), -1) for w in s]
        for i, a in enumerate(ids):
            if a < 0:
                continue
            for j in range(max(0, i - window), min(len(ids), i + window + 1)):
                if j != i and ids[j] >= 0:
                    rows.append(a)
                    cols.append(ids[j])
    V = len(vocab)
    co = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(V, V)).tocsr()
    co.sum_duplicates()
    total = co.sum()
    row_sum, col_sum = np.asarray(co.sum(1)).ravel(), np.asarray(co.sum(0)).ravel()
    co = co.tocoo()
    pmi = np.log(co.data * total / (row_sum[co.row] * col_sum[co.col]))
    keep = pmi > 0  # PPMI: negative PMI estimates are unreliable for rare pairs
    ppmi = coo_matrix((pmi[keep], (co.row[keep], co.col[keep])), shape=(V, V)).astype(np.float64)
    k = max(1, min(dim, V - 2))
    u, s, _ = svds(ppmi.tocsc(), k=k, random_state=0)
    return vocab, u * np.sqrt(s)


def static_neighbors(sentences: Sequence[Sequence[str]], word: str, *, k: int = 10, method: str = "auto",
                     dim: int = 100, seed: int = 0) -> list[tuple[str, float]]:
    """The ``k`` nearest word types of ``word`` (cosine) under a static embedding trained on ``sentences``.

    ``method``: ``"word2vec"`` (gensim), ``"ppmi"`` (PPMI + SVD) or ``"auto"`` (word2vec when gensim imports).
    """
    if method == "auto":
        try:
            import gensim  # noqa: F401
            method = "word2vec"
        except ImportError:
            method = "ppmi"
    lowered = [[w.lower() for w in s] for s in sentences]
    word = word.lower()
    if method == "word2vec":
        from gensim.models import Word2Vec

        # workers=1 + a seed: gensim is deterministic only single-threaded
        w2v = Word2Vec(lowered, vector_size=dim, window=5, min_count=1, sg=1, epochs=20, seed=seed, workers=1)
        if word not in w2v.wv:
            raise UserInputError(f"{word!r} does not occur in the corpus")
        return [(w, float(c)) for w, c in w2v.wv.most_similar(word, topn=k)]
    if method != "ppmi":
        raise ValueError(f"method={method!r}: use auto, word2vec or ppmi")
    vocab, vectors = ppmi_svd_vectors(lowered, dim=dim)
    if word not in vocab:
        raise UserInputError(f"{word!r} does not occur in the corpus")
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit[vocab.index(word)]
    order = [i for i in np.argsort(-cos, kind="stable") if vocab[i] != word][:k]
    return [(vocab[i], float(cos[i])) for i in order]


def occurrences(sentences: Sequence[Sequence[str]], word: str) -> list[tuple[int, int]]:
    """(sentence index, word position) of every case-insensitive occurrence of ``word``."""
    word = word.lower()
    return [(s, i) for s, words in enumerate(sentences) for i, w in enumerate(words) if w.lower() == word]


def contextual_neighbors(encoder, sentences: Sequence[Sequence[str]], word: str, *, k: int = 3, layer: int | str = -1,
                         queries: int = 3, max_occurrences: int = 500, batch_size: int = 32) -> list[dict[str, Any]]:
    """For the first ``queries`` occurrences of ``word``, the ``k`` nearest *other* occurrences in context.

    Returns ``[{"sentence": s, "position": i, "neighbors": [(s', i', cosine), ...]}, ...]``.
    """
    found = occurrences(sentences, word)[:max_occurrences]
    if len(found) < 2:
        raise UserInputError(f"{word!r} occurs {len(found)} time(s) in the corpus; neighbours need at least 2")
    used = sorted({s for s, _ in found})
    vectors = dict(zip(used, encoder.word_vectors([sentences[s] for s in used], layer=layer, batch_size=batch_size)))
    occ = np.stack([vectors[s][i] for s, i in found])  # (M, D)
    occ = occ / np.maximum(np.linalg.norm(occ, axis=1, keepdims=True), 1e-12)
    cos = occ @ occ.T
    np.fill_diagonal(cos, -np.inf)  # an occurrence is not its own neighbour
    out = []
    for q in range(min(queries, len(found))):
        best = np.argsort(-cos[q], kind="stable")[:k]
        out.append({"sentence": found[q][0], "position": found[q][1],
                    "neighbors": [(found[j][0], found[j][1], float(cos[q, j]))
                                  for j in best if np.isfinite(cos[q, j])]})
    return out


def highlight(words: Sequence[str], position: int, width: int = 12) -> str:
    """The sentence around ``position`` with the word in <angle brackets>."""
    lo, hi = max(0, position - width), position + width + 1
    text = words[lo:position] + [f"<{words[position]}>"] + list(words[position + 1:hi])
    return ("... " if lo else "") + " ".join(text) + (" ..." if hi < len(words) else "")
