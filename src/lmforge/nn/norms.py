"""Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

RMSNorm drops LayerNorm's mean subtraction and bias: ``y = x / sqrt(mean(x^2) + eps) * g``. T5 and
Llama use it; BERT, GPT-2 and BART use LayerNorm. Both map (..., D) -> (..., D).

Example:
    >>> import torch
    >>> norm = RMSNorm(8)
    >>> norm(torch.randn(2, 3, 8)).shape
    torch.Size([2, 3, 8])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no bias, no centring)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        # Statistics in fp32 even under bf16 autocast: the mean of squares loses precision in bf16.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def build_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """``kind`` is ModelConfig.norm: ``layernorm`` or ``rmsnorm``."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    return nn.LayerNorm(dim, eps=eps, bias=bias)
