"""DeBERTa's disentangled attention (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", eq. 2-4), with the log-bucketed relative positions of DeBERTa-v2/v3.

A token is represented by two vectors, its content ``H_i`` and the relative position ``P_d`` of every
other token as seen from it. The attention logit of query i and key j sums three of the four cross terms:

    A_ij = Qc_i . Kc_j           content -> content      Qc = H W_q,    Kc = H W_k
         + Qc_i . Kr_d(i,j)      content -> position     Kr = P W_k,r   (c2p)
         + Kc_j . Qr_d(i,j)      position -> content     Qr = P W_q,r   (p2c)

and is scaled by 1/sqrt(3 hd) (1/sqrt(2 hd) with one position term): three terms of variance ~hd each.
``pos_att_type`` picks the position terms (``"c2p|p2c"``, ``"c2p"``, ``"p2c"``). As in the authors' code
(and Hugging Face), both position terms read the row of the same bucketed distance ``i - j``.

The table P of relative-position vectors is one per stack, shared by every layer (v2/v3 LayerNorm it,
``norm_rel_embeddings``); each layer projects it with its own matrices, or with its own W_q and W_k
when ``share_att_key`` (v2/v3), which adds no parameters at all.

Distances: exact within +-buckets/2, then log-spaced so that ``max_relative_positions - 1`` reaches
the last bucket (:func:`log_bucket_position`); the table has ``2 k`` rows (k = ``position_buckets``, or
``max_relative_positions`` without buckets), row ``clip(bucket + k, 0, 2k - 1)``. Since every term is
an additive logit bias, the layer still runs SDPA (see :mod:`lmforge.nn.attention`).

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(arch="encoder", d_model=32, n_heads=4, d_ff=64, vocab_size=50, position="deberta",
    ...                   position_buckets=8, max_relative_positions=16)
    >>> log_bucket_position(torch.tensor([0, 3, 4, 5, 9, 15, 40, -40]), buckets=8, max_position=16).tolist()
    [0, 3, 4, 5, 6, 7, 10, -10]
    >>> table, index = RelativeEmbeddings(cfg)(torch.arange(5), torch.arange(5))
    >>> table.shape, index.shape                          # (2k, D), (T, S)
    (torch.Size([16, 32]), torch.Size([5, 5]))
    >>> q = k = torch.randn(2, 4, 5, 8)                   # (B, H, T, hd)
    >>> proj = torch.nn.Linear(32, 32)
    >>> DisentangledBias(cfg)(q, k, table, index, scale=(8 * 3) ** -0.5, q_proj=proj, k_proj=proj).shape
    torch.Size([2, 4, 5, 5])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.dropout import dropout
from lmforge.nn.init import normal_
from lmforge.nn.linear import apply_linear


def log_bucket_position(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Signed distances (any shape, long) -> DeBERTa-v2 buckets: ``d`` itself when ``|d| <= buckets // 2``,
    else ``sign(d) * (mid + ceil(log(|d| / mid) / log((max_position - 1) / mid) * (mid - 1)))``.

    Computed in fp32 in the reference's order, so a distance on a bucket edge rounds the same way."""
    mid = buckets // 2
    distance = relative.abs()
    # clamp(min=mid): the exact branch below discards these values; the clamp only keeps log() finite.
    ratio = distance.clamp(min=mid) / mid
    log_span = torch.log(torch.tensor((max_position - 1) / mid))
    far = torch.ceil(torch.log(ratio) / log_span * (mid - 1)) + mid  # (…) float
    return torch.where(distance <= mid, relative, (far * relative.sign()).long())


def relative_index(q_pos: torch.Tensor, k_pos: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """q_pos (T,), k_pos (S,) -> (T, S) rows of the 2k-row table for the distance ``i - j``."""
    span = buckets if buckets > 0 else max_position
    relative = q_pos[:, None] - k_pos[None, :]  # (T, S)
    if buckets > 0:
        relative = log_bucket_position(relative, buckets, max_position)
    return (relative + span).clamp(0, 2 * span - 1)


class RelativeEmbeddings(nn.Module):
    """The stack's table P (2k, D) of relative-position vectors, optionally layer-normed, and the (T, S)
    row each query/key pair reads. One per stack: every layer projects the same table."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.buckets, self.max_position = cfg.position_buckets, cfg.max_relative_positions
        span = self.buckets if self.buckets > 0 else self.max_position
        self.weight = nn.Parameter(torch.empty(2 * span, cfg.d_model))
        normal_(self.weight, std=cfg.initializer_range)
        self.norm = nn.LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.norm_rel_embeddings else None

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_pos (T,), k_pos (S,) -> table (2k, D), index (T, S)."""
        table = self.norm(self.weight) if self.norm is not None else self.weight
        return table, relative_index(q_pos, k_pos, self.buckets, self.max_position)


class DisentangledBias(nn.Module):
    """One layer's position terms (c2p, p2c) as an additive logit bias (B, H, T, S).

    Owns the position projections W_k,r / W_q,r (``pos_k``, ``pos_q``) unless ``share_att_key``, in which
    case the layer's own ``q``/``k`` projections are passed in and reused."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.terms = tuple(cfg.pos_att_type.split("|"))
        self.dropout = cfg.dropout
        inner = cfg.n_heads * cfg.dim_per_head
        own = not cfg.share_att_key
        self.pos_k = nn.Linear(cfg.d_model, inner, bias=cfg.bias) if own and "c2p" in self.terms else None
        self.pos_q = nn.Linear(cfg.d_model, inner, bias=cfg.bias) if own and "p2c" in self.terms else None

    @property
    def scale_factor(self) -> int:
        """How many score terms the logit sums (1 + position terms): the logits are scaled by 1/sqrt(factor hd)."""
        return 1 + len(self.terms)

    def forward(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, index: torch.Tensor, scale: float,
                q_proj: nn.Module, k_proj: nn.Module) -> torch.Tensor:
        """q (B, H, T, hd), k (B, Hkv, S, hd), table (2k, D), index (T, S) -> scale * (c2p + p2c) (B, H, T, S).

        With grouped keys (Hkv < H) each key head, and each position-key head projected by a shared W_k,
        serves its group of query heads."""
        B, H, T, hd = q.shape
        S = k.shape[2]
        if self.dropout and self.training:
            table = dropout(table, self.dropout)
        table = table.to(q.dtype)

        def heads(x: torch.Tensor, dim: int) -> torch.Tensor:  # n heads along ``dim`` -> H heads
            n = x.shape[dim]
            return x if n == H else x.repeat_interleave(H // n, dim=dim)

        def per_head(proj: nn.Module) -> torch.Tensor:  # (2k, D) -> (H, 2k, hd)
            return heads(apply_linear(proj, table).view(table.shape[0], -1, hd).transpose(0, 1), 0)

        bias = q.new_zeros(())
        if "c2p" in self.terms:
            pos_k = per_head(k_proj if self.pos_k is None else self.pos_k)  # (H, 2k, hd)
            rows = q @ pos_k.transpose(-1, -2)  # (B, H, T, 2k): q_i . Kr_r for every row r
            bias = bias + rows.gather(-1, index.expand(B, H, T, S))
        if "p2c" in self.terms:
            pos_q = per_head(q_proj if self.pos_q is None else self.pos_q)  # (H, 2k, hd)
            rows = heads(k, 1) @ pos_q.transpose(-1, -2)  # (B, H, S, 2k): k_j . Qr_r
            bias = bias + rows.gather(-1, index.t().expand(B, H, S, T)).transpose(-1, -2)  # (B, H, T, S)
        return bias * scale
