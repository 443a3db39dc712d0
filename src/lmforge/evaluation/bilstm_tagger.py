"""BiLSTM tagger: the recurrent sequence-labelling baseline (Huang et al. 2015's BiLSTM, without the CRF layer).

The words of a sentence are embedded, read by a bidirectional LSTM, and every word's two hidden states are
classified by one linear layer; trained with the cross-entropy of each word's tag (padding ignored)::

    ids (B, T) -> embed (B, T, E) -> dropout -> BiLSTM -> h (B, T, 2H) -> dropout -> linear -> logits (B, T, C)

The embedding and LSTM are those of :class:`lmforge.evaluation.bilstm_classifier.BiLSTMClassifier` (packed
sequences: padding never reaches the LSTM, so a sentence gets the same logits alone or in a padded batch); the
classifier reads every position instead of a max-pooled vector. Words are lower-cased and looked up in a
:class:`~lmforge.evaluation.word_vocab.WordVocab` (unseen words read ``<unk>``).

Example:
    >>> import torch
    >>> model = BiLSTMTagger(vocab_size=20, n_labels=3, embed_dim=8, hidden=6)
    >>> ids = torch.tensor([[4, 5, 6], [7, 8, 0]])
    >>> out = model(ids, labels=torch.tensor([[0, 2, 1], [1, 1, -100]]))
    >>> model(ids).logits.shape, out.logits.shape, out.n_targets   # with labels: the labelled words' rows
    (torch.Size([2, 3, 3]), torch.Size([5, 3]), 5)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmforge.evaluation.bilstm_classifier import BiLSTMClassifier
from lmforge.tasks.model import TaskOutput

IGNORE = -100  # the label of padding positions


class BiLSTMTagger(BiLSTMClassifier):
    """Args as :class:`BiLSTMClassifier`; ``n_labels`` is the number of tags."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                features: torch.Tensor | None = None, **_) -> TaskOutput:
        mask = input_ids != 0  # (B, T)
        lengths = mask.sum(1).clamp(min=1)
        x = self.embed_words(input_ids, features)  # (B, T, E [+ F])
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=input_ids.shape[1])
        logits = self.classifier(self.dropout(h))  # (B, T, C)
        if labels is None:
            return TaskOutput(logits)
        n = int((labels != IGNORE).sum())
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        # with labels, the labelled words' logits (n, C) in the order of labels[labels != -100]: the rows the
        # Trainer's evaluation scores against those labels
        return TaskOutput(logits[labels != IGNORE], loss, n)
