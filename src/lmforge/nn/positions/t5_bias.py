"""T5's bucketed relative position bias (Raffel et al. 2020, section 2.1).

Each head learns one scalar per *bucket* of relative distance ``k - q``, added to the attention
logits. Buckets are exact for small distances and logarithmically wider up to ``max_distance``;
beyond that all distances share the last bucket. Encoders use separate buckets for keys before and
after the query (bidirectional); decoders only look back. The bias is computed once per stack and
shared by all its layers, as in T5.

Example:
    >>> import torch
    >>> bias = T5RelativeBias(n_heads=4, bidirectional=True)
    >>> bias(torch.arange(5), torch.arange(5)).shape       # (1, H, T, S)
    torch.Size([1, 4, 5, 5])
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.nn.init import normal_


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Map signed distances ``key - query`` (any shape, long) to bucket ids in [0, num_buckets)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        # The upper half of the buckets is for keys to the right of the query.
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # only keys at or before the query
    max_exact = num_buckets // 2
    # Log-spaced buckets between max_exact and max_distance; clamp(min=1) avoids log(0) on the
    # small branch, which torch.where discards anyway.
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class T5RelativeBias(nn.Module):
    def __init__(self, n_heads: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads))
        normal_(self.weight, std=0.02)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q_pos (T,), k_pos (S,) -> additive bias (1, H, T, S)."""
        rel = k_pos[None, :] - q_pos[:, None]  # (T, S)
        bucket = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return self.weight[bucket].permute(2, 0, 1)[None]  # (1, H, T, S)
