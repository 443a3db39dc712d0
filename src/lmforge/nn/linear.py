"""Linear layers while decoding: lmforge's CPU kernels, or weight forms that MKL multiplies faster, chosen in one
place.

Decoding multiplies one or a few rows per sequence by every weight matrix, so each step is bound by
how fast the weights are read, and ``F.linear`` (MKL's sgemm with the ``(out, in)`` weight as its
transposed operand) reads them well below that rate at these shapes.

fp32 weights. Up to :data:`lmforge.nn.gemv.F32_MAX_ROWS` fp32 rows on a CPU, with gradients off and outside
``torch.compile`` (whose decode step packs its own GEMMs), go to :func:`lmforge.nn.gemv.f32_gemv` where it is
built. Elsewhere, on the tiny GPT shape (fp32, weights coming from DRAM as in decoding) these forms read them
faster than ``F.linear``:

    rows   weight                        instead of F.linear
    1      wide (out >= 2 in): up, head  x @ W^T from a transposed (in, out) copy (the layout GPT-2's
                                         Conv1D stores)
    2-16   out >= in                     W @ x^T on the stored layout
    other  (square at one row, narrow)   kept: no faster form found

``benchmarks/generate.py`` measures eager decoding, which uses them, against HF ``generate``.

:func:`decoding_weights` registers weights (out >= in) for the duration of a ``with`` block, giving wide
ones their transposed copy; generation uses it for fp32 CPU models where the kernel is not built. :func:`linear`
takes the faster form only for a registered weight, with gradients off and the weight unchanged since
registration; everything else is ``F.linear``. The copies cost memory (the wide weights once more) only inside the
block. Results equal ``F.linear``'s to fp32 rounding.

bf16 weights. bf16 rows on a CPU, with gradients off, go to :func:`lmforge.nn.gemv.bf16_gemv` (where it is
built), which reads the bf16 weights near the read bandwidth and sums in fp32: decoding's one or two rows, and on
a CPU without native bf16 (where oneDNN emulates bf16, slower than fp32) any number of rows. Under
``torch.compile`` it is one opaque operator, ``lmforge::bf16_gemv``. Its results equal a bf16 ``F.linear`` to bf16
rounding of the output.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(8, 32)
    >>> x = torch.randn(2, 3, 8)
    >>> with decoding_weights([layer.weight]), torch.no_grad():
    ...     y = apply_linear(layer, x)             # (B, T, 32), 6 rows: the fp32 kernel, or W @ x^T without it
    >>> torch.allclose(y, layer(x), atol=1e-6)
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn import gemv

# id(weight) -> (weight, its version when registered, weight.T contiguous (in, out) for wide weights, else None)
_DECODE: dict[int, tuple[torch.Tensor, int, torch.Tensor | None]] = {}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in) -> (..., out)."""
    kernel = cpu_kernel(x, weight)
    if kernel == "bf16":
        return gemv.bf16_gemv(x, weight, bias)  # an operator: one opaque node in a compiled graph
    if kernel == "f32":
        return gemv.f32_gemv(x, weight, bias)
    if _DECODE:
        entry = _DECODE.get(id(weight))
        # Registered forms hold no gradient path and go stale if the weight is written: use them only then.
        if entry is not None and entry[0] is weight and entry[1] == weight._version and not torch.is_grad_enabled():
            flat = x.reshape(-1, x.shape[-1])  # (N, in)
            if 2 <= flat.shape[0] <= 16:
                # A few rows (batched decoding): W (out, in) @ x^T (in, N) reads W as stored, fastest here.
                y = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())
                return y.t().contiguous().view(*x.shape[:-1], weight.shape[0])
            wt = entry[2]
            if wt is not None:  # one row (or a prompt) times a wide weight: stream the transposed copy
                y = torch.mm(flat, wt) if bias is None else torch.addmm(bias, flat, wt)  # (N, out)
                return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def cpu_kernel(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Which of lmforge's CPU kernels :func:`linear` multiplies ``x`` by ``weight`` with: ``"bf16"``, ``"f32"``, or
    None for ``F.linear``. Both need x and the weight in their dtype on a CPU, gradients off, and the kernel built
    (under ``torch.compile``: built before tracing, as :mod:`lmforge.generation.compiled` does, for nothing is
    built in a trace). bf16 takes up to :func:`lmforge.nn.gemv.bf16_max_rows` rows; fp32 up to
    :data:`lmforge.nn.gemv.F32_MAX_ROWS`, and never in a compiled graph (a compiled step packs its own GEMMs)."""
    if x.device.type != "cpu" or x.dtype is not weight.dtype or torch.is_grad_enabled():
        return None
    compiling = torch.compiler.is_compiling()
    if x.dtype is torch.bfloat16:
        built = gemv.ready() if compiling else gemv.available()  # first: available() sets bf16_max_rows
        return "bf16" if built and x.numel() <= gemv.bf16_max_rows() * x.shape[-1] else None
    if x.dtype is torch.float32 and not compiling and x.numel() <= gemv.F32_MAX_ROWS * x.shape[-1]:
        return "f32" if gemv.available() else None
    return None


def apply_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, through :func:`linear` when it is a plain ``nn.Linear`` without hooks; a wrapped
    projection (LoRA, quantised) or a hooked one runs its own forward."""
    if type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks):
        return linear(x, module.weight, module.bias)
    return module(x)


def is_wide(weight: torch.Tensor) -> bool:
    """A (out, in) matrix with out >= 2 in: one row reads its transpose faster."""
    return weight.dim() == 2 and weight.shape[0] >= 2 * weight.shape[1]


@contextlib.contextmanager
def decoding_weights(weights: Iterable[torch.Tensor]) -> Iterator[None]:
    """Within the block, :func:`linear` multiplies by ``weights`` (each (out, in) with out >= in) in the
    forms that decode fastest (see the module docstring); wide ones get a transposed copy. Nested or
    concurrent blocks over the same weights share the first one's registration."""
    added = []
    with torch.no_grad():
        for w in weights:
            if id(w) not in _DECODE:
                _DECODE[id(w)] = (w, w._version, w.detach().t().contiguous() if is_wide(w) else None)
                added.append(id(w))
    try:
        yield
    finally:
        for key in added:
            _DECODE.pop(key, None)
