"""Cross-entropy over a large vocabulary without materialising fp32 copies of the logits.

Under bf16 autocast, ``F.cross_entropy`` first casts the (N, V) logits to fp32, writes an fp32
log-softmax, and in backward writes two more fp32 (N, V) tensors before casting the gradient back:
on a CPU that memory traffic is a quarter of a small model's training step. This version reads the
logits in their own dtype, does the arithmetic in fp32 one chunk of rows at a time (so temporaries
stay in cache), saves only the per-row log-sum-exp, and writes the gradient
``softmax(z) - onehot(y)`` directly in the logits' dtype. The result equals ``F.cross_entropy`` up
to floating-point rounding (checked in tests).

Example:
    >>> import torch
    >>> z, y = torch.randn(6, 11, requires_grad=True), torch.randint(0, 11, (6,))
    >>> torch.allclose(cross_entropy(z, y), torch.nn.functional.cross_entropy(z, y))
    True
"""

from __future__ import annotations

import torch

_CHUNK_ROWS = 256


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, divisor: float) -> torch.Tensor:
        N = logits.shape[0]
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32  # never accumulate in bf16
        lse = torch.empty(N, dtype=acc, device=logits.device)
        picked = logits.gather(1, target[:, None]).squeeze(1).to(acc)  # (N,)
        for start in range(0, N, _CHUNK_ROWS):
            lse[start : start + _CHUNK_ROWS] = torch.logsumexp(logits[start : start + _CHUNK_ROWS].to(acc), dim=-1)
        ctx.save_for_backward(logits, target, lse)
        ctx.divisor = divisor
        return (lse - picked).sum() / divisor

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, target, lse = ctx.saved_tensors
        N = logits.shape[0]
        grad = torch.empty_like(logits)
        coef = grad_out.to(lse.dtype) / ctx.divisor
        rows = torch.arange(N, device=logits.device)
        for start in range(0, N, _CHUNK_ROWS):
            end = min(start + _CHUNK_ROWS, N)
            p = torch.exp(logits[start:end].to(lse.dtype) - lse[start:end, None])  # softmax rows, fp32
            p[rows[: end - start], target[start:end]] -= 1.0
            grad[start:end] = p * coef
        return grad, None, None


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
