"""Cross-entropy over a large vocabulary without materialising fp32 copies of the logits.

Under bf16 autocast, ``F.cross_entropy`` first casts the (N, V) logits to fp32, writes an fp32
log-softmax, and in backward writes two more fp32 (N, V) tensors before casting the gradient back:
on a CPU that memory traffic is a quarter of a small model's training step. This version reads the
logits in their own dtype, does the arithmetic in fp32 one chunk of rows at a time (so temporaries
stay in cache), and writes the gradient ``(softmax(z) - onehot(y)) / N`` during the forward pass,
directly in the logits' dtype, so backward is a single rescale. The result equals ``F.cross_entropy`` up
to floating-point rounding (checked in tests).

Example:
    >>> import torch
    >>> z, y = torch.randn(6, 11, requires_grad=True), torch.randint(0, 11, (6,))
    >>> torch.allclose(cross_entropy(z, y), torch.nn.functional.cross_entropy(z, y))
    True
"""

from __future__ import annotations

import torch

# Rows per chunk: ~256K elements (1 MiB in fp32), so the fp32 temporaries stay in L2 cache.
_CHUNK_ELEMENTS = 1 << 18


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, divisor: float) -> torch.Tensor:
        N = logits.shape[0]
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32  # never accumulate in bf16
        want_grad = ctx.needs_input_grad[0]
        # The gradient softmax(z) - onehot(y) falls out of the same log-softmax pass, so it is written
        # here, once, in the logits' dtype; backward only rescales it. No fp32 (N, V) tensor survives.
        grad = torch.empty_like(logits) if want_grad else None
        rows = max(8, _CHUNK_ELEMENTS // max(logits.shape[1], 1))
        total = torch.zeros((), dtype=acc, device=logits.device)
        for start in range(0, N, rows):
            end = min(start + rows, N)
            t = target[start:end, None]
            logp = torch.log_softmax(logits[start:end], dim=-1, dtype=acc)  # (c, V), fp32 in cache-sized rows
            total -= logp.gather(1, t).sum()
            if want_grad:
                probs = logp.exp_()
                probs.scatter_add_(1, t, probs.new_full(t.shape, -1.0))
                grad[start:end] = probs.div_(divisor)
        ctx.save_for_backward(grad)
        return total / divisor

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_out.to(grad.dtype), None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Token cross-entropy. logits (N, V) in any float dtype, target (N,) long; no ignore index
    (select the labelled rows first). ``reduction``: ``mean`` or ``sum`` (a trainer that accumulates
    gradients sums, then divides by the target-token count of all its micro-batches)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r} must be 'mean' or 'sum'")
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    divisor = float(logits.shape[0]) if reduction == "mean" else 1.0
    return _CrossEntropy.apply(logits, target, divisor)
