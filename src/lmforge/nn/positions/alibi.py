"""ALiBi: attention with linear biases (Press et al. 2022).

No position embeddings at all: each head h adds ``-m_h * |i - j|`` to its attention logits, with
head slopes ``m_h`` a geometric sequence (for 8 heads: 1/2, 1/4, ..., 1/256). Distant keys are
penalised linearly, which lets models extrapolate to longer inputs than they were trained on. For a
causal decoder only j <= i is visible, where the bias is ``m_h * (j - i)`` as in the paper.

Example:
    >>> import torch
    >>> alibi = ALiBi(n_heads=4)
    >>> alibi(torch.arange(3), torch.arange(3)).shape     # (1, H, T, S)
    torch.Size([1, 4, 3, 3])
"""

from __future__ import annotations

import math

import torch
from torch import nn


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The paper's slopes; for a head count that is not a power of two, interleave (as in its code)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


class ALiBi(nn.Module):
    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.register_buffer("slopes", torch.empty(n_heads), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Recompute the slopes (derived, so checkpoints do not store them)."""
        if self.slopes.is_meta:  # a meta shell: materialise() computes it once there is storage
            return
        self.slopes.copy_(alibi_slopes(self.n_heads))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q_pos (T,), k_pos (S,) -> additive bias (1, H, T, S)."""
        distance = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (T, S)
        return (-self.slopes[:, None, None] * distance)[None]
