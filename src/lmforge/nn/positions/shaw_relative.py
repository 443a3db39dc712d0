"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018).

Each attention layer learns vectors ``a^K_d`` (and optionally ``a^V_d``) for clipped relative
distances ``d = clip(j - i, -k, k)``, shared across heads:

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d_h)          z_i = sum_j alpha_ij (v_j + a^V_ij)

Distances beyond +-k share the clipped vector, which is what lets the model generalise to lengths
it never saw. The key term is an additive logit bias, so attention can still use SDPA; the value term
needs the attention weights, so it runs on the explicit path in :mod:`lmforge.nn.attention`.

Example:
    >>> import torch
    >>> rel = ShawRelativePositions(head_dim=8, k=2, values=True)
    >>> rel.indices(torch.arange(4), torch.arange(4))[0].tolist()   # query 0: distances 0..3 -> 0,1,2,2
    [2, 3, 4, 4]
"""

from __future__ import annotations

import torch
from torch import nn


class ShawRelativePositions(nn.Module):
    def __init__(self, head_dim: int, k: int, values: bool = False):
        super().__init__()
        self.k = k
        self.key_table = nn.Parameter(torch.randn(2 * k + 1, head_dim) * 0.02)  # a^K
        self.value_table = nn.Parameter(torch.randn(2 * k + 1, head_dim) * 0.02) if values else None  # a^V

    def indices(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(T,), (S,) -> (T, S) row index into the tables for clip(j - i, -k, k)."""
        return (k_pos[None, :] - q_pos[:, None]).clamp(-self.k, self.k) + self.k

    def key_bias(self, q: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
        """q (B, H, T, hd), idx (T, S) -> logit bias (B, H, T, S) = scale * q_i . a^K_ij."""
        per_distance = q @ self.key_table.to(q.dtype).t()  # (B, H, T, 2k+1)
        B, H, T, _ = per_distance.shape
        gathered = per_distance.gather(-1, idx[None, None].expand(B, H, T, idx.shape[-1]))
        return gathered * scale

    def value_term(self, probs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """probs (B, H, T, S), idx (T, S) -> (B, H, T, hd) = sum_j alpha_ij a^V_ij."""
        B, H, T, S = probs.shape
        per_distance = probs.new_zeros(B, H, T, 2 * self.k + 1)
        per_distance.scatter_add_(-1, idx[None, None].expand(B, H, T, S), probs)  # alpha summed per distance
        return per_distance @ self.value_table.to(probs.dtype)
