"""Product-key memory (Lample et al. 2019, "Large Memory Layers with Product Keys"): a key-value memory of
N = n_keys**2 slots that replaces a layer's feed-forward network, read at the cost of about 2 sqrt(N) keys.

Each of H heads maps x to a query q (width k_dim) and splits it into halves q1, q2. The N keys are the
concatenations [c1; c2] of two sub-key sets C1, C2 of n_keys each, so q . [c1; c2] = q1 . c1 + q2 . c2 and the
best k of the N keys lie among the k x k pairs of each half's best k (the paper's eq. 4):

    I1, I2 = top-k(q1 C1^T), top-k(q2 C2^T)                 (k,) each
    s, I = top-k over the k*k sums  s1[i] + s2[j]           slot id = i * n_keys + j
    out = sum_heads  sum_{slot in I} softmax(s)[slot] V[slot]     V (N, v_dim): an EmbeddingBag, summed

The search is exact: it finds the same k keys as scoring all N (tested against brute force). The paper's batch
normalisation of the queries is left out (its running statistics would make a batch's output depend on the
other rows in training), and so is its query dropout.

Example:
    >>> import torch
    >>> pkm = ProductKeyMemory(d_model=16, n_keys=8, topk=2, heads=2, key_dim=8)
    >>> pkm(torch.randn(3, 5, 16)).shape
    torch.Size([3, 5, 16])
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.nn.init import normal_


class ProductKeyMemory(nn.Module):
    """x (..., D) -> (..., D), a drop-in for a feed-forward network.

    Args:
        d_model: D (the values' width too).
        n_keys: sub-keys per half; the memory has ``n_keys**2`` slots.
        topk: keys each head reads.
        heads: H query heads, each with its own sub-keys; their reads are summed.
        key_dim: the query width (even: two halves of ``key_dim // 2``).
        value_std: std of the values' normal init.
    """

    def __init__(self, d_model: int, n_keys: int, topk: int, heads: int, key_dim: int, value_std: float = 0.02):
        super().__init__()
        self.n_keys, self.topk, self.heads, self.key_dim, self.value_std = n_keys, topk, heads, key_dim, value_std
        self.query = nn.Linear(d_model, heads * key_dim)
        self.keys = nn.Parameter(torch.empty(heads, 2, n_keys, key_dim // 2))  # (H, 2, n, k_dim / 2): C1, C2
        self.values = nn.EmbeddingBag(n_keys**2, d_model, mode="sum", _weight=torch.empty(n_keys**2, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's init: sub-keys U(-1/sqrt(k_dim/2), +), values N(0, value_std^2) (the query is a Linear)."""
        if not self.keys.is_meta:
            bound = 1 / math.sqrt(self.key_dim // 2)
            nn.init.uniform_(self.keys, -bound, bound)
        normal_(self.values.weight, std=self.value_std)

    def lookup(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, D) -> the slots read, (N, H, k) long, and their softmax weights (N, H, k)."""
        k, n = self.topk, self.n_keys
        q = self.query(x).unflatten(-1, (self.heads, 2, self.key_dim // 2))  # (N, H, 2, k_dim / 2)
        scores = torch.einsum("nhsc,hsmc->nhsm", q, self.keys.to(q.dtype))  # (N, H, 2, n): each half's sub-keys
        best, index = scores.topk(k, dim=-1)  # (N, H, 2, k)
        pairs = best[:, :, 0, :, None] + best[:, :, 1, None, :]  # (N, H, k, k): s1[i] + s2[j]
        slots = index[:, :, 0, :, None] * n + index[:, :, 1, None, :]  # (N, H, k, k)
        top, within = pairs.flatten(2).topk(k, dim=-1)  # (N, H, k) of the k*k candidates
        return slots.flatten(2).gather(-1, within), top.float().softmax(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D)."""
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        slots, weights = self.lookup(flat)  # (N, H, k) each
        out = self.values(slots.flatten(1), per_sample_weights=weights.flatten(1).to(self.values.weight.dtype))
        return out.to(x.dtype).view(x.shape)  # (..., D)
