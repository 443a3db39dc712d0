"""Padding-free layers: a padded batch's real tokens, packed into one (N, D) matrix while training.

A batch of texts is padded to its longest row, and every per-token sublayer (the attention projections, the
feed-forward, the norms, dropout) then computes the padding's rows too, only for the loss to ignore them. On
rt-sentiment with all-MiniLM-L6-v2's tokenizer, random batches of 16 reviews are 56% real tokens: almost half
of a fine-tuning step's matrix multiplies went to padding. A real token's result does not depend on those
rows; only attention mixes positions, and its mask already keeps padding out.

So a training forward packs the real tokens once, after the embeddings, and every per-token sublayer runs
on the (N, D) matrix of real tokens. Attention alone lays its queries, keys and values out as (B, T, ...)
again, where the mask, relative positions and SDPA expect them, and packs its output before the output
projection. The stack unpacks its final states into the usual (B, T, D) for everything after it (heads,
pooling, losses), which never read the padding. The packed row count is rounded up to a multiple of
:data:`~lmforge.nn.row_buckets.ROW_MULTIPLE` with padding positions of rows that have real tokens, so that the
matrix multiplies meet a few shapes per job rather than a new one every step (:mod:`lmforge.nn.row_buckets`
says why that matters on a CPU); the other padding positions come out as zeros. This is the "unpadding" of
MosaicBERT and of Hugging Face's padding-free ``DataCollatorWithFlattening``, kept inside the model: the data,
its order and the loss are unchanged, and the same real-token states come out up to float rounding.

:class:`~lmforge.models.stack.TransformerStack` packs only when it pays and changes nothing else: in a
training forward (module in train mode, gradients on), without a KV cache, a complete (B, T, S) mask, a
mixture-of-experts layer (whose expert capacity counts the padding too) or torch.compile (whose graphs would
see a new N every batch), and when at most ``PACK_AT_MOST`` of the batch's positions are packed. Evaluation
keeps the padded layout, whose padding rows match Hugging Face's exactly.

Example:
    >>> import torch
    >>> mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # (B, T): 1 for real tokens
    >>> batch = Unpadded.of(mask)
    >>> x = torch.arange(6.0).view(2, 3, 1)  # (B, T, D)
    >>> batch.pack(x).flatten().tolist()  # (N, D): the 5 real rows
    [0.0, 1.0, 3.0, 4.0, 5.0]
    >>> batch.unpack(batch.pack(x)).flatten().tolist()  # (B, T, D), zeros at the padding
    [0.0, 1.0, 0.0, 3.0, 4.0, 5.0]
    >>> Unpadded.if_worth_it(torch.tensor([[1] * 20 + [0] * 80])).index.numel()  # 20 real, 44 spare padding rows
    64
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.nn.row_buckets import ROW_MULTIPLE, with_spare_rows

# Packing costs a gather and a scatter per layer: below ~10% padding they cost about what they save.
PACK_AT_MOST = 0.9


@dataclass(frozen=True)
class Unpadded:
    """Where a (B, T) batch's packed rows sit: ``index`` (N,) into its B*T flattened positions."""

    index: torch.Tensor
    batch: int
    length: int

    @classmethod
    def of(cls, padding: torch.Tensor) -> Unpadded:
        """From a (B, T) mask with 1 (or True) for real tokens."""
        B, T = padding.shape
        return cls(padding.reshape(-1).nonzero().squeeze(1), B, T)

    @classmethod
    def if_worth_it(cls, padding: torch.Tensor, at_most: float = PACK_AT_MOST,
                    multiple: int = ROW_MULTIPLE) -> Unpadded | None:
        """The real tokens and enough spare padding positions to make N a multiple of ``multiple``; None when
        that is more than ``at_most`` of the positions (packing would not pay)."""
        real = padding.bool()  # (B, T)
        # Spare rows come from rows with a real token: a padding query there still has keys to attend to.
        index = with_spare_rows(real, multiple, spare=real.any(1, keepdim=True).expand_as(real))
        if index.numel() > at_most * real.numel():
            return None
        return cls(index, *real.shape)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (N, C): the real tokens' rows."""
        return x.reshape(self.batch * self.length, -1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) -> (B, T, C), zeros at the padding."""
        flat = x.new_zeros(self.batch * self.length, x.shape[-1]).index_copy(0, self.index, x)
        return flat.view(self.batch, self.length, -1)
