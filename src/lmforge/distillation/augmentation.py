"""TinyBERT's data augmentation for task distillation (Jiao et al. 2020, section 3.3 and Algorithm 1).

Each training example gets N augmented copies (the paper: N = 20); the label is kept. A copy replaces each
word, with probability ``p`` (0.4), by a candidate drawn uniformly from ``k`` (15) candidates:

    a word of one piece     the top-k predictions of a pre-trained MLM at that word masked ([MASK]) in the
                            original sentence (the paper: BERT-base)
    a word of several       its k nearest words under static word vectors (the paper: GloVe; here PPMI + SVD
    pieces                  vectors of the training texts themselves,
                            :func:`lmforge.embeddings.neighbors.ppmi_svd_vectors`)

Words without candidates (a multi-piece word the vectors do not know, a sentence too long for the MLM) are
kept. Texts are split into words and punctuation (as TinyBERT splits with BERT's basic tokenizer) and the
copies are joined with single spaces. The MLM's candidates exclude special tokens and word continuations
("##ing"), which cannot stand as a word.

Everything random draws from ``numpy.random.default_rng((seed, row, copy))``: the same seed gives the same
copies, whatever the batching, and a copy does not depend on the others.

Example:
    >>> from lmforge.tasks.data import Table
    >>> t = Table("t", [{"text": "a b", "label": "1"}], ["text", "label"])
    >>> aug = augment_table(t, ["text"], 2, candidates=lambda row, words, i: ["z"], p=1.0)
    >>> [r["text"] for r in aug.rows], [r["label"] for r in aug.rows]
    (['a b', 'z z', 'z z'], ['1', '1', '1'])
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from lmforge.embeddings.neighbors import ppmi_svd_vectors
from lmforge.embeddings.static import words as split_words
from lmforge.tasks.data import Table

# candidates(row, words, i) -> the replacement candidates of words[i] (an empty list: keep the word)
Candidates = Callable[[int, Sequence[str], int], Sequence[str]]


def augment_table(table: Table, columns: Sequence[str], n: int, candidates: Candidates, *, p: float = 0.4,
                  seed: int = 0, on_column: Callable[[str], Candidates] | None = None) -> Table:
    """The rows of ``table``, each followed by ``n`` augmented copies of its text ``columns`` (other columns,
    the label among them, copied as they are).

    ``candidates`` proposes replacements for one word of one row's text; ``on_column(column)`` (optional)
    gives a proposer per column instead.
    """
    rows, lines = [], []
    for r, row in enumerate(table.rows):
        rows.append(row)
        lines.append(table.lines[r] if r < len(table.lines) else None)
        split = {c: split_words(str(row[c]), lowercase=False) for c in columns if row.get(c) is not None}
        for copy in range(n):
            rng = np.random.default_rng((seed, r, copy))
            new = dict(row)
            for c, ws in split.items():
                propose = on_column(c) if on_column is not None else candidates
                out = list(ws)
                for i, w in enumerate(ws):
                    if rng.random() < p:
                        options = list(propose(r, ws, i))
                        if options:
                            out[i] = options[int(rng.integers(len(options)))]
                new[c] = " ".join(out)
            rows.append(new)
            lines.append(None)
    return Table(f"{table.path} (augmented x{n})", rows, list(table.columns), lines)


class TinyBertCandidates:
    """The paper's proposer: MLM top-k for single-piece words, static-vector neighbours for the others.

    Args:
        mlm: a pre-trained lmforge Transformer with an MLM (or LM) head, reading ``tokenizer``'s ids.
        tokenizer: the lmforge Tokenizer of ``mlm`` (and of the student).
        sentences: the corpus the static vectors are trained on (lists of words; the training texts).
        k: candidates per word.
        dim: width of the static vectors.
    """

    def __init__(self, mlm: torch.nn.Module, tokenizer, sentences: Sequence[Sequence[str]], *, k: int = 15,
                 dim: int = 50, device: str | torch.device = "cpu") -> None:
        self.mlm = mlm.eval().to(device)
        self.tokenizer, self.k, self.device = tokenizer, k, torch.device(device)
        self.mask_id = tokenizer.special_token_ids().get("mask_token_id")
        if self.mask_id is None:
            raise ValueError("the augmentation MLM's tokenizer has no [MASK] token")
        specials = {v for v in tokenizer.special_token_ids().values() if isinstance(v, int)}
        self._banned = torch.tensor(sorted(specials | set(tokenizer.continuation_ids() or [])), dtype=torch.long)
        self.max_len = getattr(mlm.config, "max_seq_len", 512)
        vocab, vectors = ppmi_svd_vectors(sentences, dim=dim) if sentences else ([], np.zeros((0, dim)))
        self._where = {w: i for i, w in enumerate(vocab)}
        self._vocab = vocab
        norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        self._unit = vectors / norms
        self._cache: dict[tuple[tuple[str, ...], int], list[str]] = {}

    def pieces(self, word: str) -> list[int]:
        return self.tokenizer.encode([word], add_special_tokens=False, is_split_into_words=True)

    def neighbours(self, word: str) -> list[str]:
        """The ``k`` nearest other words of ``word`` (lower-cased) by cosine of the static vectors."""
        i = self._where.get(word.lower())
        if i is None:
            return []
        cos = self._unit @ self._unit[i]
        order = [j for j in np.argsort(-cos, kind="stable") if j != i][:self.k]
        return [self._vocab[j] for j in order]

    @torch.no_grad()
    def mlm_candidates(self, words: Sequence[str], i: int) -> list[str]:
        """The MLM's top-k words at ``words[i]`` masked in the original sentence."""
        pieces = [self.pieces(w) for w in words]
        full = self.tokenizer.encode(list(words), is_split_into_words=True)
        inner = [t for p in pieces for t in p]
        offset = next((o for o in range(len(full) - len(inner) + 1) if full[o:o + len(inner)] == inner), None)
        if offset is None or len(full) > self.max_len:
            return []
        position = offset + sum(len(p) for p in pieces[:i])
        ids = torch.tensor([full], device=self.device)  # (1, T)
        ids[0, position] = self.mask_id
        logits = self.mlm(ids, logits_to_keep=0).logits[0, position].float()  # (V,)
        logits[self._banned[self._banned < logits.shape[0]].to(self.device)] = float("-inf")
        top = logits.topk(min(self.k, logits.shape[0])).indices.tolist()
        return [w for t in top if (w := self.tokenizer.decode([t]).strip())]

    def __call__(self, row: int, words: Sequence[str], i: int) -> list[str]:
        if len(self.pieces(words[i])) == 1:
            key = (tuple(words), i)  # the same word of the same text in another copy: the same masked sentence
            if key not in self._cache:
                self._cache[key] = self.mlm_candidates(words, i)
            return self._cache[key]
        return self.neighbours(words[i])
