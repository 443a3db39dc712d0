"""Weight-only quantised linear layers for inference: int8 per output channel, int4 per group.

Decoding one token multiplies a few rows by every weight matrix, so a step is bound by how many bytes of
weights are read. Storing them in 8 or 4 bits reads 4x or 8x fewer bytes than fp32; the activations stay
in fp32 or bf16 (weight-only quantisation, as in LLM.int8's weight path, GPTQ's storage and llama.cpp's Q8_0/Q4).

    int8   q = round(W / s) in [-127, 127],  s = max|W[o, :]| / 127          one scale per output row
    int4   q = round(W / s) in [-8, 7],      s = max|W[o, g]| / 7           one scale per row and group of
                                                                            ``group_size`` inputs; two
                                                                            nibbles per byte (q + 8)
    W ≈ q * s  (the dequantised weight);  y = x @ (q * s)^T + b

Kernels. On an x86 CPU an int8 layer rounds the *activations* to integers too, per call, and multiplies
integers, as CTranslate2's int8 and llama.cpp's Q8_0 do; it is 3-7x faster than any weight-only kernel here
(below). For one or two rows (decoding) it calls :mod:`lmforge.nn.gemv`, a small AVX2 kernel of ours
(8-bit activations, one scale per row; 1.4x fbgemm's speed at one row); for more rows, or where that kernel
cannot be built, fbgemm's int8 GEMM (``torch.ops.quantized.linear_dynamic``, the kernel of PyTorch's dynamic
quantisation) on the stored per-row weights, packed once per weight, which rounds the activations to 7 bits
(one scale and zero point over the input, 128 levels: fbgemm's AVX2 kernel would overflow its 16-bit pair
sums at 8 bits). The rounding adds about 0.5% (8 bits) or 1.5% (7 bits, relative norm) of error to each
product, well inside the 1% perplexity bound the quality tests hold int8 to (the activation rounding is part
of what they measure). :data:`INT8_DYNAMIC_ACTIVATIONS` = False gives exact
weight-only int8 instead: PyTorch's ``torch._weight_int8pack_mm``, which reads the narrow weights and scales
inside the matmul. int4 calls ``torch._weight_int4pack_mm_for_cpu`` on the tinygemm-packed form, always with
bf16 activations (its fp32 path was 7-25x slower than fp32 ``F.linear`` at decoding shapes, its bf16 path 1.5-2x
faster; bf16's rounding of the activations is small beside 16 weight levels). Under
``torch.compile`` the integer matmul is one opaque op: ``lmforge::int8_gemv``, the C++ operator of
:mod:`lmforge.nn.gemv`, for decoding's rows (``int8_gemv_n`` for an attention's q, k and v together:
:func:`int8_projections`), else ``lmforge::int8_dynamic_linear``, which chooses per call; a weight-only int8 layer
with bf16 activations is written as ``linear(x, q.to(bf16)) * s``, the pattern inductor's freezing keeps as an
int8 constant and lowers to its own weight-only int8 GEMM; other cases, and other devices, dequantise and call
``F.linear``. All equal ``x @ dequantised(W)^T`` to the rounding of the activation dtype (and, with dynamic
activations, of the 7-bit activations). (Compiled decoding freezes the weights as constants: a compiled int4 layer
traces its tinygemm packing, which freezing folds into constants once, and calls the int4 matmul (inductor's int4
template, or ATen's kernel); a weight-only fp32-activation int8 layer is folded into a full-precision constant: its
tokens are right, but it reads as many bytes as an unquantised one; an fbgemm int8 step is compiled unfrozen, see
:mod:`lmforge.generation.compiled`.) An int4 step was once compiled unfrozen wherever its activations were bf16
(as a bf16 model's step is, for :mod:`lmforge.nn.gemv`), and repacked every weight at every token: GPT-2's shape
decoded 15.4 tokens/s at batch 1 against 65.6 eagerly (Intel Xeon with AVX-512 BF16, 2 cores, 2026-11-28, an
engines run at 6192a36); frozen, 122-135 in alternating processes (docs/lab/performance.md has the engines run since).

Measured on the 12-layer GPT-2 shape's matmuls of one decode step, 2 threads on an AVX2 CPU (AMD EPYC, no
native bf16), 2026-11-27: fp32 ``F.linear`` 41 ms at 1 row and 82 ms at 8 rows; weight-only int8 with bf16
activations 14 and 35 ms; fbgemm's dynamic int8 10 and 12 ms (:mod:`lmforge.nn.gemv` has its own).

Why not torchao. torchao (0.18 here) was tried first: its ``Int8WeightOnlyConfig`` with fp32 activations
was no faster than the fp32 matmul on this CPU, its ``Int8DynamicActivationInt8WeightConfig`` was 3-6x
*slower* than fp32 (measured 2026-11-27), and its ``Int4WeightOnlyConfig`` has no CPU packing format in this
version (the plain format needs the ``mslk`` kernels, the tile-packed one CUDA). Its tensor subclasses also
do not store as plain safetensors.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(64, 16)
    >>> q = WeightOnlyLinear.from_linear(layer, "int4", group_size=32)
    >>> q.qweight.shape, q.qweight.dtype, q.scales.shape        # two nibbles per byte, (out, in / group)
    (torch.Size([16, 32]), torch.uint8, torch.Size([16, 2]))
    >>> x = torch.randn(3, 64)                                   # (N, in)
    >>> ref = torch.nn.functional.linear(x, q.dequantized(), layer.bias)
    >>> bool((q(x) - ref).norm() / ref.norm() < 0.01)            # the CPU kernel's bf16 activations
    True
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from lmforge.nn import gemv

MODES = ("int8", "int4")
DEFAULT_GROUP_SIZE = 32
_INT4_GROUPS = (32, 64, 128, 256)  # group sizes the CPU int4 kernel takes
# int8 layers on an x86 CPU round their activations too, for fbgemm's int8 GEMM (see the module docstring).
INT8_DYNAMIC_ACTIVATIONS = True
_FBGEMM_ENGINES = ("x86", "fbgemm")  # PyTorch's quantized engines whose linear_dynamic is fbgemm's
# qweight -> ((its and the scales' storage and version), fbgemm's packed weight): packed once per weight (again after
# an in-place write or new storage) and shared by the layer's eager calls and a compiled graph's op; weakly keyed, so
# it goes with the weight.
_PACKED_INT8: WeakIdKeyDictionary = WeakIdKeyDictionary()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W (out, in) -> (q int8 (out, in), s fp32 (out,)) with W ≈ q * s[:, None] (symmetric, per row)."""
    w = weight.detach().float()
    s = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # (out,)
    q = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
    return q, s


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W (out, in) -> (packed uint8 (out, in/2), s fp32 (out, in/group)) with W ≈ (nibble - 8) * s per group.

    Column 2j sits in the low nibble of byte j, column 2j+1 in its high nibble."""
    out, inp = weight.shape
    w = weight.detach().float().view(out, inp // group_size, group_size)  # (O, G, gs)
    s = (w.abs().amax(dim=-1) / 7).clamp(min=1e-12)  # (O, G)
    u = (torch.round(w / s[..., None]).clamp(-8, 7) + 8).to(torch.uint8).view(out, inp)  # 0..15
    return u[:, 0::2] | (u[:, 1::2] << 4), s


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 (out, in/2) -> nibbles as uint8 (out, in), values 0..15."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _fbgemm_int8_ready() -> bool:
    return torch.backends.quantized.engine in _FBGEMM_ENGINES and hasattr(torch.ops.quantized, "linear_dynamic")


def uses_fbgemm_int8(model: nn.Module, device: torch.device) -> bool:
    """Whether ``model`` on ``device`` has int8 layers that run fbgemm's int8 GEMM (see the module docstring)."""
    return (device.type == "cpu" and INT8_DYNAMIC_ACTIVATIONS and _fbgemm_int8_ready()
            and has_layers(model, "int8"))


