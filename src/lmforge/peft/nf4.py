"""NF4Linear: a frozen linear whose weight is stored as 4-bit NormalFloat, the base layer of QLoRA.

NF4 quantises each block of 64 weights to 4-bit indices into 16 levels placed at quantiles of N(0, 1),
scaled by the block's absmax; *double quantisation* stores those absmax scales in 8 bits (Dettmers et al.
2023; see :mod:`lmforge.peft.qlora`). The quantiser is torchao's ``NF4Tensor``: maintained, pure PyTorch, so
it runs on CPU and GPU alike. Every module-level PEFT method accepts an NF4Linear where it accepts an
nn.Linear, so this layer sits beside :class:`~lmforge.peft.layer.AdaptedModule` rather than in the QLoRA file.

Example:
    >>> from torch import nn
    >>> q = NF4Linear(nn.Linear(128, 64))
    >>> q.weight.shape, round(q.nbytes() / (128 * 64 * 4), 2)
    (torch.Size([64, 128]), 0.13)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.peft.layer import plain_linear


@functools.cache
def _torchao_nf4():
    """torchao's NF4 API. Its import logs that optional CUDA kernels are missing, which NF4 never uses."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    with contextlib.ExitStack() as stack:
        for lg, level in zip(loggers, levels):
            lg.setLevel(logging.ERROR)
            stack.callback(lg.setLevel, level)
        try:
            from torchao.quantization import NF4Tensor, to_nf4
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4
        except ImportError as exc:
            raise ImportError("QLoRA needs torchao for its NF4 weights: pip install 'torchao>=0.18'") from exc
    return NF4Tensor, to_nf4, linear_nf4


class NF4Linear(nn.Module):
    """A frozen linear whose weight is stored as NF4 with double-quantised scales.

    Shapes: x (..., in) -> (..., out), like the nn.Linear it replaces.

    Args:
        linear: the layer to quantise (its bias, if any, stays in full precision).
        block_size: weights per absmax scale (64 in the paper).
        scaler_block_size: scales per second-level fp32 scale (256 in the paper; lowered to a divisor of
            the number of blocks for small matrices).
    """

    def __init__(self, linear: nn.Linear, block_size: int = 64, scaler_block_size: int = 256):
        super().__init__()
        _, to_nf4, _ = _torchao_nf4()
        weight = linear.weight.detach()
        if weight.numel() % block_size:
            raise ConfigError(f"NF4: a {tuple(weight.shape)} weight does not split into blocks of {block_size}")
        n_blocks = weight.numel() // block_size
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.block_size, self.scaler_block_size = block_size, math.gcd(n_blocks, scaler_block_size)
        # A Parameter (frozen) rather than a buffer, so .to(), state_dict() and parameter counts see it.
        self.weight = nn.Parameter(to_nf4(weight.contiguous(), block_size, self.scaler_block_size), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, linear_nf4 = _torchao_nf4()
        y = linear_nf4(x, self.weight)  # dequantises in x's dtype; no gradient for the weight
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def dense_weight(self) -> torch.Tensor:
        """The dequantised (out, in) weight."""
        return self.weight.get_original_weight()

    def nbytes(self) -> int:
        """Bytes of the stored weight: 4-bit codes, 8-bit scales, fp32 second-level scales (bias excluded)."""
        w = self.weight
        return sum(t.numel() * t.element_size() for t in (w.quantized_data, w.quantized_scalers,
                                                          w.quantization_factor, w.scaler_mean, w.nf4))

    def dequantized(self) -> nn.Linear:
        """A plain nn.Linear holding the dequantised weight (for merged exports)."""
        return plain_linear(self.dense_weight(), None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4 block={self.block_size}"


LINEARS = (nn.Linear, NF4Linear)  # what a method that adapts linears may wrap
