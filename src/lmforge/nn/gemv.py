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

Memory streams. Each thread takes a contiguous range of output rows and reads it as four streams, one row from each
quarter of its range per pass: on this host one sequential stream per core read 18-22 GB/s and four read 26-30
(a plain AVX2 sum over 128 MB, 2 threads). It made the int8 kernel 1.45-1.9x faster on weights read from memory,
at every decoding shape of GPT-2 (768 to 50,257 rows of 768 or 3,072 inputs, one and two rows; the two forms
alternating in one process, identical outputs, 2026-11-28). The figures above were measured before it, and
:data:`MAX_ROWS` was not tuned again. Each stream is also prefetched 1 KB ahead (``PREFETCH_AHEAD``): on an Intel
Xeon with AVX-512 (2 threads, 2026-11-28), the GPT-2 shape's 73 products of one decode step, weights from memory,
took 11.8 ms in bf16 against 13.2 without it, and 22.5 against 25.0 in fp32 (medians of 5 rounds alternating in
one process; 512 B to 2 KB ahead did as well, eight streams no better; a non-temporal prefetch was slower).

Callers reach the kernels as PyTorch operators (``torch.ops.lmforge.int8_gemv``, ``int8_gemv_n``, ``bf16_gemv``,
``f32_gemv``; ``kernels/gemv_ops.cpp``), which a compiled graph calls as opaque nodes and the dispatcher calls
without Python in between: called through ctypes from Python, each of a step's ~70 products paid about as much
again in Python as the product itself. With the C++ operators, a compiled int8 step of the GPT-2 shape went from
12.2-14.9 to 8.0-11.2 ms in alternating processes (2026-11-28, a busy host; tokens identical).

