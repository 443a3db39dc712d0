"""Cross-entropy over a large vocabulary without materialising fp32 copies of the logits.

Under bf16 autocast, ``F.cross_entropy`` first casts the (N, V) logits to fp32, writes an fp32
log-softmax, and in backward writes two more fp32 (N, V) tensors before casting the gradient back:
on a CPU that memory traffic is a quarter of a small model's training step. This version reads the
logits in their own dtype, does the arithmetic in fp32 one chunk of rows at a time (so temporaries
stay in cache), and writes the gradient ``(softmax(z) - onehot(y)) / N`` during the forward pass,
directly in the logits' dtype, so backward is a single rescale (none for a plain ``loss.backward()``).
With ``fused=True`` (what a model running under torch.compile asks for) the same loss and gradient come
from one inductor kernel instead of the chunk loop's small ops per chunk, which reads the logits once
rather than once per op (``benchmarks/train_step.py``'s compiled rows use it). The result equals
``F.cross_entropy`` up to floating-point rounding (checked in tests).

Label smoothing (Szegedy et al. 2016; Vaswani et al. 2017 §5.4 use eps = 0.1) trains against the target
distribution (1 - eps) onehot(y) + eps / V instead of onehot(y):

    loss = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v)        gradient: softmax(z) - (1 - eps) onehot(y) - eps / V

which is ``F.cross_entropy(..., label_smoothing=eps)``. With log p_v = z_v - max z - log S, the smoothing term
needs only the row's mean logit: mean_v(-log p_v) = max z + log S - mean_v z.

Example:
    >>> import torch
    >>> z, y = torch.randn(6, 11, requires_grad=True), torch.randint(0, 11, (6,))
    >>> torch.allclose(cross_entropy(z, y), torch.nn.functional.cross_entropy(z, y))
    True
"""

from __future__ import annotations

import functools

import torch

# Elements per chunk. On a CPU ~256K (1 MiB in fp32), so the fp32 temporaries stay in L2 cache. On a GPU each
# chunk costs a handful of kernel launches, and a chunk of a few rows leaves most of the chip idle: a GPT-2
# vocabulary in L2-sized chunks is thousands of launches per step, which made the loss alone take longer than
# the rest of the training step. There, chunks only bound the fp32 temporaries (256M elements: 1 GiB).
_CHUNK_ELEMENTS = 1 << 18
_CHUNK_ELEMENTS_GPU = 1 << 28


