"""Synthesizer attention (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer Models").

Dot-product attention computes its weights from query-key pairs. A synthesizer makes them up without any
pair: from each position's own vector (dense), or not from the input at all (random). Values stay the input's,
so a layer still mixes positions, only by weights that never compare two tokens:

    dense               B_h[i, :] = W2_h relu(W1 x_i + b1) + b2_h      (one row of L logits per position)
    random              B_h = R_h                                      (an L x L matrix, learned or fixed)
    factorized-dense    B_h[i, :] = vec(a_h(x_i) (outer) b_h(x_i))     a: k logits, b: L / k logits
    factorized-random   B_h = R1_h R2_h^T                              R1, R2 (L, k): rank k
    Y_h = softmax(B_h[:T, :T] + mask) (X W_v)_h,    then the output projection as in multi-head attention

L is ``max_seq_len``: the weights are tied to absolute positions, so a length-T input uses the top-left
T x T block (rows past .. past + T - 1 once a KV cache holds ``past`` positions). Decoders add the causal mask
to the logits before the softmax, exactly as for dot-product attention: a row's masked logits get no weight,
whatever made them.

Mixtures with dot-product attention (``synthesizer_mix``; Narang et al. 2021's "plus" and "plus alpha" rows,
Tay et al.'s "Dense + Vanilla", "Random + Vanilla"):

    plus        softmax(B + Q K^T * scale + mask) V
    plus-alpha  softmax(w_s B + w_v Q K^T * scale + mask) V,   (w_s, w_v) = softmax(learned logits, init 0)

so the mixture weights are positive and sum to 1 (Tay et al.'s alpha), each layer its own.

``synthesizer_trainable=False`` keeps a random synthesizer's R at its initial draw (Tay et al.'s "fixed
random"): N(0, 1), since at GPT-2's N(0, 0.02) a fixed R would be a uniform average forever. A trainable R
starts at N(0, 0.02), near-uniform like a dense synthesizer's first logits.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=10, max_seq_len=8,
    ...                   attention="synthesizer-dense")
    >>> from lmforge.nn.attention import AttentionContext
    >>> SynthesizerAttention(cfg)(torch.randn(2, 5, 16), AttentionContext(is_causal=True)).shape
    torch.Size([2, 5, 16])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import UserInputError
from lmforge.nn.dropout import dropout as apply_dropout
from lmforge.nn.init import normal_
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.linear import apply_linear
from lmforge.nn.positions.rope import apply_rotary


def is_synthesizer(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s self-attention is a synthesizer (``attention="synthesizer-..."``)."""
    return cfg.attention.startswith("synthesizer-")


