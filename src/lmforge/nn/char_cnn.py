"""ELMo's character-CNN token encoder (Peters et al. 2018, §3.4; Kim et al. 2016, "Character-Aware Neural LMs").

A token's context-independent vector is computed from its characters, not looked up in a table, so any
string, including one never seen in training, gets a representation built from the pieces it shares with
known words::

    word "unseen" -> bytes [BOW, u, n, s, e, e, n, EOW, pad ...]          (C,) char ids, C = max_chars
                  -> char embedding                                        (C, d_char)
                  -> for each filter width w: conv1d(w), max over positions, ReLU  -> (n_w,)
                  -> concatenate over widths                               (F,)   F = sum_w n_w
                  -> highway x L:  y = g * relu(W_h x) + (1 - g) * x,  g = sigmoid(W_g x)
                  -> linear projection                                     (D,)

Characters are UTF-8 bytes shifted by one (0 is padding), plus begin- and end-of-word markers, as in ELMo
(its 262 ids: 256 bytes, BOW, EOW, and sentence markers it needs only because it reads whole sentences).
ELMo's biLM uses seven widths 1..7 with 32..1024 filters, two highway layers and a 512-d projection; the
default here is CPU-sized.

Example:
    >>> import torch
    >>> cnn = CharCNN(output_dim=8, filters=((1, 4), (2, 4), (3, 8)), d_char=4)
    >>> ids = char_ids(["cat", "catalogue"], max_chars=12)     # (2, 12)
    >>> ids[0].tolist()
    [257, 100, 98, 117, 258, 0, 0, 0, 0, 0, 0, 0]
    >>> cnn(ids).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

PAD_CHAR, BOW, EOW = 0, 257, 258  # bytes are 1..256
N_CHARS = 259
DEFAULT_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 128))  # (width, filters); ELMo: 1..7, 32..1024


def char_ids(words: Sequence[str], max_chars: int = 50) -> torch.Tensor:
    """(W,) words -> (W, max_chars) long: BOW, UTF-8 bytes + 1 (cut to ``max_chars - 2``), EOW, then 0s."""
    if max_chars < 3:
        raise ValueError(f"max_chars={max_chars} leaves no room for a character between BOW and EOW")
    out = torch.zeros(len(words), max_chars, dtype=torch.long)
    for i, word in enumerate(words):
        codes = [BOW, *(b + 1 for b in word.encode("utf-8")[: max_chars - 2]), EOW]
        out[i, : len(codes)] = torch.tensor(codes)
    return out


class Highway(nn.Module):
    """One highway layer (Srivastava et al. 2015): a gated mix of a transform and the unchanged input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)
        nn.init.constant_(self.proj.bias[dim:], 1.0)  # gates start mostly open to the input: a near-identity start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.proj(x).chunk(2, dim=-1)  # (..., F) each
        g = torch.sigmoid(gate)
        return g * F.relu(h) + (1 - g) * x


class CharCNN(nn.Module):
    """Characters -> one vector per token (see the module docstring).

    Args:
        output_dim: size D of the token vectors.
        filters: ``(width, n_filters)`` pairs of the convolutions.
        n_highway: highway layers after the pooled filters.
        d_char: character embedding size.
    """

    def __init__(self, output_dim: int, filters: Sequence[Sequence[int]] = DEFAULT_FILTERS, n_highway: int = 2,
                 d_char: int = 16) -> None:
        super().__init__()
        self.embed_chars = nn.Embedding(N_CHARS, d_char, padding_idx=PAD_CHAR)
        self.convs = nn.ModuleList(nn.Conv1d(d_char, int(n), int(w)) for w, n in filters)
        n_filters = sum(int(n) for _, n in filters)
        self.highways = nn.ModuleList(Highway(n_filters) for _ in range(n_highway))
        self.proj = nn.Linear(n_filters, output_dim)
        self.min_chars = max(int(w) for w, _ in filters)  # a filter needs at least its width of positions

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        """chars (..., C) long -> (..., D)."""
        lead, C = chars.shape[:-1], chars.shape[-1]
        if C < self.min_chars:
            raise ValueError(f"CharCNN needs at least {self.min_chars} character slots (the widest filter); got {C}")
        x = self.embed_chars(chars.reshape(-1, C)).transpose(1, 2)  # (N, d_char, C)
        # max over positions: the filter's strongest match anywhere in the word
        pooled = torch.cat([F.relu(conv(x).amax(-1)) for conv in self.convs], -1)  # (N, F)
        for highway in self.highways:
            pooled = highway(pooled)
        return self.proj(pooled).view(*lead, -1)  # (..., D)