def has_layers(model: nn.Module, mode: str) -> bool:
    """Whether ``model`` has :class:`WeightOnlyLinear` layers of ``mode`` ("int8" or "int4"). A compiled step
    must fold int4 layers' tinygemm packing into constants (it freezes them:
    :func:`lmforge.generation.compiled.opaque_matmuls`)."""
    return any(isinstance(m, WeightOnlyLinear) and m.mode == mode for m in model.modules())


def _packed_int8(qweight: torch.Tensor, scales: torch.Tensor):
    """fbgemm's packed form of ``qweight`` (int8 (out, in), per-row fp32 ``scales``), built once per weight."""
    key = (qweight.data_ptr(), qweight._version, scales.data_ptr(), scales._version)
    entry = _PACKED_INT8.get(qweight)
    if entry is None or entry[0] != key:
        entry = _PACKED_INT8[qweight] = (key, _pack_int8(qweight, scales))
    return entry[1]


def _pack_int8(qweight: torch.Tensor, scales: torch.Tensor):
    zeros = torch.zeros(qweight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated as a user API; the kernel takes one
        warnings.simplefilter("ignore", UserWarning)
        per_row = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(per_row, None)


def _int8_dynamic(x: torch.Tensor, packed) -> torch.Tensor:
    """x (..., in) -> (..., out) through fbgemm, which takes fp32 and quantises it itself."""
    reduce_range = True  # 7-bit activations: AVX2's u8 x s8 pair sums saturate int16 at 8 bits
    if x.dtype == torch.float32:
        return torch.ops.quantized.linear_dynamic(x, packed, reduce_range)
    return torch.ops.quantized.linear_dynamic(x.float(), packed, reduce_range).to(x.dtype)


def int8_dynamic_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ (qweight * scales[:, None])^T with x rounded to integers per call, in x's dtype: to 8 bits
    per row by :mod:`lmforge.nn.gemv` for up to its ``MAX_ROWS`` rows (decoding), else to 7 bits by fbgemm.

    The kernel of the op ``torch.ops.lmforge.int8_dynamic_linear``, which a compiled graph calls as one opaque
    node; layers call the kernel directly when eager.

    Example:
        >>> w = torch.randn(16, 64)
        >>> q, s = quantize_int8(w)
        >>> x = torch.randn(3, 64)
        >>> y = torch.ops.lmforge.int8_dynamic_linear(x, q, s)      # (3, 16)
        >>> ref = x @ (q.float() * s[:, None]).T
        >>> bool((y - ref).norm() / ref.norm() < 0.05)               # the activations' 7-bit rounding
        True
    """
    if _kernel_rows(x):
        return gemv.int8_gemv(x, qweight, scales).to(x.dtype)
    return _int8_dynamic(x, _packed_int8(qweight, scales))


def _kernel_rows(x: torch.Tensor) -> bool:
    """Whether ``x`` has few enough rows for :mod:`lmforge.nn.gemv`'s int8 kernel (decoding's) and the kernel is
    there: built if need be, or, under ``torch.compile`` (where nothing is built), built already."""
    if x.numel() > gemv.MAX_ROWS * x.shape[-1]:
        return False
    return gemv.ready() if torch.compiler.is_compiling() else gemv.available()


def int8_projections(x: torch.Tensor, layers) -> list[torch.Tensor] | None:
    """``[layer(x) for layer in layers]`` in one kernel call, with ``x`` rounded once, when every layer is int8 and
    takes decoding's few-row kernel (an attention's q, k and v); None otherwise.

    Example:
        >>> layers = [WeightOnlyLinear.from_linear(torch.nn.Linear(64, n), "int8") for n in (16, 8)]
        >>> x = torch.randn(1, 1, 64)                                 # (B, T, in): one decoding row
        >>> ys = int8_projections(x, layers) or [layer(x) for layer in layers]
        >>> [tuple(y.shape) for y in ys], all(torch.equal(y, layer(x)) for y, layer in zip(ys, layers))
        ([(1, 1, 16), (1, 1, 8)], True)
    """
    if not _kernel_rows(x) or not all(
            type(m) is WeightOnlyLinear and m.dynamic_activations(x) and not (m._forward_hooks or m._forward_pre_hooks)
            for m in layers):
        return None
    ys = gemv.int8_gemv_n(x, [m.qweight for m in layers], [m.scales for m in layers])
    return [y.to(x.dtype) if m.bias is None else y.to(x.dtype) + m.bias.to(x.dtype) for y, m in zip(ys, layers)]


gemv.register_linear_op("int8_dynamic_linear", "Tensor x, Tensor qweight, Tensor scales", int8_dynamic_linear)


class WeightOnlyLinear(nn.Module):
    """A linear layer whose weight is stored as int8 (per row) or int4 (per group), computed in ``x``'s dtype.

    Buffers (saved in a model folder): ``qweight`` (int8 (out, in) or uint8 (out, in/2)), ``scales`` fp32
    ((out,) or (out, in/group)) and ``bias`` (out,) in the model's dtype, when the layer has one.
    """

    def __init__(self, in_features: int, out_features: int, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                 bias: bool = True):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"weight-only mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "int4" and in_features % group_size:
            raise ValueError(f"int4 needs in_features ({in_features}) divisible by group_size ({group_size})")
        self.in_features, self.out_features, self.mode, self.group_size = in_features, out_features, mode, group_size
        if mode == "int8":
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
            self.register_buffer("scales", torch.ones(out_features))
        else:
            self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(out_features, in_features // group_size))
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        self._packed: tuple[tuple, object] | None = None  # int4: (key, packed weight), rebuilt when stale

    @classmethod
    def from_linear(cls, layer: nn.Linear, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> WeightOnlyLinear:
        """The quantised twin of ``layer`` (its weight rounded as in the module docstring, its bias kept)."""
        q = cls(layer.in_features, layer.out_features, mode, group_size, bias=layer.bias is not None)
        qweight, scales = quantize_int8(layer.weight) if mode == "int8" else quantize_int4(layer.weight, group_size)
        q.qweight.copy_(qweight)
        q.scales.copy_(scales)
        if layer.bias is not None:
            q.bias = nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
        return q.to(layer.weight.device)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the layer computes with, W ≈ q * s, as (out, in) in ``dtype``."""
        if self.mode == "int8":
            return (self.qweight.float() * self.scales[:, None]).to(dtype)
        q = unpack_int4(self.qweight).float() - 8  # (O, in)
        w = q.view(self.out_features, -1, self.group_size) * self.scales[..., None]  # (O, G, gs)
        return w.view(self.out_features, self.in_features).to(dtype)

    def _int4_packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """tinygemm's packed weight and its scales-and-zeros (:meth:`_int4_pack`), built once per weight (traced as
        it is under ``torch.compile``, which cannot key a cache on storage)."""
        if torch.compiler.is_compiling():
            return self._int4_pack()
        key = (self.qweight.data_ptr(), self.qweight._version)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, self._int4_pack())
        return self._packed[1]

    def _int4_pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """tinygemm's packed weight and its (in/group, out', 2) scales-and-zeros. Under ``torch.compile`` it is traced
        as it is: a compiled step freezes its weights, so the packing is folded into constants once.

        The kernel packs 16 output rows at a time, so a layer of another width (a vocabulary of 50,257) is
        padded with zero rows (nibble 8, scale 0) to out' = a multiple of 16 and the extra outputs dropped."""
        pad = -self.out_features % 16
        values = F.pad(unpack_int4(self.qweight).to(torch.int32), (0, 0, 0, pad), value=8)  # (O', in), 0..15
        scales = F.pad(self.scales, (0, 0, 0, pad))  # (O', G)
        # w = (nibble - 8) * scale + zero, with zero = 0: (O', G, 2) -> (G, O', 2), one op from the weight (inductor's
        # freezing folds it; a zeros_like beside it was left unfolded, which its int4 lowering cannot take)
        sz = F.pad(scales.unsqueeze(-1), (0, 1)).transpose(0, 1).contiguous()
        return torch._convert_weight_to_int4pack_for_cpu(values, 1), sz

    def _cpu_kernel(self, x: torch.Tensor) -> bool:
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
            return False
        if self.mode == "int8":
            return not torch.compiler.is_compiling() and hasattr(torch, "_weight_int8pack_mm")
        return hasattr(torch, "_weight_int4pack_mm_for_cpu") and self.group_size in _INT4_GROUPS

    def dynamic_activations(self, x: torch.Tensor) -> bool:
        """Whether this call rounds ``x`` to integers too (int8 on an x86 CPU: :data:`INT8_DYNAMIC_ACTIVATIONS`)."""
        return (self.mode == "int8" and INT8_DYNAMIC_ACTIVATIONS and x.device.type == "cpu"
                and x.dtype in (torch.float32, torch.bfloat16) and _fbgemm_int8_ready())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (..., in) -> (..., out)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.dynamic_activations(x):
            if not torch.compiler.is_compiling():
                y = int8_dynamic_linear(x, self.qweight, self.scales)
            elif _kernel_rows(x):  # decoding's rows: the C++ operator
                y = gemv.int8_gemv(x, self.qweight, self.scales).to(x.dtype)
            else:  # the op whose Python kernel chooses per call
                y = torch.ops.lmforge.int8_dynamic_linear(x, self.qweight, self.scales)
            return y if bias is None else y + bias
        if self.mode == "int8" and x.dtype == torch.bfloat16 and torch.compiler.is_compiling():
            # Inductor's weight-only pattern (linear of the int8 weight cast to bf16, times the scales): it keeps
            # the int8 weight as the frozen constant and calls its int8 GEMM, instead of folding a bf16 copy.
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)
            return y if bias is None else y + bias
        if not self._cpu_kernel(x):
            return F.linear(x, self.dequantized(x.dtype), bias)
        flat = x.reshape(-1, self.in_features).contiguous()  # (N, in)
        if self.mode == "int8":
            y = torch._weight_int8pack_mm(flat, self.qweight, self.scales.to(x.dtype))
        else:
            packed, sz = self._int4_packed()
            # in bf16 even for fp32 activations: the kernel's fp32 path is 7-25x slower than its bf16 one (and
            # than fp32 F.linear) here, and bf16's rounding of x is small beside the weights' 16 levels
            y = torch._weight_int4pack_mm_for_cpu(flat.bfloat16(), packed, self.group_size, sz.bfloat16())
            y = y[:, :self.out_features].to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}{group}"


