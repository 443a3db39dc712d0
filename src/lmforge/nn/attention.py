"""Multi-head attention (Vaswani et al. 2017), self or cross, with GQA/MQA and a KV cache.

    Attention(Q, K, V) = softmax(Q K^T * scale + bias + mask) V

``n_kv_heads < n_heads`` gives grouped-query attention (GQA; MQA when 1): each group of query heads
shares one key/value head, which shrinks the KV cache. Position information that acts inside
attention arrives through :class:`AttentionContext`: RoPE's cos/sin, an additive bias (T5, ALiBi),
Shaw relative tables (owned by the layer, since Shaw learns them per layer) or DeBERTa's relative-position
table, which each layer projects into its content->position and position->content logit terms.
``attention="linformer"`` projects keys and values along the sequence first (:mod:`lmforge.nn.linformer`).

The fast path is ``F.scaled_dot_product_attention`` (fused kernels on CPU and GPU). Only Shaw's
relative *values* need the attention weights themselves, so that case runs the explicit softmax.

Projections are named ``q, k, v, o`` so PEFT methods can target them by name.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=100)
    >>> attn = Attention(cfg)
    >>> attn(torch.randn(2, 5, 32), AttentionContext(is_causal=True)).shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.dropout import dropout as apply_dropout
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.linear import apply_linear, cpu_kernel
from lmforge.nn.linformer import LinformerProjection
from lmforge.nn.positions.deberta import DisentangledBias
from lmforge.nn.positions.rope import apply_rotary
from lmforge.nn.positions.shaw_relative import ShawRelativePositions
from lmforge.nn.unpadding import Unpadded
from lmforge.nn.weight_only import int8_projections


@dataclass
class AttentionContext:
    """Everything a layer needs to know about positions and masking, built once per stack forward.

    Attributes:
        mask: bool (B|1, 1, T, S), True = may attend; None = no restriction beyond ``is_causal``.
        is_causal: use SDPA's built-in causal mask (only when T == S and ``mask`` is None).
        bias: additive logits (1|B, H, T, S) from T5 buckets or ALiBi, or None.
        rope: (cos, sin), each (B|1, 1, T, rotary_dim), or None.
        rel_index: (T, S) indices into Shaw tables or DeBERTa's relative table, or None.
        rel_embeddings: (2k, D) DeBERTa's relative-position table, shared by the stack's layers, or None.
        cache: the KV cache to read and extend, or None.
        cross_mask: bool (B, 1, 1, S_src) for cross-attention, or None.
        attentions, cross_attentions: lists each layer appends its self- / cross-attention weights (B, H, T, S)
            to, when attention maps are asked for; None (the fast path: SDPA never writes the weights out).
            A :class:`ScoreRecord` asks for the scores before the softmax instead (TinyBERT's targets).
        unpadded: where the real tokens sit when the layers run padding-free (:mod:`lmforge.nn.unpadding`):
            the layer input is then (N, D), and attention lays it out as (B, T, ...) itself; None: (B, T, D).
    """

    mask: torch.Tensor | None = None
    is_causal: bool = False
    bias: torch.Tensor | None = None
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    rel_index: torch.Tensor | None = None
    rel_embeddings: torch.Tensor | None = None
    cache: KVCache | None = None
    cross_mask: torch.Tensor | None = None
    attentions: list[torch.Tensor] | None = None
    cross_attentions: list[torch.Tensor] | None = None
    unpadded: Unpadded | None = None

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """A per-token projection's output as (B, T, C): unpacked when the layers run padding-free."""
        return x if self.unpadded is None else self.unpadded.unpack(x)


class ScoreRecord(list):
    """A list for ``AttentionContext.attentions`` that records each layer's attention *scores*
    ``Q K^T * scale + bias + mask`` (B, H, T, S), before the softmax, instead of its weights: TinyBERT's
    attention loss matches these (Jiao et al. 2020, eq. 3). Masked entries hold the mask's value (half the
    dtype's lowest), so a consumer zeroes them before comparing."""


class Attention(nn.Module):
    """Self-attention, or cross-attention when ``cross=True`` (keys/values from ``memory``).

    Shapes: x (B, T, D), memory (B, S, D) -> (B, T, D); padding-free (``ctx.unpadded``), x (N, D) -> (N, D).
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.cross = cross
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.dim_per_head
        inner, kv_inner = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias  # Llama's attention_bias, Qwen2's q/k/v bias
        self.q = nn.Linear(cfg.d_model, inner, bias=qkv_bias)
        self.k = nn.Linear(cfg.d_model, kv_inner, bias=qkv_bias)
        self.v = nn.Linear(cfg.d_model, kv_inner, bias=qkv_bias)
        self.o = nn.Linear(inner, cfg.d_model, bias=cfg.bias if cfg.o_bias is None else cfg.o_bias)
        # T5 folds 1/sqrt(d) into its initialisation, so its logits are unscaled.
        self.scale = self.head_dim**-0.5 if cfg.attn_scale else 1.0
        self.dropout = cfg.attn_dropout
        self.fuse_qkv = True
        self.relative = (
            ShawRelativePositions(self.head_dim, cfg.relative_k, cfg.relative_values)
            if cfg.position == "relative" and not cross
            else None
        )
        self.disentangled = DisentangledBias(cfg) if cfg.position == "deberta" and not cross else None
        if self.disentangled is not None and cfg.attn_scale:
            # DeBERTa sums 1 + (c2p, p2c) terms of similar variance: 1/sqrt(3 hd) keeps the logits' scale.
            self.scale = (self.head_dim * self.disentangled.scale_factor) ** -0.5
        # Linformer (encoders only): keys and values projected along the sequence to linformer_k rows.
        self.linformer = LinformerProjection(cfg) if cfg.attention == "linformer" and not cross else None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, hd)

    def _project(self, x: torch.Tensor, memory: torch.Tensor | None, ctx: AttentionContext, layer: int):
        """Queries (B, H, T, hd) and keys/values (B, Hkv, S, hd), with RoPE and the cache applied."""
        if self.cross:
            q = self._heads(ctx.padded(apply_linear(self.q, x)), self.n_heads)
            cache = ctx.cache
            if cache is not None and layer in cache.cross:
                return (q, *cache.cross[layer])  # computed once per source
            k = self._heads(apply_linear(self.k, memory), self.n_kv_heads)
            v = self._heads(apply_linear(self.v, memory), self.n_kv_heads)
            if cache is not None:
                cache.cross[layer] = (k, v)
            return q, k, v
        # is_compiling() first: dynamo cannot trace is_inference_mode_enabled() (a graph break per layer).
        fuse = self.fuse_qkv and (torch.compiler.is_compiling() or not torch.is_inference_mode_enabled())
        if (fuse and all(type(m) is nn.Linear for m in (self.q, self.k, self.v))
                and cpu_kernel(x, self.q.weight) != "bf16"):
            # One (D -> (H + 2 Hkv) hd) matmul instead of three: fewer, larger GEMMs run faster. Only
            # for plain Linears, so a PEFT-wrapped projection still goes through its own forward. Not at
            # inference: decoding a token is bound by reading weights, and the concatenation would
            # copy all three every step (a compiled step with frozen weights concatenates them once; one whose
            # rows go to the bf16 kernel is not frozen, so it too keeps the three).
            weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
            bias = torch.cat([self.q.bias, self.k.bias, self.v.bias]) if self.q.bias is not None else None
            kv_inner = self.n_kv_heads * self.head_dim
            qkv = ctx.padded(F.linear(x, weight, bias))  # (B, T, (H + 2 Hkv) hd)
            q, k, v = qkv.split([self.n_heads * self.head_dim, kv_inner, kv_inner], dim=-1)
        else:  # decoding's rows of int8 projections: one kernel call with x rounded once
            projections = (self.q, self.k, self.v)
            outs = int8_projections(x, projections) or [apply_linear(m, x) for m in projections]
            q, k, v = (ctx.padded(o) for o in outs)
        q, k, v = self._heads(q, self.n_heads), self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
        if ctx.rope is not None:
            q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
        if ctx.cache is not None:
            k, v = ctx.cache.update(layer, k, v)  # (B, Hkv, S, hd)
        return q, k, v

    def forward(
        self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T = (x.shape[0], x.shape[1]) if ctx.unpadded is None else (ctx.unpadded.batch, ctx.unpadded.length)
        q, k, v = self._project(x, memory, ctx, layer)  # (B, H, T, hd), (B, Hkv, S, hd) x 2

        if self.cross:
            mask, bias, is_causal = ctx.cross_mask, None, False
        else:
            mask, bias, is_causal = ctx.mask, ctx.bias, ctx.is_causal
        if self.linformer is not None:
            k, v = self.linformer(k, v, mask)  # (B, Hkv, k, hd): padding zeroed, so no mask is left
            mask = None
        if self.relative is not None:
            rel_bias = self.relative.key_bias(q, ctx.rel_index, self.scale)  # (B, H, T, S)
            bias = rel_bias if bias is None else bias + rel_bias
        if self.disentangled is not None:
            rel_bias = self.disentangled(q, k, ctx.rel_embeddings, ctx.rel_index, self.scale, self.q, self.k)
            bias = rel_bias if bias is None else bias + rel_bias
        attn_mask = _merge_mask_and_bias(mask, bias, q.dtype)
        dropout = self.dropout if self.training else 0.0

        record = ctx.cross_attentions if self.cross else ctx.attentions
        shaw_values = self.relative is not None and self.relative.value_table is not None
        if shaw_values or record is not None:  # the weights themselves are needed: written out
            scores = record if isinstance(record, ScoreRecord) else None
            probs = self._probs(q, k, attn_mask, is_causal and attn_mask is None, dropout, scores)  # (B, H, T, S)
            out = self._weigh(probs, v)  # (B, H, T, hd)
            if shaw_values:
                out = out + self.relative.value_term(probs, ctx.rel_index)
            if record is not None and scores is None:
                record.append(probs)
        elif one_compiled_row(q):
            out = self._one_row(q, k, v, attn_mask)
        elif use_matmul_attention(q, k, attn_mask):
            causal = is_causal and attn_mask is None
            if causal and split_causal_in_halves(q, k):
                out = self._causal_in_halves(q, k, v, dropout)
            else:
                out = self._weigh(self._probs(q, k, attn_mask, causal, dropout), v)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal and attn_mask is None,
                scale=self.scale, enable_gqa=self.n_kv_heads != self.n_heads,
            )  # (B, H, T, hd)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H*hd)
        if ctx.unpadded is not None:
            out = ctx.unpadded.pack(out)  # (N, H*hd): the output projection skips the padding
        return apply_linear(self.o, out)

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        """(B, Hkv, S, hd) -> (B*H, S, hd): each key/value head repeated for its group of query heads."""
        if self.n_kv_heads != self.n_heads:
            kv = kv.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        return kv.reshape(-1, *kv.shape[2:])

    def _probs(self, q, k, attn_mask, is_causal: bool, dropout: float,
               scores_out: list | None = None) -> torch.Tensor:
        """Attention weights written out: softmax(q k^T * scale + mask) (B, H, T, S), dropout applied; the
        scores before the softmax are appended to ``scores_out`` when given.

        The mask enters as an additive bias of one ``baddbmm`` that also scales (one pass over the
        scores instead of three). Masked logits get half the dtype's lowest value, not -inf, so a query
        that may see nothing (a padding row) gets uniform weights instead of NaN, which would poison the
        backward pass through the padded positions' zero gradients."""
        B, H, T, hd = q.shape
        S = k.shape[2]
        low = torch.finfo(q.dtype).min / 2
        if is_causal:  # (T, S): low above the diagonal (query i sees keys up to i + S - T)
            bias = torch.full((T, S), low, dtype=q.dtype, device=q.device).triu_(S - T + 1)
        elif attn_mask is None:
            bias = None
        elif attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask, low)
        else:  # an additive bias, -inf where masked
            bias = attn_mask.to(q.dtype).clamp_min(low)
        if bias is None:
            bias, beta = q.new_empty(1, 1, 1), 0.0
        else:  # baddbmm broadcasts a (1, T, S) bias only: per-row or per-head biases are laid out (B*H, T, S)
            bias = bias.reshape(1, T, S) if bias.numel() == T * S else bias.expand(B, H, T, S).reshape(B * H, T, S)
            beta = 1.0
        scores = torch.baddbmm(bias, q.reshape(B * H, T, hd), self._expand(k).transpose(1, 2),
                               beta=beta, alpha=self.scale)  # (B*H, T, S)
        if scores_out is not None:
            scores_out.append(scores.view(B, H, T, S))
        probs = scores.softmax(-1).view(B, H, T, S)  # a bf16 softmax accumulates in fp32 internally on CPU
        return apply_dropout(probs, dropout) if dropout else probs

    def _one_row(self, q, k, v, attn_mask) -> torch.Tensor:
        """One query row against all keys, as broadcasts and sums (a compiled decode step on a CPU): inductor makes
        them a few fused loops, where SDPA's CPU kernel has a fixed cost per call that dominates for one row.
        q (B, H, 1, hd), k and v (B, Hkv, S, hd), attn_mask bool (True: visible) or additive, broadcastable to
        (B, H, 1, S) -> (B, H, 1, hd)."""
        B, H, _, hd = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        qg = q.reshape(B, Hkv, H // Hkv, 1, hd)  # the query heads sharing each key/value head
        scores = (qg * k.unsqueeze(2)).sum(-1) * self.scale  # (B, Hkv, g, S)
        scores = scores.reshape(B, H, 1, S)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min / 2)
            else:
                scores = scores + attn_mask.to(scores.dtype)
        probs = scores.softmax(-1).reshape(B, Hkv, H // Hkv, S, 1)
        return (probs * v.unsqueeze(2)).sum(3).reshape(B, H, 1, hd)

    def _causal_in_halves(self, q, k, v, dropout: float) -> torch.Tensor:
        """Causal self-attention (T == S) written out in two query halves: the first half's queries see
        only the first half's keys, so the all-masked upper-right quarter of the scores is never
        computed. A quarter fewer score FLOPs and softmax elements. Only under torch.compile, which fuses
        the slices and the concatenation away; eagerly their copies cost what the quarter saves
        (the compiled GPT rows of ``benchmarks/train_step.py`` include it).
        q, k, v (B, H|Hkv, T, hd) -> (B, H, T, hd)."""
        c = q.shape[2] // 2
        first = self._weigh(self._probs(q[:, :, :c], k[:, :, :c], None, True, dropout), v[:, :, :c])  # (B, H, c, hd)
        second = self._weigh(self._probs(q[:, :, c:], k, None, True, dropout), v)  # (B, H, T - c, hd)
        return torch.cat([first, second], dim=2)

    def _weigh(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """probs (B, H, T, S), v (B, Hkv, S, hd) -> (B, H, T, hd)."""
        B, H, T, S = probs.shape
        return torch.bmm(probs.reshape(B * H, T, S), self._expand(v)).view(B, H, T, -1)


# SDPA's CPU kernel (flash attention) is slow to train through in bf16: its backward recomputes the
# scores block by block with little parallelism, so at the scores' sizes of small models plain batched
# matmuls and a softmax, forward and backward, take clearly less time. In fp32, and
# without gradients, the fused kernel is as fast or faster, and for long sequences it is what keeps
# the (B, H, T, S) scores out of memory; so only bf16/fp16 training steps whose scores stay small
# take the matmul path (`benchmarks/train_step.py`).
MATMUL_ATTENTION_MAX_SCORES = 1 << 24  # B*H*T*S: 32 MB of bf16 scores per layer, kept for backward


def use_matmul_attention(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether :class:`Attention` writes the softmax out instead of calling SDPA (see above).
    q (B, H, T, hd), k (B, Hkv, S, hd)."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and q.requires_grad
        and q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] <= MATMUL_ATTENTION_MAX_SCORES
    )


def one_compiled_row(q: torch.Tensor) -> bool:
    """Whether :class:`Attention` computes one query row as broadcasts and sums (``Attention._one_row``): under
    torch.compile on a CPU, without gradients, as in a compiled decode step. q (B, H, T, hd)."""
    return q.device.type == "cpu" and q.shape[2] == 1 and torch.compiler.is_compiling() and not torch.is_grad_enabled()


def split_causal_in_halves(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether causal matmul attention skips its masked quarter (``Attention._causal_in_halves``): under
    torch.compile, for self-attention without a cache (T == S) long enough to matter.
    q (B, H, T, hd), k (B, Hkv, S, hd)."""
    return torch.compiler.is_compiling() and q.shape[2] == k.shape[2] >= 64


def _merge_mask_and_bias(
    mask: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """SDPA takes one attn_mask: a bool mask, or a float bias with -inf where masked."""
    if bias is None:
        return mask
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))
