"""Random initialisation that leaves meta-device tensors alone.

A model folder is loaded by building the model on the meta device (no storage) and filling it from the
safetensors file, so its random init is never used. Yet torch's ``normal_`` on a meta tensor goes through a
Python reference kernel that imports ``torch._dynamo``: seconds of a fresh process's start (``lmforge
generate``'s time to first token) spent on numbers nobody reads. The module constructors call these instead.

Example:
    >>> import torch
    >>> normal_(torch.empty(2, 3, device="meta"), std=0.02).is_meta
    True
    >>> table = embedding(10, 4)
    >>> table.weight.shape, bool(table.weight.abs().sum() > 0)
    (torch.Size([10, 4]), True)
"""

from __future__ import annotations

import torch
from torch import nn


def normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """``nn.init.normal_(tensor, 0, std)``, or nothing for a meta tensor (it has no values to set)."""
    if tensor.is_meta:
        return tensor
    return nn.init.normal_(tensor, std=std)


def embedding(num_embeddings: int, dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` (no padding row) initialised as torch's own, N(0, 1), but with :func:`normal_`, so
    that building it on the meta device costs nothing. It draws the same random numbers as ``nn.Embedding``."""
    weight = torch.empty(num_embeddings, dim)
    return nn.Embedding(num_embeddings, dim, _weight=normal_(weight, std=1.0))
