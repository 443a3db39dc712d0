"""Sinusoidal position encodings (Vaswani et al. 2017; the seed lecture's p_i).

    p_i[2j]   = sin(i / 10000^(2j/d))
    p_i[2j+1] = cos(i / 10000^(2j/d))      for j = 0 .. d/2 - 1

Sines and cosines of geometrically spaced periods are interleaved, so ``p_{i+k}`` is a fixed linear
function (a rotation per frequency) of ``p_i``: relative offsets are easy for attention to read.
Nothing is learned; the table is a buffer, so it is not saved with the weights.

Example:
    >>> sinusoidal_table(4, 6).shape
    torch.Size([4, 6])
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_table(n_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(n_positions, dim) table; ``dim`` must be even."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = pos * inv_freq  # (P, dim/2)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float()


class SinusoidalPositions(nn.Module):
    """Maps position ids (B, T) to fixed encodings (B, T, D)."""

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len, self.dim = max_len, dim
        self.register_buffer("table", torch.empty(max_len, dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Recompute the table (it is derived, so checkpoints do not store it)."""
        if self.table.is_meta:  # a meta shell: materialise() computes it once there is storage
            return
        self.table.copy_(sinusoidal_table(self.max_len, self.dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]
