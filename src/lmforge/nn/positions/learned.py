"""Learned absolute position embeddings (BERT, GPT-2, BART, RoBERTa).

One trainable vector per position. ``offset`` reproduces RoBERTa/BART checkpoints, whose tables
reserve the first two rows (RoBERTa: ``padding_idx + 1``; BART: a fixed offset of 2), so position
``i`` reads row ``i + offset``.

Example:
    >>> import torch
    >>> pos = LearnedPositions(max_len=8, dim=4, offset=2)
    >>> pos.weight.shape, pos(torch.arange(3)[None]).shape
    (torch.Size([10, 4]), torch.Size([1, 3, 4]))
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn.init import normal_


class LearnedPositions(nn.Module):
    def __init__(self, max_len: int, dim: int, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len + offset, dim))
        normal_(self.weight, std=0.02)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        # The range check reads a value back from the tensor; skip it inside torch.compile graphs.
        if not torch.compiler.is_compiling() and position_ids.numel() and int(position_ids.max()) >= self.max_len:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond max_seq_len={self.max_len} of the learned "
                "position table; shorten the input or use a model with a longer max_seq_len"
            )
        return self.weight[position_ids + self.offset]
