"""Input embeddings of one stack: token vectors plus absolute positions and segments.

    x = dropout(proj(norm(scale * tok + pos + seg)))

- ``scale`` = sqrt(d_model) when ``scale_embeddings`` (Vaswani et al.), else 1.
- ``pos``: sinusoidal or learned absolute positions (relative schemes act in attention instead).
- ``seg``: token-type (segment A/B) embeddings, BERT's sentence-pair input.
- ``norm``: LayerNorm over the sum (BERT, BART's ``layernorm_embedding``).
- ``proj``: ALBERT's factorised embeddings keep tables at width E < d_model and project up once,
  cutting the V x d_model embedding matrix to V x E + E x d_model.

The token table itself belongs to the model, not the stack, so an encoder and a decoder can share it.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10, embedding_dim=16)
    >>> emb = StackEmbeddings(cfg)
    >>> emb(torch.randn(2, 5, 16), torch.arange(5)[None]).shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.dropout import dropout
from lmforge.nn.init import embedding
from lmforge.nn.norms import build_norm
from lmforge.nn.positions.learned import LearnedPositions
from lmforge.nn.positions.sinusoidal import SinusoidalPositions


class StackEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = cfg.embed_dim
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.positions: nn.Module | None = None
        if cfg.position == "learned":
            self.positions = LearnedPositions(cfg.max_seq_len, width, cfg.position_offset)
        elif cfg.position == "sinusoidal":
            self.positions = SinusoidalPositions(cfg.max_seq_len, width)
        self.token_types = embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.norm = build_norm(cfg.norm, width, cfg.layer_norm_eps, cfg.bias) if cfg.embedding_norm else None
        self.proj = nn.Linear(width, cfg.d_model, bias=cfg.bias) if width != cfg.d_model else None
        self.dropout = cfg.dropout

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens (B, T, E) already looked up; position_ids (B|1, T) -> (B, T, D)."""
        x = tokens * self.scale if self.scale != 1.0 else tokens
        if self.positions is not None:
            x = x + self.positions(position_ids)
        if self.token_types is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
            x = x + self.token_types(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        if self.dropout and self.training:
            x = dropout(x, self.dropout)
        if self.proj is not None:
            x = self.proj(x)
        return x
