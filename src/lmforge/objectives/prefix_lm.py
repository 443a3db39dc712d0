"""Prefix language modelling: bidirectional attention over a random prefix, causal loss on the rest.

Raffel et al. (2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", §3.2.1 and Fig. 4) run a decoder-only model with a "causal with prefix" mask. Every
position may attend to the whole prefix and, after the prefix, to the positions before it. Their
unsupervised variant draws the prefix length at random per example (T5's ``random_prefix_noise_mask``).
UniLM (Dong et al., 2019) calls this a sequence-to-sequence mask.

For an example of T + 1 tokens: ``input_ids = x[:-1]``, ``labels = x[1:]`` (aligned, as in causal LM),
and prefix length P ~ Uniform{1, ..., T-1}. Mask and labels (P = 3, T = 6; ``1`` = query i may attend key j)::

    key j ->  0 1 2 3 4 5        labels[t] = x[t+1]:
    query 0   1 1 1 . . .        t = 0, 1  -> -100 (x1, x2 sit in the prefix: position 0 can see them)
    query 1   1 1 1 . . .        t = 2..5  -> x3..x6 (the first target is predicted from the last
    query 2   1 1 1 . . .                      prefix position, which cannot see x3)
    query 3   1 1 1 1 . .
    query 4   1 1 1 1 1 .
    query 5   1 1 1 1 1 1

``attention_mask`` is (B, T, T) bool and complete: the model adds no causal mask of its own. Padding keys
are always masked out. Padding queries still see the real keys, so no softmax row is empty.

Example::

    >>> plm = PrefixLM(pad_token_id=0, seed=0)
    >>> batch = plm([[5, 6, 7, 8, 9], [10, 11, 12]])
    >>> batch["input_ids"].shape, batch["attention_mask"].shape, batch["attention_mask"].dtype
    (torch.Size([2, 4]), torch.Size([2, 4, 4]), torch.bool)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import IGNORE_INDEX, Seeded, next_token_batch


def prefix_lm_mask(prefix_lengths: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Causal-with-prefix attention mask.

    Args:
        prefix_lengths: (B,) number of bidirectional positions per example.
        real: (B, T) bool, False on padding.
    Returns:
        (B, T, T) bool, True where query i may attend key j: (j <= i or j < prefix) and key j is real.
    """
    T = real.size(1)
    i = torch.arange(T)[:, None]  # (T, 1) queries
    j = torch.arange(T)[None, :]  # (1, T) keys
    allowed = (j <= i) | (j < prefix_lengths[:, None, None])  # (B, T, T)
    return allowed & real[:, None, :]


class PrefixLM(Seeded):
    """Prefix-LM collator: sequences of T_i + 1 >= 3 tokens -> ``input_ids`` (B, T),
    ``attention_mask`` (B, T, T) bool, ``labels`` (B, T) with the prefix ignored."""

    def __init__(self, *, pad_token_id: int, seed: int = 0):
        super().__init__(seed)
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        input_ids, real, labels = next_token_batch(
            examples, self.pad_token_id, 3,
            "prefix LM needs sequences of at least 3 tokens (a prefix and a target after it)")
        n_inputs = real.sum(1)  # (B,)
        # P uniform on {1, ..., T_i - 1}: at least one token of context and at least two targets.
        prefix = 1 + (torch.rand(input_ids.size(0), generator=self.generator) * (n_inputs - 1)).long()  # (B,)
        # labels[t] = x[t+1]; for t < P-1 that token is in the prefix, visible to position t: no loss there.
        in_prefix = torch.arange(labels.size(1))[None, :] < (prefix - 1)[:, None]  # (B, T)
        return {
            "input_ids": input_ids,
            "attention_mask": prefix_lm_mask(prefix, real),
            "labels": labels.masked_fill(in_prefix, IGNORE_INDEX),
        }
