"""The Evolved Transformer's layers (So et al. 2019, "The Evolved Transformer"): ``block="evolved"``.

An architecture search seeded with the Transformer found these encoder and decoder layers (the paper's
Figure 3, as in tensor2tensor's ``evolved_transformer.py``). Every sublayer is pre-norm with a residual,
``x = x + Sublayer(Norm(x))``; d = ``d_model``, convolutions are "same"-padded in the encoder and causal
(padded on the left) in the decoder:

    encoder                                         decoder
    GLU: (x W_v) * sigmoid(x W_g)       d -> d      self-attention, max(16, H) heads   (+ cross-attention, H
    [1x1 conv, ReLU: 4d] + [3x1 conv,               heads, summed in: encoder-decoder only)
      ReLU: d/2, zero-padded to 4d]                 [sep 11x1 conv, ReLU: 2d] + [sep 7x1 conv: d/2, padded
      -> Norm(4d) -> sep 9x1 conv: d/2,               to 2d] -> Norm(2d) -> sep 7x1 conv: d
      zero-padded to d                              self-attention, H heads
    self-attention, H heads                         (cross-attention, H heads: encoder-decoder only)
    FFN: ReLU(x W_1) W_2          d_ff              FFN: Norm(swish(x W_1)) W_2        d_ff

A separable convolution is Keras' ``SeparableConv1D``: a depthwise k x 1 filter per input channel (no bias),
then a pointwise (1 x 1) projection with a bias. The layers fix their own activations (``activation`` is not
read); the FFN width is ``d_ff`` (the paper's 4d). For a decoder-only LM the decoder layer runs without its
cross-attention branches. The paper's layers are about twice as deep as a Transformer's (it uses 3 encoder
and 4 decoder layers where the Transformer has 6 and 6), so compare at equal parameters or FLOPs.

Convolutions see padded positions as zeros (only the key-padding part of an attention mask is read), and a
decoder's convolutions keep their inputs in the KV cache for incremental decoding (:mod:`lmforge.nn.lightconv`),
so cached decoding equals the full forward.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.nn.attention import AttentionContext
    >>> cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10, block="evolved")
    >>> layer = evolved_block(cfg, causal=True)
    >>> layer.wide_attn.n_heads, layer(torch.randn(2, 5, 32), AttentionContext(is_causal=True)).shape
    (16, torch.Size([2, 5, 32]))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.attention import Attention, AttentionContext
from lmforge.nn.dropout import dropout
from lmforge.nn.ffn import FeedForward
from lmforge.nn.init import normal_
from lmforge.nn.lightconv import context, rows, sequence, windows, zero_padding
from lmforge.nn.linear import apply_linear
from lmforge.nn.norms import build_norm


class SeparableConv(nn.Module):
    """A depthwise k x 1 filter per input channel, then a pointwise projection: windows (B, T, C_in, k) ->
    (B, T, C_out). Parameters: ``depthwise`` (C_in, k), ``pointwise`` (C_in -> C_out, with bias)."""

    def __init__(self, c_in: int, c_out: int, k: int, bias: bool = True):
        super().__init__()
        self.k = k
        self.depthwise = nn.Parameter(torch.empty(c_in, k))
        self.pointwise = nn.Linear(c_in, c_out, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 1/k): each channel's filter keeps its input's scale (a sum of k weighted inputs)."""
        normal_(self.depthwise, std=self.k**-0.5)

    def forward(self, win: torch.Tensor) -> torch.Tensor:
        return apply_linear(self.pointwise, (win * self.depthwise.to(win.dtype)).sum(-1))  # (B, T, C_out)