class WeightOnlyEmbedding(WeightOnlyLinear):
    """A token-embedding table stored as :class:`WeightOnlyLinear` stores a weight, one (quantised) row per
    token: ``forward(ids)`` looks rows up and dequantises them; ``project(h)`` multiplies by the table, as an
    LM head tied to it does (logits = h @ table^T).

    A tied LM head is the largest matrix a small decoder reads per token (GPT-2's 50,257 x 768 is 31% of its
    weights), so leaving it in full precision would cap what weight-only quantisation saves.

    Example:
        >>> emb = torch.nn.Embedding(50, 64)
        >>> q = WeightOnlyEmbedding.from_embedding(emb, "int8")
        >>> ids = torch.tensor([[3, 7]])
        >>> rows = q(ids)                                            # (1, 2, 64)
        >>> bool(torch.allclose(rows, q.dequantized()[ids], atol=1e-6)), rows.dtype
        (True, torch.float32)
        >>> h = torch.randn(2, 64)
        >>> ref = h @ q.dequantized().T                              # (2, 50) logits
        >>> bool((q.project(h) - ref).norm() / ref.norm() < 0.05)  # int8 rounds h to 7 bits on an x86 CPU
        True
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str, group_size: int = DEFAULT_GROUP_SIZE):
        super().__init__(embedding_dim, num_embeddings, mode, group_size, bias=False)
        # Follows the model's .to(dtype): the dtype looked-up rows come out in (not saved).
        self.register_buffer("dtype_probe", torch.zeros(()), persistent=False)

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> WeightOnlyEmbedding:
        """The quantised twin of ``emb`` (rows rounded as :class:`WeightOnlyLinear` rounds a weight's rows)."""
        q = cls(emb.num_embeddings, emb.embedding_dim, mode, group_size)
        qweight, scales = quantize_int8(emb.weight) if mode == "int8" else quantize_int4(emb.weight, group_size)
        q.qweight.copy_(qweight)
        q.scales.copy_(scales)
        return q.to(emb.weight.device)

    @property
    def num_embeddings(self) -> int:
        return self.out_features

    @property
    def embedding_dim(self) -> int:
        return self.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids (...) -> rows (..., E)
        dtype = self.dtype_probe.dtype
        if self.mode == "int8":
            return self.qweight[ids].to(dtype) * self.scales[ids].unsqueeze(-1).to(dtype)
        q = unpack_int4(self.qweight[ids]).float() - 8  # (..., E)
        w = q.unflatten(-1, (-1, self.group_size)) * self.scales[ids].unsqueeze(-1)  # (..., G, gs)
        return w.flatten(-2).to(dtype)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., E) -> (..., V): h times the table's transpose, with the layer's kernels."""
        return super().forward(h)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode}{group}"
