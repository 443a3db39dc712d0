"""Decoding's matrix-vector products on an x86 CPU: a few activation rows times int8, bf16 or fp32 weights.

Decoding one sequence multiplies a single row by every weight matrix, so a step is bound by how fast the
weights stream from memory. The library kernels reach a fraction of the read bandwidth at one row: fbgemm's int8
GEMM (what :mod:`lmforge.nn.weight_only` calls for larger batches) about a third, MKL's sgemm about half, and
oneDNN's bf16 matmul, on a CPU without native bf16, is slower than fp32. ``kernels/gemv.c`` has three small AVX2
kernels that read the weights in their stored form (widening narrow ones in registers), output rows split among
torch's OpenMP threads:

- :func:`int8_gemv` is llama.cpp's Q8_0 dot product: each activation row is rounded to int8 with one scale,
  ``maddubs`` multiplies 32 byte pairs per instruction, and the sums stay exact in int32:

      y[r, o] = xs[r] * ws[o] * sum_i xq[r, i] * q[o, i],   xq = round(x / xs),  xs = max|x[r]| / 127

  Its activations keep 8 bits (fbgemm's AVX2 path keeps 7), so it is also the more accurate of the two.
- :func:`bf16_gemv` widens bf16 weights to fp32 exactly (a shift), sums in fp32 and rounds the output to bf16
  once, as a bf16 matmul accumulating in fp32 does: half the bytes of fp32 at the same arithmetic.
- :func:`f32_gemv` is the same loop over fp32 weights: four weight rows per pass, two activation rows per weight
  read.

Measured on the GPT-2 shape's matmuls of one decode step (12 layers and the tied head, 124 MB of int8), 2 threads,
AMD EPYC with AVX2, 2026-11-27: int8 4.7 ms at one row against fbgemm's 6.7 ms, 5.5 against 6.5 at two rows, and
15.4 against 8.8 at eight, where fbgemm's blocking wins: so :data:`MAX_ROWS` is 2. Rounding the activations
in AVX2 (one unsigned max over the bits of |x| gives both max|x| and whether the row is finite) took those
matmuls at one row from 8.4 to 7.2 ms, against 6.5 ms for torch to read the same bytes (one process, a busier
hour of the same day). bf16, same machine and
2026-11-27 (no native bf16), the 12 layers without the head: 10 ms at one row against oneDNN's 18 (and fp32
``F.linear``'s 38), 29 against 125 at eight rows, 74 against 349 at 32 (a prompt): so where oneDNN emulates bf16,
:func:`bf16_max_rows` is unbounded. fp32, same run conditions: 19 ms at one row against MKL's 30 (and the
transposed-copy forms of :mod:`lmforge.nn.linear`'s 24, head included), 32 against 58 at eight rows, 56 against
76 at 16; at 128 rows they are level, so :data:`F32_MAX_ROWS` is 16 and prompts stay with MKL.

Built on first use with the C compiler torch.compile also needs (``$CC``, else ``gcc`` or ``cc``), into
``~/.cache/lmforge/kernels/<torch, CPU, machine>/`` under a name hashed from the source and flags, written
atomically (``lmforge.utils.io.atomic_write_bytes``); a file that does not load is built again once. Where it
cannot be built or run (no compiler, not an x86-64 Linux CPU with AVX2 and FMA, or ``LMFORGE_GEMV=off``),
:func:`available` is False, :func:`unavailable_reason` says why, and the layers use the library kernels at every
batch size.

Example:
    >>> import torch
    >>> from lmforge.nn.weight_only import quantize_int8
    >>> q, s = quantize_int8(torch.randn(16, 64))
    >>> x = torch.randn(1, 64)
    >>> ref = x @ (q.float() * s[:, None]).T                    # the dequantised weight, fp32 activations
    >>> y = int8_gemv(x, q, s) if available() else ref           # (1, 16)
    >>> bool((y - ref).norm() / ref.norm() < 0.02)               # the activations' 8-bit rounding
    True
    >>> w, xb = torch.randn(16, 64).bfloat16(), x.bfloat16()
    >>> ref = xb.float() @ w.float().T
    >>> y = bf16_gemv(xb, w) if available() else ref.bfloat16()  # (1, 16) bf16
    >>> bool((y.float() - ref).abs().max() <= ref.abs().max() / 128)   # one bf16 rounding of the output
    True
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lmforge.utils.io import atomic_write_bytes
from lmforge.utils.machine import build_tag, native_bf16, user_cache_dir

SOURCE = Path(__file__).with_name("kernels") / "gemv.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
MAX_ROWS = 2  # up to this many activation rows the kernels beat the library ones (module docstring)
# ... except bf16 on a CPU without native bf16, where oneDNN emulates it: there the kernel wins at every size
F32_MAX_ROWS = 16  # fp32: up to this many rows (a decoding batch) the kernel beats MKL (module docstring)
ENV = "LMFORGE_GEMV"  # "off": always the library kernels

# once per process: "lib" (the loaded library or None), "reason" (why None), the kernels "int8", "bf16" and "f32",
# and "bf16_rows" (bf16_max_rows)
_state: dict = {}


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _why_not() -> str | None:
    """Why this process cannot use the kernel, or None when it can try to build it."""
    if os.environ.get(ENV) == "off":
        return f"{ENV}=off"
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return f"the kernel is for x86-64 Linux, not {sys.platform} on {platform.machine()}"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    if _compiler() is None:
        return "no C compiler (set $CC, or install gcc)"
    return None


def library_path() -> Path:
    """Where the built kernel for this source, these flags and this machine lives."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return user_cache_dir("kernels") / build_tag() / f"gemv-{digest}.so"


