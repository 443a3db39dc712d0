"""BiLSTM text classifier: the recurrent baseline that pre-trained Transformers are compared against.

A sentence of word ids is embedded, read by a bidirectional LSTM (Hochreiter & Schmidhuber 1997; bidirectional
as in Graves & Schmidhuber 2005), max-pooled over time (Conneau et al. 2017's InferSent encoder found max
pooling best) and classified by one linear layer::

    ids (B, T) -> embed (B, T, E) -> dropout -> BiLSTM -> h (B, T, 2H) -> max over the real positions (B, 2H)
               -> dropout -> linear -> logits (B, C)

Padding never reaches the LSTM (packed sequences), and padded positions are left out of the max, so a text
gets the same logits alone or in a padded batch. ``feature_dim`` > 0 widens the LSTM's input for per-word
``features`` (B, T, F) concatenated to the embeddings before the dropout: ELMo vectors
(:mod:`lmforge.evaluation.elmo_features`, Peters et al. 2018 §3.3). Trained with cross-entropy by the one Trainer
(:mod:`lmforge.evaluation.baselines`).

Example:
    >>> import torch
    >>> model = BiLSTMClassifier(vocab_size=20, n_labels=3, embed_dim=8, hidden=6)
    >>> out = model(torch.tensor([[4, 5, 6], [7, 8, 0]]), labels=torch.tensor([0, 2]))
    >>> out.logits.shape, out.n_targets
    (torch.Size([2, 3]), 2)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmforge.tasks.model import TaskOutput


class BiLSTMClassifier(nn.Module):
    """Args: ``vocab_size`` words (id 0 = padding), ``n_labels`` classes, ``embed_dim`` E, ``hidden`` H per
    direction, ``layers`` stacked LSTMs, ``dropout`` on the embeddings and on the pooled vector, ``feature_dim``
    F of the per-word ``features`` forward takes (0: none)."""

    def __init__(self, vocab_size: int, n_labels: int, embed_dim: int = 100, hidden: int = 100, layers: int = 1,
                 dropout: float = 0.5, feature_dim: int = 0) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim + feature_dim, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden, n_labels)

    def embed_words(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids [+ (B, T, F) features] -> (B, T, E + F), dropped out: what the LSTM reads."""
        x = self.embed(input_ids)  # (B, T, E)
        if (features is not None) != bool(self.feature_dim):
            raise ValueError(f"this model reads {self.feature_dim or 'no'} feature dimensions; features "
                             f"{'missing' if features is None else tuple(features.shape)}")
        if features is not None:
            x = torch.cat([x, features.to(x.dtype)], -1)  # (B, T, E + F)
        return self.dropout(x)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                features: torch.Tensor | None = None, **_) -> TaskOutput:
        mask = input_ids != 0  # (B, T)
        lengths = mask.sum(1).clamp(min=1)
        x = self.embed_words(input_ids, features)  # (B, T, E [+ F])
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=input_ids.shape[1])  # (B, T, 2H)
        h = h.masked_fill(~mask[..., None], float("-inf")).amax(1)  # (B, 2H)
        logits = self.classifier(self.dropout(h))  # (B, C)
        if labels is None:
            return TaskOutput(logits)
        return TaskOutput(logits, F.cross_entropy(logits.float(), labels), int(labels.numel()))