def _chunked_loss_and_grad(
    logits: torch.Tensor, target: torch.Tensor, divisor: float, want_grad: bool, weight: torch.Tensor | None = None,
    smoothing: float = 0.0,
):
    """Eager: logits (N, V), target (N,) -> (summed loss / divisor, its gradient (N, V) in the logits'
    dtype, or None), computed one cache-sized chunk of rows at a time. With ``weight`` (N,) each row's
    loss is multiplied by its weight instead (``divisor`` must then be 1). ``smoothing``: label smoothing eps."""
    N = logits.shape[0]
    acc = torch.promote_types(logits.dtype, torch.float32)  # never accumulate in bf16
    # The gradient softmax(z) - onehot(y) falls out of the same softmax pass as the loss, so it is written
    # here, once, in the logits' dtype; backward only rescales it. No fp32 (N, V) tensor survives.
    grad = torch.empty_like(logits) if want_grad else None
    elements = _CHUNK_ELEMENTS if logits.device.type == "cpu" else _CHUNK_ELEMENTS_GPU
    rows = max(8, elements // max(logits.shape[1], 1))
    total = torch.zeros((), dtype=acc, device=logits.device)
    for start in range(0, N, rows):
        end = min(start + rows, N)
        chunk, t = logits[start:end], target[start:end, None]  # (c, V), (c, 1)
        w = None if weight is None else weight[start:end, None].to(acc)  # (c, 1) the rows' loss weights
        if not want_grad:
            logp_all = torch.log_softmax(chunk, dim=-1, dtype=acc)  # (c, V)
            logp = logp_all.gather(1, t)  # (c, 1)
            if smoothing:
                logp = (1 - smoothing) * logp + smoothing * logp_all.mean(-1, keepdim=True)
            total -= logp.sum() if w is None else (logp * w).sum()
            continue
        probs = torch.softmax(chunk, dim=-1, dtype=acc)  # (c, V), fp32 in cache-sized rows
        # log p_t = (z_t - max z) - log S with S = sum exp(z - max z), and the row's largest probability is
        # exp(0) / S: so -log S = log max p. That spares the exp pass over (c, V) that recovering p from a
        # log_softmax would cost (ATen's standalone exp is slower than the softmax kernel's own).
        top = chunk.amax(-1, keepdim=True).to(acc)  # (c, 1)
        log_norm = probs.amax(-1, keepdim=True).log() - top  # (c, 1): -(max z + log S)
        logp = chunk.gather(1, t).to(acc) + log_norm  # (c, 1)
        if smoothing:  # mean_v log p_v = mean_v z - max z - log S
            logp = (1 - smoothing) * logp + smoothing * (chunk.mean(-1, keepdim=True, dtype=acc) + log_norm)
            probs.sub_(smoothing / chunk.shape[1])
        total -= logp.sum() if w is None else (logp * w).sum()
        probs.scatter_add_(1, t, probs.new_full(t.shape, smoothing - 1.0))  # in fp32, so p - 1 keeps its digits
        grad[start:end].copy_(probs.mul_(1.0 / divisor if w is None else w))  # scale in cache; round once
    return total / divisor, grad


def _loss_and_grad(logits: torch.Tensor, target: torch.Tensor, mean: bool, weight: torch.Tensor | None = None,
                   smoothing: float = 0.0):
    """The same loss and gradient written as whole-tensor ops, for inductor to fuse into one kernel.
    ``mean`` is a flag, not a divisor, so that every batch size shares one compiled graph; ``weight`` (N,)
    replaces it with per-row loss weights; ``smoothing`` is label smoothing's eps."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (N, V)
    top = z.amax(-1, keepdim=True)  # (N, 1)
    e = (z - top).exp()
    norm = e.sum(-1, keepdim=True)  # (N, 1)
    log_z = top + norm.log()  # (N, 1) logsumexp
    nll = (1 - smoothing) * (log_z - z.gather(1, target[:, None])) + smoothing * (log_z - z.mean(-1, keepdim=True))
    if weight is None:
        scale = 1.0 / z.shape[0] if mean else 1.0
        loss = nll.sum() * scale
    else:
        scale = weight[:, None].to(z.dtype)  # (N, 1)
        loss = (nll * scale).sum()
    onehot = torch.arange(z.shape[1], device=z.device) == target[:, None]  # (N, V)
    smoothed = (1 - smoothing) * onehot.to(z.dtype) + smoothing / z.shape[1]  # (N, V) the target distribution
    return loss, ((e / norm - smoothed) * scale).to(logits.dtype)


@functools.cache
def _compiled_loss_and_grad():
    return torch.compile(_loss_and_grad, dynamic=True)  # N varies with the labelled rows of each batch


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, mean: bool, fused: bool, weight,
                smoothing: float) -> torch.Tensor:
        if fused and ctx.needs_input_grad[0]:
            loss, grad = _compiled_loss_and_grad()(logits, target, mean, weight, smoothing)
        else:
            divisor = float(logits.shape[0]) if mean and weight is None else 1.0
            loss, grad = _chunked_loss_and_grad(logits, target, divisor, ctx.needs_input_grad[0], weight, smoothing)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # loss.backward() seeds 1: then the gradient is already final, and skipping the rescale saves a
        # full pass over the (N, V) logits. Reading the scalar is free on the CPU; elsewhere it would sync.
        if grad_out.device.type == "cpu" and grad_out.numel() == 1 and float(grad_out) == 1.0:
            return grad, None, None, None, None, None
        return grad * grad_out.to(grad.dtype), None, None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    reduction: str = "mean",
    fused: bool = False,
    weight: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Token cross-entropy. logits (N, V) in any float dtype, target (N,) long; no ignore index
    (select the labelled rows first). ``reduction``: ``mean`` or ``sum`` (a trainer that accumulates
    gradients sums, then divides by the target-token count of all its micro-batches). ``weight`` (N,):
    per-row loss weights, the loss is sum_i weight_i * CE_i and ``reduction`` is not used (an
    example-averaged loss weighs each token by 1 / (its example's targets x examples)). ``fused``:
    compute it with torch.compile (the first call compiles, once per process; needs what torch.compile
    needs). ``label_smoothing``: eps, as in ``F.cross_entropy`` (see the module docstring)."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1]")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r} must be 'mean' or 'sum'")
    if weight is not None and weight.shape != target.shape:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; it needs one weight per row, {tuple(target.shape)}")
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    return _CrossEntropy.apply(logits, target, reduction == "mean", fused, weight, float(label_smoothing))
