"""Rotary position embeddings, RoPE (Su et al. 2021), as in Llama and GPT-NeoX.

Each pair of query/key dimensions is rotated by an angle proportional to the position,
``theta_i = pos * base^(-2i/d)``. Because rotations compose, the score between a query at m and a
key at n depends only on m - n: ``<R_m q, R_n k> = <q, R_{n-m} k>``. Pairs are (x[i], x[i + d/2])
("rotate half", the HF Llama layout). With ``rotary_dim < head_dim`` only the first ``rotary_dim``
dims rotate (partial rotary); the rest pass through.

Example:
    >>> import torch
    >>> rope = RotaryEmbedding(head_dim=8, base=10000.0)
    >>> cos, sin = rope(torch.arange(5)[None])        # (1, 1, 5, 8) each
    >>> q = torch.randn(1, 2, 5, 8)                   # (B, H, T, hd)
    >>> apply_rotary(q, cos, sin).shape
    torch.Size([1, 2, 5, 8])
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, base: float = 10000.0, rotary_dim: int | None = None):
        super().__init__()
        self.rotary_dim = rotary_dim or head_dim
        self.base = base
        self.register_buffer("inv_freq", torch.empty(self.rotary_dim // 2), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Recompute the frequencies (derived, so checkpoints do not store them)."""
        if self.inv_freq.is_meta:  # a meta shell: materialise() computes it once there is storage
            return
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        self.inv_freq.copy_(1.0 / (self.base**exponent))

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B, T) -> cos, sin of shape (B, 1, T, rotary_dim), broadcast over heads."""
        angles = position_ids[..., None].float() * self.inv_freq  # (B, T, r/2)
        angles = torch.cat([angles, angles], dim=-1)  # (B, T, r)
        return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x (B, H, T, hd); the rest pass through."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    out = (x_rot.float() * cos + rotated.float() * sin).to(x.dtype)
    return out if x_pass.shape[-1] == 0 else torch.cat([out, x_pass], dim=-1)
