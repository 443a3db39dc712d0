"""Dropout whose mask costs a fraction of ``F.dropout``'s on a CPU.

Dropout (Srivastava et al. 2014) zeroes each element with probability p while training and scales the others
by 1 / (1 - p), so that the expectation is unchanged. On a CPU, ``F.dropout`` draws its mask with
``bernoulli_``: one draw of the generator, and one conversion to a probability, per element. In a fine-tuning
step of all-MiniLM-L6-v2 (batch 16 of rt-sentiment, about 27 tokens each, bf16 autocast, 2 threads) that was
a sixth of the step's time (torch.profiler over 16 steps: 758 ms of ``bernoulli_`` in 3.7 s), more than the
attention matmuls took.

Here the generator fills 64-bit words, and each word gives four 16-bit uniform integers, kept where they fall
below a threshold: a quarter of the generator's work and one comparison per element. The keep probability
becomes a multiple of 1/65536 (0.9 becomes 0.899994), and the kept elements are scaled by the inverse of
that rounded probability, so the expectation is still exactly x. The mask comes from torch's CPU generator, so
``torch.manual_seed`` and a resumed run's restored RNG state reproduce it.

Elsewhere ``F.dropout`` stays: under torch.compile (inductor draws masks inside its fused kernels) and on
GPUs (counter-based generators make the mask cheap there).

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> x = torch.ones(100_000)
    >>> y = dropout(x, 0.1)
    >>> round(float((y == 0).float().mean()), 2), round(float(y.mean()), 2)  # about 10% zeroed; mean kept
    (0.1, 1.0)
    >>> torch.equal(dropout(x, 0.1, training=False), x)
    True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LEVELS = 1 << 16  # a 16-bit uniform integer takes this many values


def keep_mask(shape: torch.Size | tuple[int, ...], kept: int) -> tuple[torch.Tensor, float]:
    """A bool mask of ``shape`` that is True with probability kept / 65536, and the scale 65536 / kept, from
    torch's default CPU generator."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)  # uniform over all 64 bits
    draws = words.view(torch.int16)[:n]  # 4 uniform int16 per word, in [-32768, 32767]
    return (draws < kept - LEVELS // 2).view(shape), LEVELS / kept


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale forward and backward, one fused pass each (ATen's dropout backward kernel)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, mask, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, mask, ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with a cheaper mask on a CPU (see the module docstring)."""
    if not training or p == 0:
        return x
    kept = round((1 - p) * LEVELS)  # of the 65536 values a 16-bit draw can take, this many keep the element
    if x.device.type != "cpu" or torch.compiler.is_compiling() or not 0 < kept < LEVELS:
        return F.dropout(x, p, training=True)
    mask, scale = keep_mask(x.shape, kept)
    return _MaskedScale.apply(x, mask, scale)