class SynthesizerAttention(nn.Module):
    """A synthesizer self-attention layer: x (B, T, D) -> (B, T, D) (padding-free: (N, D) -> (N, D)).

    Parameters: ``v``, ``o`` (as :class:`~lmforge.nn.attention.Attention`), ``q``, ``k`` with a mixture;
    dense: ``w1`` (D -> D), ``w2`` (D -> H L) (factorized: ``wa`` (D -> H k), ``wb`` (D -> H L/k));
    random: ``R`` (H, L, L) (factorized: ``R1``, ``R2`` (H, L, k)); ``mix`` (2,) for plus-alpha.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind = cfg.attention.removeprefix("synthesizer-")
        self.n_heads, self.head_dim, self.max_len = cfg.n_heads, cfg.dim_per_head, cfg.max_seq_len
        H, L, d, inner = cfg.n_heads, cfg.max_seq_len, cfg.d_model, cfg.n_heads * cfg.dim_per_head
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
        self.mix_mode = cfg.synthesizer_mix
        if self.mix_mode != "none":  # the dot-product half of a mixture
            self.q = nn.Linear(d, inner, bias=qkv_bias)
            self.k = nn.Linear(d, inner, bias=qkv_bias)
        self.v = nn.Linear(d, inner, bias=qkv_bias)
        self.o = nn.Linear(inner, d, bias=cfg.bias if cfg.o_bias is None else cfg.o_bias)
        self.scale = self.head_dim**-0.5 if cfg.attn_scale else 1.0
        self.dropout = cfg.attn_dropout
        self.factor = cfg.synthesizer_factor
        if self.kind in ("dense", "factorized-dense"):
            self.w1 = nn.Linear(d, d, bias=cfg.bias)
            if self.kind == "dense":
                self.w2 = nn.Linear(d, H * L, bias=cfg.bias)
            else:
                self.wa = nn.Linear(d, H * self.factor, bias=cfg.bias)
                self.wb = nn.Linear(d, H * (L // self.factor), bias=cfg.bias)
        trainable = cfg.synthesizer_trainable
        if self.kind == "random":
            self.R = nn.Parameter(torch.empty(H, L, L), requires_grad=trainable)
        elif self.kind == "factorized-random":
            self.R1 = nn.Parameter(torch.empty(H, L, self.factor), requires_grad=trainable)
            self.R2 = nn.Parameter(torch.empty(H, L, self.factor), requires_grad=trainable)
        self.mix = nn.Parameter(torch.zeros(2)) if self.mix_mode == "plus-alpha" else None
        self.init_std = cfg.initializer_range
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The random matrices and the mixture logits only (the Linears follow the model's own scheme)."""
        if self.kind == "random":
            normal_(self.R, std=self.init_std if self.R.requires_grad else 1.0)
        elif self.kind == "factorized-random":
            # A fixed R1 R2^T of unit-variance entries: each factor N(0, k^-1/2).
            std = self.init_std if self.R1.requires_grad else self.factor**-0.25
            normal_(self.R1, std=std)
            normal_(self.R2, std=std)
        if self.mix is not None and not self.mix.is_meta:
            nn.init.zeros_(self.mix)

    def mixture_weights(self) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """(w_s, w_v): the weights of the synthetic and the dot-product logits (1, 0 without a mixture)."""
        if self.mix_mode == "none":
            return 1.0, 0.0
        if self.mix_mode == "plus":
            return 1.0, 1.0
        w = self.mix.softmax(0)
        return w[0], w[1]

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, C)

    def synthetic_logits(self, x: torch.Tensor, ctx, past: int, S: int) -> torch.Tensor:
        """The synthetic logits of query rows past .. S - 1 over key columns 0 .. S - 1: (B|1, H, T, S)."""
        if self.kind == "random":
            return self.R[None, :, past:S, :S]
        if self.kind == "factorized-random":
            return (self.R1[:, past:S] @ self.R2[:, :S].transpose(1, 2))[None]  # (1, H, T, S)
        h = F.relu(apply_linear(self.w1, x))
        if self.kind == "dense":
            return self._heads(ctx.padded(apply_linear(self.w2, h)))[..., :S]  # (B, H, T, S)
        a = self._heads(ctx.padded(apply_linear(self.wa, h)))  # (B, H, T, k)
        b = self._heads(ctx.padded(apply_linear(self.wb, h)))  # (B, H, T, L/k)
        return (a[..., :, None] * b[..., None, :]).flatten(-2)[..., :S]  # (B, H, T, L): column i*(L/k) + j

    def forward(self, x: torch.Tensor, ctx, memory: torch.Tensor | None = None, layer: int = 0) -> torch.Tensor:
        """x (B, T, D) (or packed (N, D) with ``ctx.unpadded``), ctx an AttentionContext -> same shape as x."""
        B, T = (x.shape[0], x.shape[1]) if ctx.unpadded is None else (ctx.unpadded.batch, ctx.unpadded.length)
        if ctx.cache is not None and not isinstance(ctx.cache, KVCache):  # a static cache's seq_len is its capacity
            raise UserInputError("synthesizer attention decodes with the growing KV cache only (its weights are rows "
                                 "of a position-indexed table); use uncompiled generation")
        past = ctx.cache.seq_len(layer) if ctx.cache is not None else 0
        S = past + T
        if S > self.max_len:
            raise UserInputError(f"synthesizer attention has weights for max_seq_len={self.max_len} positions; got "
                                 f"{S} (shorten the input, or build the model with a larger max_seq_len)")
        v = self._heads(ctx.padded(apply_linear(self.v, x)))  # (B, H, T, hd)
        w_s, w_v = self.mixture_weights()
        q = k = None
        if self.mix_mode != "none":
            q, k = self._heads(ctx.padded(apply_linear(self.q, x))), self._heads(ctx.padded(apply_linear(self.k, x)))
            if ctx.rope is not None:
                q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
        if ctx.cache is not None:  # a pure synthesizer keeps no keys: zero-width ones cost nothing
            k, v = ctx.cache.update(layer, v[..., :0] if k is None else k, v)
        logits = w_s * self.synthetic_logits(x, ctx, past, S).to(v.dtype)  # (B|1, H, T, S)
        if q is not None:
            dot = (q @ k.transpose(-1, -2)) * self.scale  # (B, H, T, S)
            if ctx.bias is not None:
                dot = dot + ctx.bias.to(dot.dtype)
            logits = logits + w_v * dot
        logits = logits.expand(B, -1, -1, -1)  # (B, H, T, S): a random R is shared by the batch
        mask = ctx.mask
        if mask is None and ctx.is_causal:  # query at position past + i sees keys 0 .. past + i
            mask = torch.ones(T, S, dtype=torch.bool, device=v.device).tril_(past)
        if mask is not None:  # a finite low, as Attention._probs: an all-masked row is uniform, not NaN
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min / 2)
        probs = logits.softmax(-1)  # (B, H, T, S)
        if self.dropout and self.training:
            probs = apply_dropout(probs, self.dropout)
        if ctx.attentions is not None:
            ctx.attentions.append(probs)
        out = (probs @ v).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H*hd)
        if ctx.unpadded is not None:
            out = ctx.unpadded.pack(out)  # (N, H*hd)
        return apply_linear(self.o, out)