Built on first use with the compilers torch.compile also needs (``$CC``, else ``gcc`` or ``cc``, for the kernels;
``$CXX``, else ``g++`` or ``c++``, for the operators, against torch's headers: about 15 s, once per torch version),
into ``~/.cache/lmforge/kernels/<torch, CPU, machine>/`` under names hashed from the sources and flags, written
atomically (``lmforge.utils.io.atomic_write_bytes``); a file that does not load is built again once. The operators
are registered once per process and stay; the kernels they call are handed to them (and handed again after
:func:`reset`). Where either cannot be built or run (no compiler, not an x86-64 Linux CPU with AVX2 and FMA, or
``LMFORGE_GEMV=off``), :func:`available` is False, :func:`unavailable_reason` says why, and the layers use the
library kernels at every batch size.

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

KERNELS = Path(__file__).with_name("kernels")
SOURCE = KERNELS / "gemv.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
OPS_SOURCE = KERNELS / "gemv_ops.cpp"  # the kernels as torch operators (built against torch's headers)
OPS_FLAGS = ("-O2", "-std=c++20", "-shared", "-fPIC", "-w")
MAX_ROWS = 2  # up to this many activation rows the kernels beat the library ones (module docstring)
# ... except bf16 on a CPU without native bf16, where oneDNN emulates it: there the kernel wins at every size
F32_MAX_ROWS = 16  # fp32: up to this many rows (a decoding batch) the kernel beats MKL (module docstring)
ENV = "LMFORGE_GEMV"  # "off": always the library kernels

# once per process: "lib" (the loaded kernels or None), "reason" (why None) and "bf16_rows" (bf16_max_rows)
_state: dict = {}
# "lib": the operator library, loaded once per process and never again (its operators can be registered only once)
_ops: dict = {}


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _cxx_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


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
    if _cxx_compiler() is None and "lib" not in _ops:
        return "no C++ compiler (set $CXX, or install g++)"
    return None


def _cached(stem: str, source: Path, flags: tuple[str, ...]) -> Path:
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    return user_cache_dir("kernels") / build_tag() / f"{stem}-{digest}.so"


def library_path() -> Path:
    """Where the built kernel for this source, these flags and this machine lives."""
    return _cached("gemv", SOURCE, FLAGS)


def ops_library_path() -> Path:
    """Where the built operator library for its source, its flags, this torch and this machine lives."""
    return _cached("gemv_ops", OPS_SOURCE, OPS_FLAGS)


def _kernel_command(out: Path) -> list[str]:
    return [_compiler(), *FLAGS, str(SOURCE), "-o", str(out)]


def _ops_command(out: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return [_cxx_compiler(), *OPS_FLAGS, abi, f"-I{torch_dir / 'include'}", str(OPS_SOURCE), "-o", str(out),
            f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}"]


def _build(path: Path, source: Path, command) -> None:
    """Compile ``source`` with ``command(out)`` in a temporary folder, then write the library to ``path``
    atomically (a full disk is an ``EnvironmentFault``, an ``OSError``, and leaves nothing under the name)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        done = subprocess.run(command(out), capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"compiling {source.name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        atomic_write_bytes(path, out.read_bytes())


def _open(path: Path, source: Path, command) -> ctypes.CDLL:
    """The library at ``path``, built from ``source`` first if need be; a file that does not load is built again,
    once."""
    if not path.exists():
        _build(path, source, command)
    try:
        return ctypes.CDLL(str(path))
    except OSError:  # a damaged or foreign file under our name
        path.unlink(missing_ok=True)
        _build(path, source, command)
        return ctypes.CDLL(str(path))


def _load_ops() -> ctypes.CDLL:
    """The operator library, loaded (its operators registered, with their shapes for tracing) once per process."""
    if "lib" not in _ops:
        _ops["lib"] = _open(ops_library_path(), OPS_SOURCE, _ops_command)
        _ops["lib"].lmforge_gemv_bind.argtypes = [ctypes.c_void_p] * 3
        for name, dtype in (("int8_gemv", torch.float32), ("bf16_gemv", torch.bfloat16), ("f32_gemv", torch.float32)):
            torch.library.register_fake(f"lmforge::{name}", _fake(dtype), lib=_LIB)
        int8_fake = _fake(torch.float32)  # int8_gemv_n's outputs are int8_gemv's, one per weight (fp32 for any x)
        torch.library.register_fake("lmforge::int8_gemv_n", lib=_LIB)(
            lambda x, qweights, scales: [int8_fake(x, q) for q in qweights])
    return _ops["lib"]


def _fake(dtype: torch.dtype):
    return lambda x, weight, *rest: x.new_empty(*x.shape[:-1], weight.shape[0], dtype=dtype)


def _load() -> ctypes.CDLL:
    """The kernels, handed to the operators."""
    lib = _open(library_path(), SOURCE, _kernel_command)
    ops = _load_ops()
    ops.lmforge_gemv_bind(*(ctypes.cast(getattr(lib, f"lmforge_{name}"), ctypes.c_void_p)
                            for name in ("int8_gemv_n", "bf16_gemv", "f32_gemv")))
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
    """Forget this process's answer, so that the next call looks (and builds) again: for tests. (The operator
    library stays: its operators are registered for the life of the process.)"""
    _state.clear()


# Calls go straight to the C++ operators: a decode step makes ~70 of them, and Python between the caller and the
# kernel cost about as much as a one-row product (gemv_ops.cpp).
def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ (qweight int8 (out, in) * scales fp32 (out,)[:, None])^T -> (..., out) fp32, with
    each row of ``x`` rounded to int8 (module docstring). Call only when :func:`available`."""
    return torch.ops.lmforge.int8_gemv.default(x, qweight, scales)


def int8_gemv_n(x: torch.Tensor, qweights: list[torch.Tensor], scales: list[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`int8_gemv` of one ``x`` by several weights (an attention's q, k and v), with ``x`` rounded once and
    one pass of the threads over all their rows. Call only when :func:`available`."""
    return torch.ops.lmforge.int8_gemv_n.default(x, qweights, scales)


def bf16_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) bf16 @ weight bf16 (out, in)^T + bias bf16 (out,) -> (..., out) bf16, summed in fp32 and
    rounded once (module docstring). Call only when :func:`available`."""
    return torch.ops.lmforge.bf16_gemv.default(x, weight, bias)


def f32_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) fp32 @ weight fp32 (out, in)^T + bias fp32 (out,) -> (..., out) fp32 (module docstring). Call
    only when :func:`available`."""
    return torch.ops.lmforge.f32_gemv.default(x, weight, bias)


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
