"""The decoding kernels (lmforge/nn/kernels/gemv.c). int8: exact against torch's integer arithmetic, within its
activation rounding of the dequantised reference. bf16: the fp32 sum of the widened weights, rounded once. Both
chosen only for few rows, and built, cached and rebuilt safely."""

from __future__ import annotations

import os
import platform
import shutil
import sys

import pytest
import torch

from lmforge.nn import gemv, linear, weight_only
from lmforge.nn.weight_only import WeightOnlyLinear, quantize_int8


def _kernel_here() -> bool:
    """The kernel builds wherever its conditions hold (asserted), so these tests check it on every such machine
    (CI's included) and check the fallback elsewhere."""
    can = (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
           and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
           and bool(os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc"))
           and bool(os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++"))
           and os.environ.get(gemv.ENV) != "off")
    assert gemv.available() == can, gemv.unavailable_reason()
    return can


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache, and this process's answer forgotten before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gemv.reset()
    yield tmp_path
    gemv.reset()


def _by_hand(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float64: each row of x rounded to int8 with scale max|x|/127, exact dot
    products, then both scales."""
    xs = x.abs().amax(dim=1, keepdim=True) / 127  # (m, 1), in fp32 as the kernel computes it
    xq = torch.round(x / xs).double()  # (m, in)
    return (xq @ q.double().T) * xs.double() * s.double()  # (m, out)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("n_in", [96, 70])  # 70: two 32-byte blocks and a tail of 6
def test_kernel_equals_integer_arithmetic_by_hand(rows, n_in):
    if not _kernel_here():
        return
    torch.manual_seed(0)
    q, s = quantize_int8(torch.randn(33, n_in))
    x = torch.randn(rows, n_in)
    y = gemv.int8_gemv(x, q, s)
    assert y.shape == (rows, 33) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _by_hand(x, q, s), rtol=1e-6, atol=1e-6)


# Rounding Gaussian activations to 8 bits per row costs ~0.5% of a product's norm; 2% bounds it, while a wrong
# scale, sign or transposed weight is off by ~100%.
def test_kernel_is_within_its_activation_rounding_of_the_dequantised_reference():
    if not _kernel_here():
        return
    torch.manual_seed(0)
    layer = torch.nn.Linear(768, 300)
    q = WeightOnlyLinear.from_linear(layer, "int8")
    x = torch.randn(1, 1, 768)  # (B, T, in): one decoding row
    ref = torch.nn.functional.linear(x, q.dequantized(), layer.bias)
    for dtype in (torch.float32, torch.bfloat16):
        y = q(x.to(dtype))
        assert y.dtype == dtype and y.shape == (1, 1, 300)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 0.02 + (0.01 if dtype == torch.bfloat16 else 0)


def test_nan_and_zero_rows_come_out_as_a_float_matmul_would():
    if not _kernel_here():
        return
    q, s = quantize_int8(torch.randn(8, 70))
    x = torch.zeros(3, 70)
    x[1, 5] = float("nan")  # within the 8-wide vector loops
    x[2, 68] = -float("inf")  # in the scalar tail (70 = 8 * 8 + 6)
    y = gemv.int8_gemv(x, q, s)
    assert torch.equal(y[0], torch.zeros(8)) and bool(y[1:].isnan().all())


def test_few_rows_take_the_kernel_and_more_take_fbgemm():
    """int8 layers send decoding's one or two rows to this kernel and larger batches to fbgemm (faster there)."""
    kernel = _kernel_here()
    torch.manual_seed(0)
    q, s = quantize_int8(torch.randn(40, 96))
    packed = weight_only._packed_int8(q, s)
    for rows in (1, 2, 3, 8):
        x = torch.randn(rows, 96)
        got = weight_only.int8_dynamic_linear(x, q, s)
        if kernel and rows <= gemv.MAX_ROWS:
            assert torch.equal(got, gemv.int8_gemv(x, q, s))
        else:
            assert torch.equal(got, weight_only._int8_dynamic(x, packed))


def test_several_weights_of_one_input_in_one_call_equal_one_call_each():
    """int8_gemv_n (an attention's q, k and v): x rounded once, the same numbers as separate calls; and an attention
    with int8 projections takes it for decoding's rows, in eager mode and in a compiled graph."""
    if not _kernel_here():
        return
    torch.manual_seed(0)
    weights = [quantize_int8(torch.randn(n, 70)) for n in (33, 1, 64)]  # 70 inputs: a tail of 6
    for rows in (1, 2):
        x = torch.randn(rows, 70)
        got = gemv.int8_gemv_n(x, [q for q, _ in weights], [s for _, s in weights])
        for y, (q, s) in zip(got, weights):
            assert torch.equal(y, gemv.int8_gemv(x, q, s))
    layers = [WeightOnlyLinear.from_linear(torch.nn.Linear(70, n), "int8") for n in (33, 64)]
    x = torch.randn(1, 1, 70)
    assert all(torch.equal(y, m(x)) for y, m in zip(weight_only.int8_projections(x, layers), layers))
    assert weight_only.int8_projections(torch.randn(1, 3, 70), layers) is None  # three rows: fbgemm's, one by one
    graph = _traced(lambda x: weight_only.int8_projections(x, layers)[1], x)
    assert "lmforge.int8_gemv_n" in graph


def test_built_into_the_cache_and_a_damaged_file_is_rebuilt(fresh_cache):
    path = gemv.library_path()
    assert path.is_relative_to(fresh_cache / "lmforge" / "kernels")
    # A damaged file under the kernel's name (as a crash or a full disk could leave; damaged before this process
    # maps it: a mapped library is never written in place, builds are renamed over it) is built again.
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    if not _kernel_here():
        return
    assert path.read_bytes()[:4] == b"\x7fELF"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
    q, s = quantize_int8(torch.randn(4, 32))
    x = torch.randn(1, 32)
    torch.testing.assert_close(gemv.int8_gemv(x, q, s).double(), _by_hand(x, q, s), rtol=1e-6, atol=1e-6)


def test_switched_off_or_without_a_compiler_int8_layers_use_fbgemm(fresh_cache, monkeypatch):
    torch.manual_seed(0)
    q, s = quantize_int8(torch.randn(16, 64))
    x = torch.randn(1, 64)
    fbgemm = weight_only._int8_dynamic(x, weight_only._packed_int8(q, s))
    monkeypatch.setenv(gemv.ENV, "off")
    assert not gemv.available() and gemv.unavailable_reason() == f"{gemv.ENV}=off"
    assert torch.equal(weight_only.int8_dynamic_linear(x, q, s), fbgemm)
    monkeypatch.delenv(gemv.ENV)
    monkeypatch.setenv("CC", str(fresh_cache / "no-such-compiler"))
    gemv.reset()
    assert not gemv.available() and gemv.unavailable_reason()
    assert not [p for p in fresh_cache.rglob("*") if p.is_file()]  # nothing half-built left behind
    assert torch.equal(weight_only.int8_dynamic_linear(x, q, s), fbgemm)


def test_empty_shapes_give_empty_or_zero_outputs():
    if not _kernel_here():
        return
    q, s = quantize_int8(torch.randn(5, 32))
    assert gemv.int8_gemv(torch.randn(0, 32), q, s).shape == (0, 5)
    empty_q, empty_s = torch.zeros(5, 0, dtype=torch.int8), torch.ones(5)
    assert torch.equal(gemv.int8_gemv(torch.randn(1, 0), empty_q, empty_s), torch.zeros(1, 5))


# ------------------------------------------------------------------------------------------- bf16
def _traced(fn, x) -> str:
    """The code of the graph ``torch.compile(fn, fullgraph=True)`` traces for ``x`` (with gradients off)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    with torch.no_grad():
        torch.compile(fn, fullgraph=True, backend=backend)(x)
    return graphs[0]


def _float64_sums(x, w, b=None):
    """x @ w^T + b in float64: what the float kernels' fp32 sums approximate (before bf16's output rounding)."""
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


@pytest.mark.parametrize("rows", [1, 2, 3])  # 3: a pair of rows, then one
@pytest.mark.parametrize("n_in", [96, 70])  # 70: four 16-wide blocks and a tail of 6
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_kernel_is_the_sum_rounded_once_to_bf16(rows, n_in, bias):
    if not _kernel_here():
        return
    torch.manual_seed(0)
    x, w = torch.randn(rows, n_in).bfloat16(), torch.randn(37, n_in).bfloat16()
    b = torch.randn(37).bfloat16() if bias else None
    y = gemv.bf16_gemv(x, w, b)
    assert y.shape == (rows, 37) and y.dtype == torch.bfloat16
    exact = _float64_sums(x, w, b)
    # The output is the sum rounded to bf16 (half an ulp of error), from an fp32 sum whose own error is below
    # n * 2^-24 of the terms' magnitudes (1e-5 here): a wrong widening, row or bias is off by whole units.
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp(min=1e-30))) - 7)  # bf16 keeps 8 significant bits
    magnitude = _float64_sums(x.abs(), w.abs(), None if b is None else b.abs())
    assert bool(((y.double() - exact).abs() <= 0.5 * ulp + 1e-5 * magnitude).all())


def test_bf16_kernel_nan_and_empty_shapes():
    if not _kernel_here():
        return
    w = torch.randn(8, 64).bfloat16()
    x = torch.zeros(2, 64).bfloat16()
    x[1, 5] = float("nan")
    y = gemv.bf16_gemv(x, w)
    assert torch.equal(y[0].float(), torch.zeros(8)) and bool(y[1].isnan().all())
    assert gemv.bf16_gemv(torch.randn(0, 64).bfloat16(), w).shape == (0, 8)
    empty = gemv.bf16_gemv(torch.randn(1, 0).bfloat16(), torch.zeros(8, 0).bfloat16(), torch.ones(8).bfloat16())
    assert torch.equal(empty.float(), torch.ones(1, 8))


def test_linear_sends_bf16_rows_without_gradients_to_the_kernel():
    """lmforge.nn.linear.linear: bf16 rows under no_grad go to the kernel (one or two, or any number where oneDNN
    emulates bf16); more rows on a native-bf16 CPU, fp32, or a pass that records gradients stay with F.linear (the
    kernel has no backward)."""
    kernel = _kernel_here()
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 40).bfloat16()
    w, b = layer.weight, layer.bias
    for rows in (1, 2, 3):
        x = torch.randn(1, rows, 96).bfloat16()  # (B, T, in)
        with torch.no_grad():
            got = linear.linear(x, w, b)
            if kernel and rows <= gemv.bf16_max_rows():  # 2, or any number without native bf16
                assert torch.equal(got, gemv.bf16_gemv(x, w, b))
            else:
                assert torch.equal(got, torch.nn.functional.linear(x, w, b))
            assert got.shape == (1, rows, 40)
    x = torch.randn(1, 96).bfloat16()
    y = linear.linear(x, w, b)  # gradients on: F.linear, with its backward
    y.float().sum().backward()
    assert w.grad is not None and torch.equal(y, torch.nn.functional.linear(x, w, b))


def test_bf16_rows_compile_as_one_opaque_operator_and_switched_off_use_f_linear(fresh_cache, monkeypatch):
    kernel = _kernel_here()
    torch.manual_seed(0)
    w, b, x = torch.randn(24, 64).bfloat16(), torch.randn(24).bfloat16(), torch.randn(1, 64).bfloat16()
    graph = _traced(lambda x: linear.linear(x, w, b), x)
    assert ("lmforge.bf16_gemv" in graph) == kernel and ("linear" in graph) != kernel
    with torch.no_grad():
        compiled = torch.compile(lambda x: linear.linear(x, w, b), fullgraph=True, backend="aot_eager")
        expected = gemv.bf16_gemv(x, w, b) if kernel else torch.nn.functional.linear(x, w, b)
        assert torch.equal(compiled(x), expected)
        monkeypatch.setenv(gemv.ENV, "off")
        gemv.reset()
        assert torch.equal(linear.linear(x, w, b), torch.nn.functional.linear(x, w, b))
        graph = _traced(lambda x: linear.linear(x, w, b) * 2, x)
        assert "lmforge" not in graph


def test_the_operators_shapes_for_tracing_match_their_outputs():
    """What a compiled graph assumes of each operator's output (its fake) is what the kernel returns: int8's fp32
    for bf16 activations too. (int8_gemv_n's once took x's dtype: a compiled bf16 step read its fp32 q, k and v as
    bf16, and decoded GPT-2's shape to token 0 from the second token on.)"""
    if not _kernel_here():
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    q, s = quantize_int8(torch.randn(24, 64))
    w = torch.randn(24, 64)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 2, 64, dtype=dtype)
        calls = {"int8_gemv": lambda x, q, s, w: gemv.int8_gemv(x, q, s),
                 "int8_gemv_n": lambda x, q, s, w: gemv.int8_gemv_n(x, [q, q[:8]], [s, s[:8]]),
                 "float_gemv": lambda x, q, s, w: (gemv.bf16_gemv if dtype == torch.bfloat16 else gemv.f32_gemv)(
                     x, w.to(dtype))}
        for name, call in calls.items():
            real = call(x, q, s, w)
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake = call(*(mode.from_tensor(t) for t in (x, q, s, w)))
            real, fake = (list(r) if isinstance(r, (list, tuple)) else [r] for r in (real, fake))
            assert [(t.dtype, t.shape) for t in fake] == [(t.dtype, t.shape) for t in real], (name, dtype)


# ------------------------------------------------------------------------------------------- fp32
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("n_in", [96, 70])  # 70: eight 8-wide blocks and a tail of 6
def test_f32_kernel_equals_the_sum_by_hand(rows, n_in):
    if not _kernel_here():
        return
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, n_in), torch.randn(37, n_in), torch.randn(37)  # 37: nine blocks of 4 and one row
    for bias in (None, b):
        y = gemv.f32_gemv(x, w, bias)
        assert y.shape == (rows, 37) and y.dtype == torch.float32
        exact = _float64_sums(x, w, bias)  # float64 sums
        magnitude = _float64_sums(x.abs(), w.abs(), None if bias is None else bias.abs())
        assert bool(((y.double() - exact).abs() <= 1e-5 * magnitude).all())  # fp32 rounding of the sums


def test_linear_sends_few_fp32_rows_without_gradients_to_the_kernel_eagerly():
    """fp32: up to F32_MAX_ROWS rows under no_grad go to the kernel outside torch.compile; more rows, a pass that
    records gradients, or a compiled graph keep F.linear."""
    kernel = _kernel_here()
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 40)
    w, b = layer.weight, layer.bias
    for rows in (1, 2, gemv.F32_MAX_ROWS, gemv.F32_MAX_ROWS + 1):
        x = torch.randn(rows, 96)
        with torch.no_grad():
            got = linear.linear(x, w, b)
            want = gemv.f32_gemv(x, w, b) if kernel and rows <= gemv.F32_MAX_ROWS else torch.nn.functional.linear(x, w, b)
            assert torch.equal(got, want)
    x = torch.randn(1, 96)
    y = linear.linear(x, w, b)  # gradients on: F.linear, with its backward
    y.sum().backward()
    assert w.grad is not None and torch.equal(y, torch.nn.functional.linear(x, w, b))
    graph = _traced(lambda x: linear.linear(x, w, b), x)
    assert "lmforge" not in graph and "linear" in graph
