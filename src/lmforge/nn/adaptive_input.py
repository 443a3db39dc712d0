"""Adaptive input embeddings (Baevski & Auli 2019, "Adaptive Input Representations for Neural Language Modeling").

The vocabulary is cut into bands by frequency, ``[0, c_1), [c_1, c_2), ..., [c_{n-1}, V)``. Band i stores its
tokens at width ``d / k**i`` (k = ``adaptive_factor``, 4 in the paper) and projects them up to d:

    embed(t) = W_i E_i[t - c_i]        E_i (c_{i+1} - c_i, d / k**i), W_i (d, d / k**i), t in band i

so the many rare tokens cost few parameters, while the frequent ones keep the full width. Every band has its
projection, the first one too (as in fairseq's ``AdaptiveInput``).

The bands assume **ids sorted by frequency**, most frequent first. lmforge's tokenizers give roughly that, and
not exactly: a byte-level BPE numbers its special tokens, then the 256 bytes (in byte order, rare ones
included), then its merges in the order they were learned, which is the order of pair frequency when each merge
was made; a Unigram vocabulary is ordered by piece score (log-probability); a WordPiece one has no frequency
order. The first band should therefore cover at least the specials and the 256 bytes of a byte-level BPE. How
rough it is: with a 4,096-token byte-level BPE trained on the packaged Austen corpus, ids below 512 carry 59% of
its tokens, 512-2047 30% and the rest 11%, but only 37% of the 512 most frequent tokens have an id below 512
(176 of the 257 specials and bytes never occur), and the merges' ids correlate with frequency rank at 0.5
(Spearman). FLOP counts (``Transformer.train_flops``) leave the bands' projections out, with the tables.

Example:
    >>> import torch
    >>> emb = AdaptiveInput(vocab_size=20, d_model=16, cutoffs=[4, 12], factor=4.0)
    >>> emb.band_dims, emb(torch.tensor([[0, 5, 19]])).shape
    ([16, 4, 1], torch.Size([1, 3, 16]))
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn.init import embedding


def band_widths(d_model: int, n_bands: int, factor: float) -> list[int]:
    """Width of band (or cluster) i: ``int(d_model // factor**i)``, as ``nn.AdaptiveLogSoftmaxWithLoss`` sizes its
    tail clusters.

    Example:
        >>> band_widths(64, 3, 4.0)
        [64, 16, 4]
    """
    return [int(d_model // factor**i) for i in range(n_bands)]


class AdaptiveInput(nn.Module):
    """Token ids (...) -> vectors (..., d_model), one table and projection per frequency band.

    Args:
        vocab_size: V.
        d_model: the output width d.
        cutoffs: the band ends below V, strictly increasing (V closes the last band).
        factor: k; band i has width ``d // k**i``.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: list[int], factor: float = 4.0):
        super().__init__()
        self.edges = [0, *cutoffs, vocab_size]
        self.band_dims = band_widths(d_model, len(self.edges) - 1, factor)
        self.d_model = d_model
        self.bands = nn.ModuleList(
            embedding(hi - lo, dim) for lo, hi, dim in zip(self.edges, self.edges[1:], self.band_dims)
        )
        self.projections = nn.ModuleList(nn.Linear(dim, d_model, bias=False) for dim in self.band_dims)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (...) long -> (..., d_model)."""
        flat = ids.reshape(-1)  # (N,)
        out = None
        for (lo, hi), table, proj in zip(zip(self.edges, self.edges[1:]), self.bands, self.projections):
            rows = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)  # (n_i,) the tokens of this band
            vectors = proj(table(flat.index_select(0, rows) - lo))  # (n_i, d)
            if out is None:  # the projections' dtype (autocast may make it bf16)
                out = vectors.new_zeros(flat.shape[0], self.d_model)
            out = out.index_copy(0, rows, vectors.to(out.dtype))
        return out.view(*ids.shape, self.d_model)
