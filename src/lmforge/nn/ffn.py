"""Position-wise feed-forward network, plain or gated.

Plain (Vaswani et al. 2017):  ``FFN(x) = down(act(up(x)))``
Gated (GLU variants, Shazeer 2020): ``FFN(x) = down(act(gate(x)) * up(x))`` -- SwiGLU in Llama,
gated GELU in T5 v1.1. Shapes: (B, T, D) -> (B, T, D) through a (B, T, d_ff) hidden layer.

Example:
    >>> import torch
    >>> ffn = FeedForward(16, 64, "swiglu", bias=False)
    >>> ffn(torch.randn(2, 5, 16)).shape
    torch.Size([2, 5, 16])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import GATED_ACTIVATIONS
from lmforge.nn.activations import activation_fn
from lmforge.nn.dropout import dropout
from lmforge.nn.linear import apply_linear


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.act = activation_fn(activation)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if activation in GATED_ACTIVATIONS else None
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        if self.gate is None:
            h = self.act(apply_linear(self.up, x))  # (B, T, d_ff)
        else:
            h = self.act(apply_linear(self.gate, x)) * apply_linear(self.up, x)  # (B, T, d_ff)
        if self.dropout and self.training:
            h = dropout(h, self.dropout)
        return apply_linear(self.down, h)  # (B, T, D)
