"""One Transformer layer: self-attention, optional cross-attention, feed-forward, each residual.

    pre-norm  (GPT-2, T5, Llama):  x = x + Sublayer(Norm(x))
    post-norm (BERT, BART, 2017):  x = Norm(x + Sublayer(x))

The feed-forward sublayer is dense, or a mixture of experts (:mod:`lmforge.nn.moe`) in the layers
``ModelConfig.moe_layer`` picks.

Pre-norm keeps an identity path from input to output, which is why deep pre-norm stacks train
without warmup tricks; post-norm is what the original BERT/BART checkpoints use.

    ReZero (Bachlechner et al. 2020, ``rezero=True``):  x = x + alpha * Sublayer(x)

ReZero drops the layer's norms and gates both residual branches by one learned scalar ``alpha``,
initialised at 0: every layer starts as the identity, so signals and gradients pass a deep stack
unchanged at first (the role Fixup's rescaled initialisation plays for ResNets). ``rezero_norm=True`` keeps
the pre-norm inside the gated branch (:mod:`lmforge.nn.rezero`).

    Fixup (Zhang et al. 2019, ``fixup=True``):  x = x + s * Sublayer(x + b)

Fixup drops the norms too; its initialisation (:mod:`lmforge.nn.fixup`) starts every branch at 0.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.nn.attention import AttentionContext
    >>> block = Block(ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10))
    >>> block(torch.randn(2, 5, 32), AttentionContext(is_causal=True)).shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.attention import Attention, AttentionContext
from lmforge.nn.dropout import dropout
from lmforge.nn.dynamicconv import CONVOLUTIONS
from lmforge.nn.ffn import FeedForward
from lmforge.nn.fixup import fixup_branches
from lmforge.nn.moe import MoEFeedForward
from lmforge.nn.norms import build_norm
from lmforge.nn.product_key_memory import ProductKeyMemory
from lmforge.nn.rezero import keeps_norm, rezero_branch
from lmforge.nn.synthesizer import SynthesizerAttention, is_synthesizer
from lmforge.nn.weighted import WeightedBranches


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, cross: bool = False, moe: bool = False, pkm: bool = False,
                 causal: bool = True):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.dropout = cfg.dropout

        self.rezero = nn.Parameter(torch.zeros(())) if cfg.rezero else None  # alpha, () scalar
        self.fixup = fixup_branches(cross) if cfg.fixup else None  # Fixup's per-branch scalars (lmforge.nn.fixup)

        def norm() -> nn.Module:
            if cfg.fixup or not keeps_norm(cfg.rezero, cfg.rezero_norm):
                return nn.Identity()
            return build_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.bias)

        self.attn_norm, self.attn = norm(), SynthesizerAttention(cfg) if is_synthesizer(cfg) else Attention(cfg)
        if cfg.attention in CONVOLUTIONS:  # Wu et al. 2019: a convolution in self-attention's place; causal
            self.attn = CONVOLUTIONS[cfg.attention](cfg, causal)  # in a decoder (lmforge.nn.lightconv)
        self.cross_norm, self.cross_attn = (norm(), Attention(cfg, cross=True)) if cross else (None, None)
        self.ffn_norm = norm()
        self.weighted = cfg.weighted_branches  # Ahmed et al. 2017: per-head W^O + FFN branches (lmforge.nn.weighted)
        if self.weighted:  # one sublayer: no norm between the attention and its branches
            self.attn.o, self.ffn_norm, self.ffn = nn.Identity(), nn.Identity(), WeightedBranches(cfg)
        elif pkm:  # Lample et al. 2019: a product-key memory takes this layer's FFN place (pkm_layers)
            self.ffn = ProductKeyMemory(cfg.d_model, cfg.pkm_keys, cfg.pkm_topk, cfg.pkm_heads,
                                        cfg.pkm_key_dim or cfg.d_model, cfg.initializer_range)
        else:
            self.ffn = MoEFeedForward(
                cfg.d_model, cfg.d_ff, cfg.activation, cfg.moe_experts, cfg.moe_top_k,
                renormalize=cfg.moe_renormalizes, capacity_factor=cfg.moe_capacity_factor,
                expert_capacity=cfg.moe_expert_capacity, jitter=cfg.moe_jitter,
                shared_experts=cfg.moe_shared_experts, bias=cfg.bias, dropout=cfg.ffn_dropout,
            ) if moe else FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias, cfg.ffn_dropout)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer, branch: str | None = None) -> torch.Tensor:
        """One residual branch; ``branch`` (attn | cross | ffn) names Fixup's scalars (default: ffn or attn)."""
        if self.fixup is not None:
            branch = branch or ("ffn" if sublayer is self.ffn else "attn")
            return x + self._drop(self.fixup[branch](x, sublayer))
        if self.rezero is not None:  # norm is Identity unless rezero_norm (lmforge.nn.rezero)
            return x + self._drop(rezero_branch(x, self.rezero, sublayer, norm))
        if self.pre_norm:
            return x + self._drop(sublayer(norm(x)))
        return norm(x + self._drop(sublayer(x)))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.dropout) if self.dropout and self.training else x

    def forward(
        self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None, layer: int = 0
    ) -> torch.Tensor:
        """x (B, T, D), memory (B, S, D) or None -> (B, T, D). ``layer`` indexes the KV cache."""
        if self.weighted:  # one sublayer: the branches take the concatenated heads (attn.o is the identity)
            return self._residual(x, self.attn_norm, lambda h: self.ffn(self.attn(h, ctx, layer=layer)), "attn")
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, ctx, layer=layer), "attn")
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, ctx, memory, layer=layer), "cross")
        return self._residual(x, self.ffn_norm, self.ffn, "ffn")
