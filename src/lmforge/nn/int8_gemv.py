"""int8 weights times one or two activation rows on an x86 CPU: the kernel of batch-1 int8 decoding.

Decoding one sequence multiplies a single row by every weight matrix, so a step is bound by how fast the
int8 weights stream from memory. fbgemm's int8 GEMM (what :mod:`lmforge.nn.weight_only` calls for larger
batches) reads them at about a third of the read bandwidth at one row. This kernel is llama.cpp's Q8_0 dot
product in ~50 lines of C (``kernels/int8_gemv.c``): each activation row is rounded to int8 with one scale,
``maddubs`` multiplies 32 byte pairs per instruction, the sums stay exact in int32, and output rows are split
among torch's OpenMP threads:

    y[r, o] = xs[r] * ws[o] * sum_i xq[r, i] * q[o, i],   xq = round(x / xs),  xs = max|x[r]| / 127

Its activations keep 8 bits (fbgemm's AVX2 path keeps 7), so it is also the more accurate of the two. Measured
on the GPT-2 shape's matmuls of one decode step (12 layers and the tied head, 124 MB of int8), 2 threads, AMD
EPYC with AVX2, 2026-11-27: 4.7 ms at one row against fbgemm's 6.7 ms, 5.5 against 6.5 at two rows, and
15.4 against 8.8 at eight, where fbgemm's blocking wins: so :data:`MAX_ROWS` is 2.

Built on first use with the C compiler torch.compile also needs (``$CC``, else ``gcc`` or ``cc``), into
``~/.cache/lmforge/kernels/<torch, CPU, machine>/`` under a name hashed from the source and flags, written
atomically (``lmforge.utils.io.atomic_write_bytes``); a file that does not load is built again once. Where it cannot be built or run (no compiler, not an
x86-64 Linux CPU with AVX2 and FMA, or ``LMFORGE_INT8_GEMV=off``), :func:`available` is False,
:func:`unavailable_reason` says why, and the int8 layers use fbgemm at every batch size.

Example:
    >>> import torch
    >>> from lmforge.nn.weight_only import quantize_int8
    >>> q, s = quantize_int8(torch.randn(16, 64))
    >>> x = torch.randn(1, 64)
    >>> ref = x @ (q.float() * s[:, None]).T                    # the dequantised weight, fp32 activations
    >>> y = int8_gemv(x, q, s) if available() else ref           # (1, 16)
    >>> bool((y - ref).norm() / ref.norm() < 0.02)               # the activations' 8-bit rounding
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
from lmforge.utils.machine import build_tag, user_cache_dir

SOURCE = Path(__file__).with_name("kernels") / "int8_gemv.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
MAX_ROWS = 2  # up to this many activation rows the kernel beats fbgemm (module docstring)
ENV = "LMFORGE_INT8_GEMV"  # "off": always fbgemm

_state: dict = {}  # "lib" (the loaded library or None) and "reason" (why None), once per process


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
    return user_cache_dir("kernels") / build_tag() / f"int8_gemv-{digest}.so"


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
    fn = lib.lmforge_int8_gemv
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    fn.restype = ctypes.c_int
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
        _state.update(lib=lib, reason=reason)
    return _state["lib"] is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    available()
    return _state["reason"]


def reset() -> None:
    """Forget this process's answer, so that the next call looks (and builds) again: for tests."""
    _state.clear()


def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (..., in) fp32 @ (qweight int8 (out, in) * scales fp32 (out,)[:, None])^T -> (..., out) fp32, with
    each row of ``x`` rounded to int8 (module docstring). Call only when :func:`available`."""
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).contiguous()  # (m, in)
    q, s = qweight.contiguous(), scales.float().contiguous()
    y = torch.empty(flat.shape[0], q.shape[0])  # (m, out)
    if _state["lib"].lmforge_int8_gemv(flat.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), flat.shape[0],
                                       flat.shape[1], q.shape[0]):
        raise MemoryError("int8_gemv: out of memory for the rounded activations")
    return y.view(*x.shape[:-1], q.shape[0])
