"""The Funnel Transformer's encoder (Dai et al. 2020): groups of layers on a sequence halved between groups, and
an upsampling decoder back to one vector per token.

    ``funnel_blocks: [2, 2, 2]``, T = 16:
    embed (16) -> 2 layers (16) -> pool -> 2 layers (8) -> pool -> 2 layers (4)
        -> repeat each row 4x to 16, + the first group's output (16) -> ``funnel_decoder_layers`` layers (16)

The first layer of each later group attends from the pooled queries to the unpooled keys and values
(:class:`~lmforge.nn.funnel.PoolQueryBlock`). Most layers run on a shorter sequence, which is the saving the
paper spends on a deeper or wider encoder. Token-level heads (MLM, ELECTRA's detector) need a vector per input
token: the decoder repeats the last group's rows 2^(G-1) times, adds the first group's full-length output as a
residual, and runs ``funnel_decoder_layers`` ordinary layers (Dai et al. use 2). With
``funnel_decoder_layers=0`` the stack returns the compressed sequence (B, ceil(T/2^(G-1)), D) for
sequence-level use (``head="none"``). In an encoder-decoder the decoder cross-attends to the upsampled sequence,
one vector per source token, so its source mask is the input's padding mask.

Positions are absolute only (learned or sinusoidal, added at the input): Dai et al.'s relative attention
across pooled lengths is not built. A complete (B, T, S) attention mask cannot be pooled and is refused; a
(B, T) padding mask is pooled with the sequence.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(arch="encoder", head="mlm", d_model=16, n_heads=2, d_ff=32, vocab_size=10, n_layers=4,
    ...                   funnel_blocks=[2, 2])
    >>> h, _ = FunnelStack(cfg)(torch.randn(2, 7, 16))
    >>> h.shape
    torch.Size([2, 7, 16])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import UserInputError
from lmforge.nn.attention import AttentionContext
from lmforge.nn.block import Block
from lmforge.nn.embeddings import StackEmbeddings
from lmforge.nn.funnel import PoolQueryBlock, pool_sequence
from lmforge.nn.masks import build_mask
from lmforge.nn.norms import build_norm


class FunnelStack(nn.Module):
    """The encoder stack of a ``funnel_blocks`` model; the same call as :class:`~lmforge.models.stack.
    TransformerStack` (tokens (B, T, E) -> (B, T, D), hidden states), without a KV cache or cross-attention.

    ``layers`` holds the groups' layers in order, then the decoder's.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.groups, self.pool, self.n_up = list(cfg.funnel_blocks), cfg.funnel_pool, cfg.funnel_decoder_layers
        self.n_layers = sum(self.groups) + self.n_up
        self.embed = StackEmbeddings(cfg)
        self.layers = nn.ModuleList()
        for g, n in enumerate(self.groups):
            for j in range(n):
                self.layers.append(PoolQueryBlock(cfg) if g > 0 and j == 0 else Block(cfg))
        self.layers.extend(Block(cfg) for _ in range(self.n_up))
        self.final_norm = build_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.bias) if cfg.final_norm else None

    def packing(self, padding: torch.Tensor | None) -> None:
        """The layers always run padded (pooling needs the (B, T) layout)."""
        return None

    def lengths(self, seq_len: int) -> list[tuple[int, int]]:
        """(queries, keys) of each layer in ``layers`` for an input of ``seq_len`` tokens.

        Example:
            >>> from lmforge.config import ModelConfig
            >>> cfg = ModelConfig(arch="encoder", head="mlm", n_layers=4, funnel_blocks=[2, 2])
            >>> FunnelStack(cfg).lengths(9)
            [(9, 9), (9, 9), (5, 9), (5, 5), (9, 9), (9, 9)]
        """
        out, T = [], seq_len
        for g, n in enumerate(self.groups):
            for j in range(n):
                if g > 0 and j == 0:
                    out.append(((T + 1) // 2, T))
                    T = (T + 1) // 2
                else:
                    out.append((T, T))
        return out + [(seq_len, seq_len)] * self.n_up

    def train_flops(self, seq_len: int) -> int:
        """Training FLOPs of the layers for one sequence: 6 x weights x the tokens each weight multiplies (a pooling
        layer's key and value projections read the unpooled keys), plus 12 x d_attn per query-key pair."""
        total = 0
        for block, (tq, tk) in zip(self.layers, self.lengths(seq_len), strict=True):
            kv = sum(p.numel() for m in (block.attn.k, block.attn.v) for p in m.parameters())
            rest = sum(p.numel() for p in block.parameters()) - kv
            d_attn = block.attn.n_heads * block.attn.head_dim
            total += 6 * (rest * tq + kv * tk) + 12 * d_attn * tq * tk
        return total

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None, cache=None,
                output_hidden_states: bool = False, attentions: list[torch.Tensor] | None = None,
                cross_attentions: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """tokens (B, T, E), attention_mask (B, T) 1 = real token -> (B, T, D) (compressed without a decoder)."""
        if attention_mask is not None and attention_mask.dim() != 2:
            raise UserInputError("a Funnel Transformer pools its sequence, so it takes a (B, T) padding mask only; "
                                 f"got a mask of shape {tuple(attention_mask.shape)}")
        if memory is not None or cache is not None:
            raise UserInputError("a Funnel Transformer stack is an encoder: it takes no memory and no KV cache")
        B, T, _ = tokens.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=tokens.device)[None]  # (1, T)
        x = self.embed(tokens, position_ids, token_type_ids)  # (B, T, D)
        padding = attention_mask
        hidden = [x] if output_hidden_states else None
        layers = iter(self.layers)
        first = None  # the first group's output, the decoder's residual
        for g, n in enumerate(self.groups):
            for j in range(n):
                block = next(layers)
                if g > 0 and j == 0:
                    keys = None if padding is None else padding.bool()[:, None, None, :]  # (B, 1, 1, T)
                    pooled, padding = pool_sequence(x, padding, self.pool)
                    x = block(pooled, AttentionContext(cross_mask=keys, cross_attentions=attentions), x)
                else:
                    x = block(x, self._context(x.shape[1], padding, attentions))
                if hidden is not None:
                    hidden.append(x)
            if g == 0:
                first = x
        if self.n_up:
            up = x.repeat_interleave(2 ** (len(self.groups) - 1), dim=1)[:, :T]  # (B, T, D)
            x = up + first
            for block in layers:
                x = block(x, self._context(T, attention_mask, attentions))
                if hidden is not None:
                    hidden.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden is not None:
                hidden[-1] = x
        return x, hidden

    @staticmethod
    def _context(length: int, padding: torch.Tensor | None, attentions) -> AttentionContext:
        device = padding.device if padding is not None else None
        return AttentionContext(mask=build_mask(length, length, False, padding, device=device), attentions=attentions)
