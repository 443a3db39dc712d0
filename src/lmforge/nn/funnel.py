"""The Funnel Transformer's pieces (Dai et al. 2020, "Funnel-Transformer: Filtering out Sequential Redundancy"):
pooling along the sequence, and the block that attends from the pooled sequence to the full one.

Between two groups of layers the encoder halves its sequence. The first layer of the next group pools the
*queries* only; its keys and values are the unpooled sequence, so the pooled positions still read everything
the last group produced (Dai et al.'s "pool-query-only" attention):

    h' = Pool(h)                                                  (B, ceil(T/2), D)
    h'' = h' + Attention(Q = Norm(h'), K = V = Norm(h))           pre-norm (post-norm: Norm(h' + Attn(h', h)))

    mean pooling     h'_i = mean of h_2i, h_2i+1 over their real (not padded) tokens
    strided pooling  h'_i = h_2i

An odd length keeps its last token alone (ceil(T/2) rows). A pooled position is real when either of its pair
is, so right-padding stays right-padding.

Example:
    >>> import torch
    >>> x = torch.arange(5.0).view(1, 5, 1)
    >>> pooled, keep = pool_sequence(x, torch.tensor([[1, 1, 1, 1, 0]]), "mean")
    >>> pooled.flatten().tolist(), keep.int().tolist()
    ([0.5, 2.5, 0.0], [[1, 1, 0]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.nn.attention import Attention, AttentionContext
from lmforge.nn.block import Block


def pool_sequence(x: torch.Tensor, padding: torch.Tensor | None, mode: str
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (B, T, D), padding (B, T) 1 = real token or None -> (B, ceil(T/2), D), pooled padding (bool) or None."""
    if mode == "strided":
        return x[:, ::2], None if padding is None else padding.bool()[:, ::2]
    B, T, D = x.shape
    keep = torch.ones(B, T, dtype=torch.bool, device=x.device) if padding is None else padding.bool()
    if T % 2:  # the lone last token pairs with a padded nothing
        x, keep = F.pad(x, (0, 0, 0, 1)), F.pad(keep, (0, 1), value=False)
    w = keep.to(x.dtype).view(B, -1, 2, 1)  # (B, T/2, 2, 1)
    pooled = (x.view(B, -1, 2, D) * w).sum(2) / w.sum(2).clamp_min(1.0)  # (B, T/2, D)
    return pooled, None if padding is None else keep.view(B, -1, 2).any(-1)


class PoolQueryBlock(Block):
    """A Transformer layer whose queries are the pooled sequence and whose keys/values are the full one.

    forward(x (B, T', D) pooled, ctx (its ``cross_mask`` (B, 1, 1, T) marks real keys), memory (B, T, D) the
    unpooled input) -> (B, T', D). Same parameters as a :class:`~lmforge.nn.block.Block` (``attn.{q,k,v,o}``).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.attn = Attention(cfg, cross=True)  # queries from x, keys and values from the unpooled sequence

    def forward(self, x: torch.Tensor, ctx: AttentionContext, memory: torch.Tensor | None = None,
                layer: int = 0) -> torch.Tensor:
        # The keys see the same norm the queries get (pre-norm, ReZero + norm), or none (post-norm, plain ReZero).
        kv = memory if not self.pre_norm or isinstance(self.attn_norm, torch.nn.Identity) else self.attn_norm(memory)
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, ctx, kv, layer=layer))
        return self._residual(x, self.ffn_norm, self.ffn)
