"""Permuted language modelling (XLNet: Yang et al. 2019, "XLNet: Generalized Autoregressive Pretraining for
Language Understanding", §2.2-2.3).

XLNet keeps the autoregressive factorisation p(x) = prod_t p(x_{z_t} | x_{z_<t}) but over a factorisation
order z sampled per sequence, so in expectation every token is predicted from context on both sides. The
tokens keep their places; only the attention masks follow z. With rank(i) the place of position i in z:

    content stream  position i sees positions j with rank(j) <= rank(i)   (its own content included)
    query stream    position i sees positions j with rank(j) <  rank(i)   (never its own content)

The query stream is what predicts x_i: it knows the position i (its target's place) but not the token.
Both streams run through the same layers (:class:`lmforge.models.two_stream.TwoStreamLM`). Partial
prediction (§2.3) only predicts the last 1/K of the order (the tokens with the most context): the
c = n/K tokens of rank >= n - c, ``partial_k`` = K (the paper uses 6 to 7).

Example, order z = (2, 0, 3, 1), so ranks = (1, 3, 0, 2) (``1`` = query i may attend key j)::

    content   key 0 1 2 3        query   key 0 1 2 3
    query 0       1 . 1 .                    . . 1 .
    query 1       1 1 1 1                    1 . 1 1
    query 2       . . 1 .                    . . . .
    query 3       1 . 1 1                    1 . 1 .

    >>> content, query = permutation_masks(torch.tensor([[1, 3, 0, 2]]), torch.ones(1, 4, dtype=torch.bool))
    >>> query[0].int().tolist()
    [[0, 0, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]]
    >>> plm = PermutedLM(pad_token_id=0, partial_k=2, seed=0)
    >>> batch = plm([[10, 11, 12, 13], [14, 15]])
    >>> sorted(batch), int((batch["labels"] != -100).sum())  # 4/2 + 2/2 predicted tokens
    (['content_mask', 'input_ids', 'labels', 'query_mask'], 3)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import IGNORE_INDEX, Seeded, pad


def permutation_masks(ranks: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-stream attention masks from each position's rank in the factorisation order.

    Args:
        ranks: (B, T) rank of each position in its row's order (padding: anything).
        real: (B, T) bool, False on padding (never a key).
    Returns:
        ``(content, query)``, each (B, T, T) bool, True where query i may attend key j.
    """
    r_i, r_j = ranks[:, :, None], ranks[:, None, :]  # (B, T, 1), (B, 1, T)
    keys = real[:, None, :]  # (B, 1, T)
    return (r_j <= r_i) & keys, (r_j < r_i) & keys


class PermutedLM(Seeded):
    """XLNet collator: ``input_ids`` (B, T), ``content_mask``/``query_mask`` (B, T, T) bool and ``labels`` (B, T),
    the original tokens at the last 1/K of each row's order, -100 elsewhere.

    Args:
        pad_token_id: padding id.
        partial_k: K, the inverse share of predicted tokens (at least one, and never the first of the order,
            which would have no context: a one-token row, the tail of a document cut into windows, predicts
            nothing).
        seed: seed of the generator that draws the orders.
    """

    def __init__(self, *, pad_token_id: int, partial_k: float = 6.0, seed: int = 0):
        super().__init__(seed)
        if partial_k < 1:
            raise ValueError(f"partial_k must be >= 1 (predict 1/K of the tokens), got {partial_k}")
        self.pad_token_id, self.partial_k = pad_token_id, partial_k

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        ids, real = pad(examples, self.pad_token_id)  # (B, T) each
        B, T = ids.shape
        ranks = torch.full((B, T), T, dtype=torch.long)  # padding after every real position
        predicted = torch.zeros(B, T, dtype=torch.bool)
        for b, n in enumerate(real.sum(1).tolist()):
            if n == 0:
                raise ValueError("permuted LM got an empty sequence: there is nothing to predict")
            ranks[b, :n] = torch.randperm(n, generator=self.generator)
            c = min(max(round(n / self.partial_k), 1), n - 1)  # tokens to predict (none in a one-token row)
            predicted[b, :n] = ranks[b, :n] >= n - c
        content, query = permutation_masks(ranks, real)
        return {"input_ids": ids, "content_mask": content, "query_mask": query,
                "labels": ids.masked_fill(~predicted, IGNORE_INDEX)}
