"""A BiLSTM between an encoder and its task head: BERT's feature-based ablation (Devlin et al. 2019, Table 7).

BERT's NER experiment without fine-tuning the body feeds the pre-trained states to "a randomly initialized
two-layer 768-dimensional BiLSTM before the classification layer". ``TaskSpec.head_bilstm = LAYERS`` puts
that BiLSTM under every head task's own head::

    encoder states (B, T, D) -> BiLSTM, LAYERS deep, H per direction -> (B, T, 2H) -> the task's head
                                                                          (pool -> classify | per token | spans)

``H`` is ``TaskSpec.head_bilstm_hidden`` (default D / 2, so the head sees states as wide as the body's; the
paper's 768 per direction on BERT-base is ``head_bilstm_hidden: 768``). With ``freeze_body`` it is the
paper's feature-based set-up (it reads the last layer only; the paper's best row concatenates the last
four). Fine-tuning the body with it is allowed too.

Padding never reaches the BiLSTM: each sequence runs packed to its own length (right padding, as the task
collators write it), so a state at a real position is the same with or without padding after it, and the
backward direction starts at the last real token. Padded positions come out as zeros. A head reading
``cls`` pools the BiLSTM's first state, not the body's pooler (the pooler summarises the body's [CLS]).

Example:
    >>> import torch
    >>> feats = BiLSTMFeatures(d_model=8, layers=2)
    >>> h, mask = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    >>> with torch.no_grad():
    ...     out = feats(h, mask)
    >>> out.shape, float(out[0, 3:].abs().sum())
    (torch.Size([2, 5, 8]), 0.0)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class BiLSTMFeatures(nn.Module):
    """(B, T, D) states, (B, T) mask -> (B, T, 2H) BiLSTM states; PyTorch's default (uniform) initialisation.

    Args:
        d_model: width of the body's states.
        layers: BiLSTM layers (the paper: 2).
        hidden: units per direction (default ``d_model // 2``).
    """

    def __init__(self, d_model: int, layers: int = 2, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or max(d_model // 2, 1)
        self.lstm = nn.LSTM(d_model, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.width = 2 * hidden

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return self.lstm(h)[0]
        real = mask.bool()
        if bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError("BiLSTMFeatures needs right padding (each row's real tokens first)")
        T = h.shape[1]
        lengths = real.sum(1).clamp(min=1).cpu()  # (B,) an all-padding row runs its first token only
        packed = pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=T)  # (B, T, 2H)
        return out * real[..., None].to(out.dtype)


class BiLSTMHead(nn.Module):
    """``bilstm`` (:class:`BiLSTMFeatures`) then ``head`` (a Sequence/Token/Span head built for width 2H).

    It answers as the inner head does (``forward(h, mask, pooled)``, ``loss``, ``pooling``, ``classify``), so a
    :class:`~lmforge.tasks.model.TaskModel` runs it unchanged; its weights save with the head's.
    """

    def __init__(self, bilstm: BiLSTMFeatures, head: nn.Module) -> None:
        super().__init__()
        self.bilstm, self.head = bilstm, head

    @property
    def pooling(self) -> str | None:
        return getattr(self.head, "pooling", None)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, pooled=None) -> torch.Tensor:
        # The body's pooler read the body's [CLS]; the head pools the BiLSTM's states instead.
        return self.head(self.bilstm(h, mask), mask)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.classify(x)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        return self.head.loss(logits, labels)
