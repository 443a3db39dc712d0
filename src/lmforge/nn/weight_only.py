"""Weight-only quantised linear layers for inference: int8 per output channel, int4 per group.

Decoding one token multiplies a few rows by every weight matrix, so a step is bound by how many bytes of
weights are read. Storing them in 8 or 4 bits reads 4x or 8x fewer bytes than fp32; the activations stay
in fp32 or bf16 (weight-only quantisation, as in LLM.int8's weight path, GPTQ's storage and llama.cpp's Q8_0/Q4).

    int8   q = round(W / s) in [-127, 127],  s = max|W[o, :]| / 127          one scale per output row
    int4   q = round(W / s) in [-8, 7],      s = max|W[o, g]| / 7           one scale per row and group of
                                                                            ``group_size`` inputs; two
                                                                            nibbles per byte (q + 8)
    W ≈ q * s  (the dequantised weight);  y = x @ (q * s)^T + b

Kernels. On the CPU the layer calls PyTorch's own weight-only kernels (``torch._weight_int8pack_mm``;
``torch._weight_int4pack_mm_for_cpu`` on the tinygemm-packed int4 form), which read the narrow weights and
scale inside the matmul. Under ``torch.compile`` an int8 layer with bf16 activations is written as
``linear(x, q.to(bf16)) * s``, the pattern inductor's freezing keeps as an int8 constant and lowers to its own
weight-only int8 GEMM; other cases, and other devices, dequantise and call ``F.linear``. All equal
``x @ dequantised(W)^T`` to the rounding of the activation dtype. (Compiled decoding freezes the weights as
constants, so a compiled int4 or fp32-activation layer is folded into a full-precision constant: its tokens are
right, but it reads as many bytes as an unquantised one.)

Why not torchao. torchao (0.18 here) was tried first: its ``Int8WeightOnlyConfig`` with fp32 activations
was no faster than the fp32 matmul on this CPU, and its ``Int4WeightOnlyConfig`` has no CPU packing format
in this version (the plain format needs the ``mslk`` kernels, the tile-packed one CUDA). Its tensor
subclasses also do not store as plain safetensors. The two ATen kernels above, fed bf16 activations, were
clearly faster than both the fp32 and the bf16 dense matmul at decoding shapes in a quick check; with fp32
activations they were not faster than fp32 (they upcast the weights per call). So the fast setting is
``--quantize int8|int4`` with ``--dtype bf16``; fp32 activations give the same numbers, more slowly.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(64, 16)
    >>> q = WeightOnlyLinear.from_linear(layer, "int4", group_size=32)
    >>> q.qweight.shape, q.qweight.dtype, q.scales.shape        # two nibbles per byte, (out, in / group)
    (torch.Size([16, 32]), torch.uint8, torch.Size([16, 2]))
    >>> x = torch.randn(3, 64)                                   # (N, in)
    >>> ref = torch.nn.functional.linear(x, q.dequantized(), layer.bias)
    >>> bool(torch.allclose(q(x), ref, atol=1e-5))
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("int8", "int4")
DEFAULT_GROUP_SIZE = 32
_INT4_GROUPS = (32, 64, 128, 256)  # group sizes the CPU int4 kernel takes


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
        self._packed: tuple[tuple, tuple] | None = None  # (key, tinygemm int4 form), rebuilt when stale

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
        """tinygemm's packed weight and its (in/group, out', 2) scales-and-zeros, built once per weight.

        The kernel packs 16 output rows at a time, so a layer of another width (a vocabulary of 50,257) is
        padded with zero rows (nibble 8, scale 0) to out' = a multiple of 16 and the extra outputs dropped."""
        key = (self.qweight.data_ptr(), self.qweight._version)
        if self._packed is None or self._packed[0] != key:
            pad = -self.out_features % 16
            values = F.pad(unpack_int4(self.qweight).to(torch.int32), (0, 0, 0, pad), value=8)  # (O', in), 0..15
            scales = F.pad(self.scales, (0, 0, 0, pad))  # (O', G)
            # w = (nibble - 8) * scale + zero, with zero = 0
            sz = torch.stack((scales, torch.zeros_like(scales)), dim=-1).transpose(0, 1).contiguous()
            self._packed = (key, (torch._convert_weight_to_int4pack_for_cpu(values, 1), sz))
        return self._packed[1]

    def _cpu_kernel(self, x: torch.Tensor) -> bool:
        if x.device.type != "cpu" or torch.compiler.is_compiling() or x.dtype not in (torch.float32, torch.bfloat16):
            return False
        if self.mode == "int8":
            return hasattr(torch, "_weight_int8pack_mm")
        return hasattr(torch, "_weight_int4pack_mm_for_cpu") and self.group_size in _INT4_GROUPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (..., in) -> (..., out)
        bias = None if self.bias is None else self.bias.to(x.dtype)
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
            y = torch._weight_int4pack_mm_for_cpu(flat, packed, self.group_size, sz.to(x.dtype))
            y = y[:, :self.out_features]
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
        >>> bool(torch.allclose(q.project(h), h @ q.dequantized().T, atol=1e-4))     # (2, 50) logits
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
