"""Averaged static embeddings: the non-contextual sentence-embedding baseline ("Avg. GloVe" in SBERT's tables).

One vector per word *type*, whatever the context (word2vec, GloVe; Mikolov et al. 2013), averaged over a text:

    text --units (words, or a tokenizer's sub-words)--> ids --rows of a (V, D) table--> mean over known units
         --> (D,) --normalize--> unit vector          (a text with no known unit gets the zero vector)

Two sources of tables:

* :meth:`AveragedEmbeddings.from_model`: a model's input token-embedding matrix (e.g. MiniLM's word-piece
  table): no positions, no layers, no context; the same lookup the model's layer 0 starts from.
* :meth:`AveragedEmbeddings.from_word2vec`: word vectors trained with gensim on a corpus (``pip install
  gensim``; in the ``test`` extras).

:meth:`AveragedEmbeddings.encode` takes the arguments of :meth:`SentenceEncoder.encode`, so
:func:`lmforge.embeddings.sbert.evaluate_sts` and ``evaluate_retrieval`` score it unchanged, and
:meth:`AveragedEmbeddings.word_vectors_all_layers` gives every word of pre-split sentences its own vector as a
single "layer" 0, so :func:`lmforge.embeddings.probe.probe_layers` probes static vectors
with the same head as a contextual encoder's layers.

Example:
    >>> table = np.array([[0., 0.], [1., 0.], [0., 1.]])              # (V=3, D=2)
    >>> avg = AveragedEmbeddings(table, lambda text: [int(c) for c in text.split()])
    >>> avg.encode(["1 2", "1 1"], normalize=False).tolist()
    [[0.5, 0.5], [1.0, 0.0]]
    >>> [v.tolist() for v in avg.word_vectors_all_layers([["1", "2"], ["7"]])]  # "7": outside the table -> zeros
    [[[[1.0, 0.0], [0.0, 1.0]]], [[[0.0, 0.0]]]]
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")  # words (with inner apostrophes) and single punctuation marks


def words(text: str, lowercase: bool = True) -> list[str]:
    """Split into words and punctuation, as the word-vector trainer does."""
    return WORD.findall(text.lower() if lowercase else text)


class AveragedEmbeddings:
    """Mean of the table rows of a text's units.

    Args:
        table: (V, D) float array, one row per unit id.
        to_ids: text -> unit ids; ids outside ``[0, V)`` or None are skipped (unknown words).
    """

    def __init__(self, table: np.ndarray, to_ids: Callable[[str], Sequence[int | None]]):
        self.table = np.asarray(table, dtype=np.float32)
        self.to_ids = to_ids
        self.pooling = "mean"  # the only one there is; kept for the SentenceEncoder-like interface

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def encode(self, texts: Sequence[str], *, pooling: str | None = None, layer=None, normalize: bool = True,
               batch_size: int | None = None, progress: bool = False, **_) -> np.ndarray:
        """(len(texts), D) float32 averages. ``pooling``/``layer``/``batch_size`` are accepted for interface
        compatibility with :meth:`SentenceEncoder.encode` and must be left at mean/any."""
        if pooling not in (None, "mean"):
            raise ValueError(f"pooling={pooling!r}: averaged embeddings only pool by mean")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        V = len(self.table)
        for i, text in enumerate(texts):
            ids = [j for j in self.to_ids(text) if j is not None and 0 <= j < V]
            if ids:
                out[i] = self.table[ids].mean(0)
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def word_vectors_all_layers(self, sentences: Sequence[Sequence[str]], *, layers: Sequence[int] | None = None,
                                batch_size: int | None = None, **_) -> list[np.ndarray]:
        """Per sentence a (1, n_words, D) float32 array: each word's own vector, the one "layer" a static table has.

        The interface of :meth:`SentenceEncoder.word_vectors_all_layers` (what a probe sweeps over). A word the
        unit splitter cuts into several known units (``"#nlp"`` -> ``#``, ``nlp``) gets their mean; a word with
        no known unit gets the zero vector, so every word keeps its place next to its tag.
        """
        if layers is not None and list(layers) != [0]:
            raise ValueError(f"layers={list(layers)!r}: static vectors have a single layer, 0")
        # One word at a time through encode: (n_words, D) unnormalised means of the word's units.
        return [self.encode(list(words), normalize=False)[None] for words in sentences]

    @classmethod
    def from_model(cls, model, tokenizer, *, skip_special: bool = True) -> "AveragedEmbeddings":
        """The model's input token-embedding table (``model.embed_tokens``), indexed by ``tokenizer``'s ids.

        Special tokens ([CLS], [SEP]) are left out by default: they are the same in every text and only pull
        all averages towards one point.
        """
        table = model.embed_tokens.weight.detach().float().cpu().numpy()  # (V, D)
        return cls(table, lambda text: tokenizer.encode(text, add_special_tokens=not skip_special))

    @classmethod
    def from_word2vec(cls, sentences: Iterable[Sequence[str]], *, dim: int = 100, window: int = 5,
                      min_count: int = 2, epochs: int = 5, sg: bool = False, seed: int = 0, workers: int = 1,
                      lowercase: bool = True) -> "AveragedEmbeddings":
        """Train word2vec (gensim; CBOW unless ``sg``) on pre-split ``sentences`` and average its vectors.

        ``workers=1`` with a ``seed`` is deterministic; more workers are faster but not reproducible.
        """
        try:
            from gensim.models import Word2Vec
        except ImportError:
            raise ImportError("averaged word2vec needs gensim: pip install gensim") from None
        corpus = [[w.lower() for w in s] if lowercase else list(s) for s in sentences]
        w2v = Word2Vec(corpus, vector_size=dim, window=window, min_count=min_count, sg=int(sg), epochs=epochs,
                       seed=seed, workers=workers)
        index = w2v.wv.key_to_index
        return cls(w2v.wv.vectors, lambda text: [index.get(w) for w in words(text, lowercase)])


def corpus_sentences(files: Iterable[str | Path]) -> list[list[str]]:
    """Every non-empty line of ``files`` as a list of words (case kept): word2vec's training input.

    ``.gz``/``.zst`` files are read decompressed (the bundled corpus, ``lmforge.datasets.path("corpus")``, is one).
    """
    from lmforge.data.sources import open_binary

    out = []
    for file in files:
        with io.TextIOWrapper(open_binary(file), encoding="utf-8") as f:
            out += [w for w in (WORD.findall(line) for line in f) if w]
    return out
