"""CNN text classifier (Kim 2014, "Convolutional Neural Networks for Sentence Classification").

Filters of several widths slide over the word vectors; each filter's largest response anywhere in the sentence
("max-over-time pooling") is one feature, and the features go through dropout to a linear classifier::

    ids (B, T) -> embed (B, T, E) -> for each width k: conv1d -> ReLU -> (B, F, T+k-1) -> max over time (B, F)
               -> concat (B, F * n_widths) -> dropout -> linear -> logits (B, C)

Kim's CNN-rand/-static setting: widths 3, 4, 5 with 100 filters each, dropout 0.5. As in Kim's code, a width-k
filter sees the text padded with k - 1 zero vectors on each side, so every word is seen at every offset of a
window (and a text shorter than a filter still has windows); windows that lie wholly in a batch's extra padding
are left out of the max, so a text gets the same logits alone or in a padded batch.

Example:
    >>> import torch
    >>> model = CNNClassifier(vocab_size=20, n_labels=2, embed_dim=8, filters=4, widths=(2, 3))
    >>> model(torch.tensor([[4, 5, 6, 7], [7, 0, 0, 0]])).logits.shape
    torch.Size([2, 2])
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.tasks.model import TaskOutput


class CNNClassifier(nn.Module):
    """Args: ``vocab_size`` words (id 0 = padding), ``n_labels`` classes, ``embed_dim`` E, ``filters`` F per
    width, ``widths`` of the filters, ``dropout`` before the classifier."""

    def __init__(self, vocab_size: int, n_labels: int, embed_dim: int = 100, filters: int = 100,
                 widths: Sequence[int] = (3, 4, 5), dropout: float = 0.5) -> None:
        super().__init__()
        self.widths = tuple(widths)
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, filters, k, padding=k - 1) for k in self.widths)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(filters * len(self.widths), n_labels)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_) -> TaskOutput:
        lengths = (input_ids != 0).sum(1).clamp(min=1)  # (B,)
        x = self.embed(input_ids).transpose(1, 2)  # (B, E, T); the padding id's vector is zero
        pooled = []
        for k, conv in zip(self.widths, self.convs):
            c = F.relu(conv(x))  # (B, F, T+k-1): window j covers words j-k+1 .. j
            ends = torch.arange(c.shape[-1], device=c.device)
            valid = ends[None, :] <= (lengths + k - 2)[:, None]  # (B, T+k-1): the window holds a word of the text
            pooled.append(c.masked_fill(~valid[:, None, :], float("-inf")).amax(-1))  # (B, F)
        logits = self.classifier(self.dropout(torch.cat(pooled, -1)))  # (B, C)
        if labels is None:
            return TaskOutput(logits)
        return TaskOutput(logits, F.cross_entropy(logits.float(), labels), int(labels.numel()))