def _build(path: Path) -> None:
    """Compile ``SOURCE`` in a temporary folder, then write the library to ``path`` atomically (a full disk is an
    ``EnvironmentFault``, an ``OSError``, and leaves nothing under the name)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        done = subprocess.run([_compiler(), *FLAGS, str(SOURCE), "-o", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"compiling {SOURCE.name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        atomic_write_bytes(path, out.read_bytes())


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        _build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:  # a damaged or foreign file under our name: build it again, once
        path.unlink(missing_ok=True)
        _build(path)
        lib = ctypes.CDLL(str(path))
    for name in ("int8", "bf16", "f32"):
        fn = getattr(lib, f"lmforge_{name}_gemv")
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        fn.restype = ctypes.c_int
        _state[name] = fn
    return lib


def available() -> bool:
    """Whether the kernel is built and loaded (on the first call, it is built if need be)."""
    if "lib" not in _state:
        reason = _why_not()
        lib = None
        if reason is None:
            try:
                lib = _load()
            except OSError as exc:
                reason = str(exc)
        _state.update(lib=lib, reason=reason, bf16_rows=MAX_ROWS if native_bf16("cpu") else sys.maxsize)
    return _state["lib"] is not None


def ready() -> bool:
    """Whether the kernel is loaded already (never builds: for code that ``torch.compile`` traces)."""
    return _state.get("lib") is not None


def bf16_max_rows() -> int:
    """Up to how many rows :func:`lmforge.nn.linear.linear` sends bf16 products to :func:`bf16_gemv`: ``MAX_ROWS``
    on a CPU with native bf16 (AVX512-BF16, AMX), where oneDNN is fast for more; any number elsewhere, where
    oneDNN emulates bf16 (4-5x slower than this kernel from 8 rows up; module docstring). 0 before
    :func:`available` has run."""
    return _state.get("bf16_rows", 0)


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    available()
    return _state["reason"]


def reset() -> None:
    """Forget this process's answer, so that the next call looks (and builds) again: for tests."""
    _state.clear()


# The wrappers stay thin: a decode step calls them ~70 times, and each Python-level op costs about a microsecond.
def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (..., in) fp32 @ (qweight int8 (out, in) * scales fp32 (out,)[:, None])^T -> (..., out) fp32, with
    each row of ``x`` rounded to int8 (module docstring). Call only when :func:`available`."""
    if x.dtype is not torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    if not qweight.is_contiguous() or scales.dtype is not torch.float32 or not scales.is_contiguous():
        qweight, scales = qweight.contiguous(), scales.float().contiguous()
    n_out = qweight.shape[0]
    y = torch.empty(x.shape[:-1] + (n_out,))  # (..., out)
    if _state["int8"](x.data_ptr(), qweight.data_ptr(), scales.data_ptr(), y.data_ptr(), math.prod(x.shape[:-1]),
                      x.shape[-1], n_out):
        raise MemoryError("int8_gemv: out of memory for the rounded activations")
    return y


def bf16_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) bf16 @ weight bf16 (out, in)^T + bias bf16 (out,) -> (..., out) bf16, summed in fp32 and
    rounded once (module docstring). Call only when :func:`available`."""
    return _float_gemv("bf16", torch.bfloat16, x, weight, bias)


def f32_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) fp32 @ weight fp32 (out, in)^T + bias fp32 (out,) -> (..., out) fp32 (module docstring). Call
    only when :func:`available`."""
    return _float_gemv("f32", torch.float32, x, weight, bias)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype is dtype and t.is_contiguous() else t.to(dtype).contiguous()


def _float_gemv(kind: str, dtype: torch.dtype, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    x, weight = _as(x, dtype), _as(weight, dtype)
    bias = None if bias is None else _as(bias, dtype)
    n_out = weight.shape[0]
    y = torch.empty(x.shape[:-1] + (n_out,), dtype=dtype)  # (..., out)
    if _state[kind](x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                    math.prod(x.shape[:-1]), x.shape[-1], n_out):
        raise MemoryError(f"{kind}_gemv: out of memory for the widened activations")
    return y


# ------------------------------------------------------------------------------------------- ops
_LIB = torch.library.Library("lmforge", "FRAGMENT")


def register_linear_op(name: str, arguments: str, kernel) -> None:
    """Define ``lmforge::<name>(<arguments>) -> Tensor``, whose first argument is the activations x (..., in) and
    second the (out, in) weight, as a plain library op with the CPU ``kernel``: what a compiled graph calls as one
    opaque node. Plain rather than ``torch.library.custom_op``, whose Python wrapper costs about as much again as a
    one-row GEMM; no autograd (inference only)."""
    _LIB.define(f"{name}({arguments}) -> Tensor")
    _LIB.impl(name, kernel, "CPU")
    torch.library.register_fake(f"lmforge::{name}", lib=_LIB)(
        lambda x, weight, *rest: x.new_empty(*x.shape[:-1], weight.shape[0]))