class SwishFFN(nn.Module):
    """The decoder's feed-forward: Norm(swish(x W_1)) W_2, (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.norm = build_norm(cfg.norm, cfg.d_ff, cfg.layer_norm_eps, cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.ffn_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(apply_linear(self.up, x))  # (B, T, d_ff)
        if self.dropout and self.training:
            h = dropout(h, self.dropout)
        return apply_linear(self.down, self.norm(h))


class _EvolvedLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d, self.p = cfg.d_model, cfg.dropout
        self.rezero = None  # what the stack and model read off a Block: these layers have no ReZero gate

    def norm(self, cfg: ModelConfig, width: int | None = None) -> nn.Module:
        return build_norm(cfg.norm, width or cfg.d_model, cfg.layer_norm_eps, cfg.bias)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p) if self.p and self.training else x


class EvolvedEncoderBlock(_EvolvedLayer):
    """The encoder layer (see the module docstring). x (B, T, D) (or (N, D) padding-free) -> the same."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.glu_norm = self.norm(cfg)
        self.glu_value, self.glu_gate = nn.Linear(d, d, bias=cfg.bias), nn.Linear(d, d, bias=cfg.bias)
        self.conv_norm = self.norm(cfg)
        self.wide = nn.Linear(d, 4 * d, bias=cfg.bias)  # the 1x1 convolution
        self.narrow = nn.Linear(3 * d, d // 2, bias=cfg.bias)  # the 3x1 convolution, over each window of 3
        self.mid_norm = self.norm(cfg, 4 * d)
        self.sep9 = SeparableConv(4 * d, d // 2, 9, cfg.bias)
        self.attn_norm, self.attn = self.norm(cfg), Attention(cfg)
        self.ffn_norm, self.ffn = self.norm(cfg), FeedForward(d, cfg.d_ff, "relu", cfg.bias, cfg.ffn_dropout)

    def forward(
        self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None, layer: int = 0
    ) -> torch.Tensor:
        h = self.glu_norm(x)
        x = x + self._drop(apply_linear(self.glu_value, h) * torch.sigmoid(apply_linear(self.glu_gate, h)))
        h = sequence(self.conv_norm(x), ctx)  # (B, T, d), padding zeroed
        left = self._drop(F.relu(apply_linear(self.wide, h)))  # (B, T, 4d)
        right = self._drop(F.relu(apply_linear(self.narrow, windows(h, 3, False).flatten(2))))  # (B, T, d/2)
        h = zero_padding(self.mid_norm(left + F.pad(right, (0, 4 * self.d - right.shape[-1]))), ctx)  # (B, T, 4d)
        h = self.sep9(windows(h, 9, False))  # (B, T, d/2)
        x = x + self._drop(rows(F.pad(h, (0, self.d - h.shape[-1])), ctx))
        x = x + self._drop(self.attn(self.attn_norm(x), ctx, layer=layer))
        return x + self._drop(self.ffn(self.ffn_norm(x)))


class EvolvedDecoderBlock(_EvolvedLayer):
    """The decoder layer (see the module docstring), causal; with ``cross`` it attends to ``memory`` twice.
    x (B, T, D) (or (N, D) padding-free) -> the same. Its cached state: the two self-attentions' keys and
    values, and the inputs of the two convolution stages."""

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__(cfg)
        d = cfg.d_model
        self.wide_norm = self.norm(cfg)
        self.wide_attn = Attention(cfg.replace(n_heads=max(16, cfg.n_heads), n_kv_heads=None, head_dim=None))
        self.first_cross_attn = Attention(cfg, cross=True) if cross else None  # beside the wide self-attention
        self.conv_norm = self.norm(cfg)
        self.sep11 = SeparableConv(d, 2 * d, 11, cfg.bias)
        self.sep7 = SeparableConv(d, d // 2, 7, cfg.bias)
        self.mid_norm = self.norm(cfg, 2 * d)
        self.sep7_out = SeparableConv(2 * d, d, 7, cfg.bias)
        self.attn_norm, self.attn = self.norm(cfg), Attention(cfg)
        self.cross_norm, self.cross_attn = (self.norm(cfg), Attention(cfg, cross=True)) if cross else (None, None)
        self.ffn_norm, self.ffn = self.norm(cfg), SwishFFN(cfg)

    def forward(
        self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None, layer: int = 0
    ) -> torch.Tensor:
        """``layer`` keys the KV cache: ``layer`` for the H-head attentions, tuples beside it for the rest."""
        h = self.wide_norm(x)
        branches = self._drop(self.wide_attn(h, ctx, layer=("wide", layer)))
        if self.first_cross_attn is not None:
            branches = branches + self._drop(self.first_cross_attn(h, ctx, memory, layer=("cross", layer)))
        x = x + branches
        h = context(sequence(self.conv_norm(x), ctx), 11, True, ctx.cache, ("conv", layer))  # (B, T + 10, d)
        left = self._drop(F.relu(self.sep11(h.unfold(1, 11, 1))))  # (B, T, 2d)
        right = self._drop(self.sep7(h[:, 4:].unfold(1, 7, 1)))  # (B, T, d/2): the last 7 of each 11 window
        h = zero_padding(self.mid_norm(left + F.pad(right, (0, 2 * self.d - right.shape[-1]))), ctx)  # (B, T, 2d)
        h = self.sep7_out(windows(h, 7, True, ctx.cache, ("conv_mid", layer)))  # (B, T, d)
        x = x + self._drop(rows(h, ctx))
        x = x + self._drop(self.attn(self.attn_norm(x), ctx, layer=layer))
        if self.cross_attn is not None:
            x = x + self._drop(self.cross_attn(self.cross_norm(x), ctx, memory, layer=layer))
        return x + self._drop(self.ffn(self.ffn_norm(x)))


def evolved_block(cfg: ModelConfig, cross: bool = False, moe: bool = False, pkm: bool = False,
                  causal: bool = True) -> nn.Module:
    """The Evolved Transformer layer for a stack (Block's arguments): the decoder layer when ``causal``, else
    the encoder layer. ``moe`` and ``pkm`` are always False (the config refuses other FFNs in these layers)."""
    return EvolvedDecoderBlock(cfg, cross) if causal else EvolvedEncoderBlock(cfg)
