"""Lightweight convolution in place of self-attention (Wu et al. 2019, "Pay Less Attention with Lightweight and
Dynamic Convolutions"): ``attention="lightconv"``.

A depthwise convolution mixes each channel over a window of k positions. Lightweight convolution shares one
kernel among the d/H channels of each of H heads (contiguous channels, as the paper ties "every subsequent
d/H channels") and softmax-normalises it over the width, so every output is a convex mix of its window:

    LConv(u)_{i,c} = sum_{j=1..k} softmax(W_h)_j * u_{i + j - p, c}      h = c // (d / H)

where p puts the window before position i in a decoder (p = k: the window ends at i itself, inputs left of
the sequence are zeros) and centres it in an encoder. The paper's block replaces the attention sublayer:

    x (B, T, d) -> GLU(x W_in) (B, T, d) -> LConv -> W_o (B, T, d)        W_in (d, 2d), W_o (d, d)

It has H k weights besides the projections, and costs 2 d k FLOPs a token instead of attention's 4 d T.
Attention dropout (``attn_dropout``) drops kernel entries while training, the paper's weight dropout
(DropConnect). Only the key-padding part of an attention mask is read: padded positions enter the windows as
zeros, as if the sequence ended there. ``conv_kernel`` sets k for every layer (the paper grows it from 3 to 31
with depth).

Incremental decoding is supported: a decoder's convolution keeps its inputs u in the KV cache, as a key
(B, 1, S, d) with empty values, under its layer's index, and each step convolves the new positions with the
cache's last k - 1 inputs, so cached decoding equals the full forward (tested). Beam search's reorder and the
cache's position count work unchanged; compiled decoding's static cache is refused.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.nn.attention import AttentionContext
    >>> cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10, attention="lightconv", conv_kernel=3)
    >>> conv = LightweightConv(cfg, causal=True)
    >>> conv.weight.shape  # (H, k): one softmaxed kernel per head
    torch.Size([4, 3])
    >>> conv(torch.randn(2, 5, 32), AttentionContext(is_causal=True)).shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import UserInputError
from lmforge.nn.attention import AttentionContext
from lmforge.nn.dropout import dropout as apply_dropout
from lmforge.nn.init import normal_
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.linear import apply_linear


def sequence(x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """A layer's rows as (B, T, C) with padded positions zeroed: what a convolution slides over.
    x is (B, T, C), or (N, C) when the layers run padding-free."""
    return zero_padding(ctx.padded(x), ctx)


def zero_padding(x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """x (B, T, C) with its padded positions zeroed. Padding is read from the attention mask: a key no query
    may see is padding (a causal mask hides it from every row as well); without a mask nothing is padding."""
    if ctx.mask is None:
        return x
    keep = ctx.mask.any(dim=2)[:, 0, -x.shape[1]:]  # (B|1, T): the newest T keys some query may see
    return x * keep.unsqueeze(-1).to(x.dtype)


def rows(y: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """(B, T, C) back to the layer's layout: (N, C) when the layers run padding-free."""
    return y if ctx.unpadded is None else ctx.unpadded.pack(y)


def context(u: torch.Tensor, k: int, causal: bool, cache=None, key=None) -> torch.Tensor:
    """u (B, T, C) with the k - 1 positions its width-k windows reach beyond it: (B, T + k - 1, C). Those are
    zeros (k - 1 on the left when causal; (k - 1) // 2 left and k // 2 right when centred), or, when decoding
    with a KV cache (causal only), the inputs stored by earlier steps: u is appended under ``key`` first."""
    T = u.shape[1]
    if not causal:
        return F.pad(u, (0, 0, (k - 1) // 2, k // 2))
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise UserInputError("convolution layers decode with lmforge's KVCache only; compiled decoding (a "
                                 "static KV cache) and continuous batching are not supported: use compile=False")
        stored, _ = cache.update(key, u.unsqueeze(1), u[..., :0].unsqueeze(1))  # (B, 1, S, C): every input so far
        u = stored[:, 0, -(T + k - 1):]  # (B, <= T + k - 1, C): the last k - 1 before the new T, and them
    return F.pad(u, (0, 0, T + k - 1 - u.shape[1], 0))


def windows(u: torch.Tensor, k: int, causal: bool, cache=None, key=None) -> torch.Tensor:
    """Each position's window of k inputs: u (B, T, C) -> (B, T, C, k), window j of position i holding
    u[i + j - k + 1] (causal) or u[i + j - (k - 1) // 2] (centred), zeros beyond the sequence (or, decoding,
    the cached inputs: see :func:`context`)."""
    return context(u, k, causal, cache, key).unfold(1, k, 1)  # (B, T, C, k)


def convolve(win: torch.Tensor, kernel: torch.Tensor, heads: int) -> torch.Tensor:
    """Head-shared depthwise convolution: windows (B, T, C, k) and kernels (H, k), or one per position
    (B, T, H, k) -> (B, T, C); the C / H channels of head h use kernel h."""
    B, T, C, k = win.shape
    if kernel.dim() == 2:
        kernel = kernel[:, None, :]  # (H, 1, k): broadcasts over positions and each head's channels
    else:
        kernel = kernel.unsqueeze(-2)  # (B, T, H, 1, k)
    return (win.view(B, T, heads, C // heads, k) * kernel).sum(-1).view(B, T, C)


class LightweightConv(nn.Module):
    """The paper's lightweight-convolution block, a drop-in for :class:`~lmforge.nn.attention.Attention`.

    Shapes: x (B, T, D) -> (B, T, D); padding-free (``ctx.unpadded``), x (N, D) -> (N, D). Parameters:
    ``glu_in`` (D -> 2D), ``weight`` (H, k), ``o`` (D -> D); ``o`` is named as attention's output projection
    so that initialisation scales it as a residual output.
    """

    def __init__(self, cfg: ModelConfig, causal: bool):
        super().__init__()
        self.causal, self.heads, self.k = causal, cfg.n_heads, cfg.conv_kernel
        self.dropout = cfg.attn_dropout
        self.glu_in = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.bias)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.weight = self._kernel_weight()
        self.reset_parameters()

    def _kernel_weight(self) -> nn.Parameter | None:
        return nn.Parameter(torch.empty(self.heads, self.k))

    def reset_parameters(self) -> None:
        """N(0, 1/k) kernel logits: the softmax starts close to a uniform average over the window."""
        if self.weight is not None:
            normal_(self.weight, std=self.k**-0.5)

    def kernel(self, u: torch.Tensor) -> torch.Tensor:
        """The softmaxed kernels (H, k), the same at every position."""
        return self.weight.softmax(-1).to(u.dtype)

    def forward(
        self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None, layer: int = 0
    ) -> torch.Tensor:
        """x (B, T, D) (or (N, D) padding-free) -> the same shape. ``layer`` keys this layer's cached inputs."""
        u = sequence(F.glu(apply_linear(self.glu_in, x), dim=-1), ctx)  # (B, T, D): value * sigmoid(gate)
        kernel = self.kernel(u)  # (H, k) or (B, T, H, k)
        if self.dropout and self.training:
            kernel = apply_dropout(kernel, self.dropout)  # weight dropout (DropConnect) on the normalised kernel
        win = windows(u, self.k, self.causal, ctx.cache if self.causal else None, layer)  # (B, T, D, k)
        return apply_linear(self.o, rows(convolve(win, kernel, self.heads), ctx))
