"""A word vocabulary for the neural baselines: words of the training texts, and their starting vectors.

The BiLSTM and CNN baselines of the pre-BERT era read words, not sub-words: each text is split into words and
punctuation (:func:`lmforge.embeddings.static.words`, lower-cased), and every word seen at least ``min_count``
times in the training texts gets an id; rarer and unseen words share ``<unk>``. Id 0 is padding.

Their embedding table starts either random (``N(0, 1)``, as PyTorch's ``nn.Embedding``) or from static word
vectors: word2vec (Mikolov et al. 2013) trained on the training texts with
:meth:`lmforge.embeddings.static.AveragedEmbeddings.from_word2vec` (gensim). Words word2vec did not keep stay
random.

Example:
    >>> vocab = WordVocab.build(["A good film.", "a bad film"], min_count=2)
    >>> vocab.words
    ['<pad>', '<unk>', 'a', 'film']
    >>> vocab.encode("A long film")
    [2, 1, 3]
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np
import torch

from lmforge.embeddings.static import AveragedEmbeddings, words

PAD, UNK = "<pad>", "<unk>"
VECTORS = ("random", "word2vec")


class WordVocab:
    """Word -> id, with ``<pad>`` = 0 and ``<unk>`` = 1; the rest in order of falling frequency."""

    def __init__(self, vocabulary: Sequence[str]) -> None:
        self.words = list(vocabulary)
        if self.words[:2] != [PAD, UNK]:
            raise ValueError(f"a word vocabulary starts with {PAD}, {UNK}; got {self.words[:2]}")
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, texts: Sequence[str], min_count: int = 1, max_size: int | None = None) -> "WordVocab":
        """Every word of ``texts`` seen at least ``min_count`` times (the ``max_size`` most frequent)."""
        counts = Counter(w for text in texts for w in words(text))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls([PAD, UNK, *kept[:max_size]])

    def encode(self, text: str) -> list[int]:
        return [self.index.get(w, 1) for w in words(text)]

    def vectors(self, how: str, dim: int, texts: Sequence[str], seed: int = 0) -> torch.Tensor:
        """(V, dim) starting embeddings: ``random`` or ``word2vec`` trained on ``texts``; the padding row is 0."""
        if how not in VECTORS:
            raise ValueError(f"word vectors {how!r}: choose one of {', '.join(VECTORS)}")
        table = torch.randn(len(self), dim, generator=torch.Generator().manual_seed(seed))
        if how == "word2vec":
            w2v = AveragedEmbeddings.from_word2vec([words(t) for t in texts], dim=dim, min_count=1, seed=seed)
            for word, i in self.index.items():
                found = w2v.to_ids(word)
                if len(found) == 1 and found[0] is not None:
                    table[i] = torch.from_numpy(np.asarray(w2v.table[found[0]], dtype=np.float32))
        table[0] = 0.0
        return table
