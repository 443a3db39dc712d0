"""Pooling token states into one sentence vector.

    method  vector                                       typical use
    cls     h[:, 0]                                      BERT-style [CLS] (needs fine-tuning to mean much)
    mean    sum_t m_t h_t / sum_t m_t                    Sentence-BERT's default (Reimers & Gurevych 2019)
    max     max_t over real tokens (padding -> -inf)     InferSent-style
    last    h at the last real token                     decoder-only models (the only token that saw all)

``m`` is the attention mask (1 = real token). Padding never enters a pooled vector, so a sentence's
embedding does not depend on what it was batched with.

Example:
    >>> import torch
    >>> h = torch.arange(12.).view(1, 3, 4)            # (B=1, T=3, D=4)
    >>> mask = torch.tensor([[1, 1, 0]])
    >>> pool(h, mask, "mean").tolist()
    [[2.0, 3.0, 4.0, 5.0]]
    >>> pool(h, mask, "last").tolist()
    [[4.0, 5.0, 6.0, 7.0]]
"""

from __future__ import annotations

import torch

POOLINGS = ("cls", "mean", "max", "last")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, method: str = "mean") -> torch.Tensor:
    """Pool (B, T, D) states over the real tokens of each row -> (B, D).

    Args:
        hidden: token states (B, T, D).
        attention_mask: (B, T), 1 for real tokens; padding is assumed on the right for ``cls``/``last``.
        method: one of :data:`POOLINGS`.
    """
    if method not in POOLINGS:
        raise ValueError(f"pooling={method!r}: use one of {', '.join(POOLINGS)}")
    mask = attention_mask.to(hidden.device).bool()  # (B, T)
    if method == "cls":
        return hidden[:, 0]
    if method == "last":
        last = mask.long().sum(1).clamp(min=1) - 1  # (B,) index of the last real token
        return hidden[torch.arange(hidden.size(0), device=hidden.device), last]
    if method == "max":
        return hidden.masked_fill(~mask[..., None], torch.finfo(hidden.dtype).min).max(1).values
    m = mask[..., None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
