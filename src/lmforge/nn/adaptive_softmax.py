"""Adaptive softmax (Grave et al. 2017, "Efficient softmax approximation for GPUs"): an output layer that spends
less on rare tokens.

The vocabulary is cut by frequency into a shortlist ``[0, c_1)`` and tail clusters ``[c_i, c_{i+1})``. The head
scores the shortlist plus one logit per cluster; cluster i scores its own tokens from a projection of width
``d / k**i`` (k = ``adaptive_factor``):

    log p(t) = log softmax(head(h))[t]                                   t in the shortlist
    log p(t) = log softmax(head(h))[c_1 + i - 1] + log softmax(tail_i(h))[t - c_i]     t in cluster i

This module computes exactly what ``torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob`` computes, with the same
parameter names (``head``, ``tail.{i}.0``, ``tail.{i}.1``), so the two load each other's state dicts (tested).

It returns the log-probabilities over the whole vocabulary, (..., V), in place of logits: they are already
normalised, so the cross-entropy of the LM loss is exactly -log p(target), and generation's softmax, top-k and
temperature read them like any logits. The saving is in the matmuls (the tail clusters run at width
d / k**i); the paper's other saving, scoring only the target's cluster during training, is not taken, since
the loss path scores whole rows.

Ids are assumed sorted by frequency, most frequent first: see :mod:`lmforge.nn.adaptive_input` for what
lmforge's tokenizers give. The model's output embedding is not tied to this layer's weights.

Example:
    >>> import torch
    >>> asm = AdaptiveSoftmax(d_model=16, vocab_size=20, cutoffs=[4, 12], factor=4.0)
    >>> logp = asm(torch.randn(2, 3, 16))
    >>> logp.shape, bool(torch.allclose(logp.exp().sum(-1), torch.ones(2, 3)))
    (torch.Size([2, 3, 20]), True)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.adaptive_input import band_widths


class AdaptiveSoftmax(nn.Module):
    """Hidden states (..., d_model) -> log-probabilities (..., V).

    Args:
        d_model: the input width d.
        vocab_size: V.
        cutoffs: the cluster ends below V, strictly increasing (``cutoffs[0]`` is the shortlist's size).
        factor: k; tail cluster i (1-based) projects to width ``d // k**i``.
        head_bias: a bias on the head's logits.
    """

    def __init__(self, d_model: int, vocab_size: int, cutoffs: list[int], factor: float = 4.0,
                 head_bias: bool = False):
        super().__init__()
        self.edges = [*cutoffs, vocab_size]
        self.shortlist = cutoffs[0]
        n_clusters = len(cutoffs)
        self.head = nn.Linear(d_model, self.shortlist + n_clusters, bias=head_bias)
        widths = band_widths(d_model, n_clusters + 1, factor)[1:]
        self.tail = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, w, bias=False), nn.Linear(w, hi - lo, bias=False))
            for w, lo, hi in zip(widths, self.edges, self.edges[1:])
        )

    def forward(self, h: torch.Tensor, tied_weight: torch.Tensor | None = None) -> torch.Tensor:
        """h (..., D) -> log p (..., V). ``tied_weight`` is unused: the layer owns its weights."""
        acc = torch.promote_types(h.dtype, torch.float32)  # never normalise in bf16
        head = F.log_softmax(self.head(h).to(acc), dim=-1)  # (..., shortlist + clusters)
        parts = [head[..., : self.shortlist]]
        for i, cluster in enumerate(self.tail):
            within = F.log_softmax(cluster(h).to(acc), dim=-1)  # (..., c_{i+1} - c_i)
            parts.append(within + head[..., self.shortlist + i, None])
        return torch.cat(parts, dim=-1)
