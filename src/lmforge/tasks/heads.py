"""Task heads: pooling, sequence classification / regression / multi-label, token tagging, answer spans.

Each head maps the body's hidden states to task logits and owns its loss, returning the number of targets
behind the mean so that the Trainer can weight micro-batches::

    head          input                      logits          loss (targets)
    SequenceHead  (B, T, D) -> pool -> (B, D)  (B, C)          CE (B) | MSE on C=1 (B) | BCE (B*C)
    TokenHead     (B, T, D)                    (B, T, C)       CE over labelled tokens (count != -100)
    SpanHead      (B, T, D)                    (B, T, 2)       (CE(start) + CE(end)) / 2 (2B)

Pooling turns token states into one vector: ``cls`` (the first token: BERT's [CLS]; through the model's
tanh pooler when it has one), ``mean`` over real tokens, ``max`` over real tokens, ``last`` real token (GPT's
[EXTRACT] token; BART's final </s>, whose decoder state has seen the whole input).

Example:
    >>> import torch
    >>> head = SequenceHead(d_model=8, n_outputs=3, pooling="mean")
    >>> h, mask = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    >>> logits = head(h, mask)
    >>> logits.shape
    torch.Size([2, 3])
    >>> loss, n = head.loss(logits, torch.tensor([0, 2]))
    >>> n
    2
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.align.reward import bradley_terry_loss
from lmforge.objectives.base import IGNORE_INDEX
from lmforge.tasks.spec import POOLINGS

PROBLEMS = ("single", "regression", "multi", "pairwise")


def pool(h: torch.Tensor, mask: torch.Tensor | None, mode: str) -> torch.Tensor:
    """(B, T, D) states, (B, T) 1 = real token -> (B, D). Assumes right padding (real tokens first)."""
    if mode not in POOLINGS:
        raise ValueError(f"pooling {mode!r} is not one of {', '.join(POOLINGS)}")
    if mode == "cls":
        return h[:, 0]
    if mask is None:
        mask = torch.ones(h.shape[:2], dtype=torch.long, device=h.device)
    real = mask.to(h.dtype)[..., None]  # (B, T, 1)
    if mode == "mean":
        return (h * real).sum(1) / real.sum(1).clamp(min=1.0)
    if mode == "max":
        return h.masked_fill(real == 0, torch.finfo(h.dtype).min).amax(1)
    last = mask.long().sum(1).clamp(min=1) - 1  # (B,) index of the last real token
    return h[torch.arange(h.shape[0], device=h.device), last]


class SequenceHead(nn.Module):
    """Pool -> (dense -> tanh) -> dropout -> linear: one vector of ``n_outputs`` per sequence.

    Args:
        d_model: width of the body's states.
        n_outputs: classes (``single``/``multi``) or 1 (``regression``).
        pooling: see :func:`pool`.
        problem: ``single`` (softmax CE), ``regression`` (MSE), ``multi`` (sigmoid BCE per class), ``pairwise``
            (a reward model's Bradley-Terry loss over chosen rows followed by rejected rows).
        hidden: a dense + tanh layer before the classifier (BART's and RoBERTa's classification head).
        dropout: dropout before the classifier (BERT uses 0.1).
        use_pooler: with ``cls`` pooling, take the model's own tanh pooler output when given (BERT).
    """

    def __init__(self, d_model: int, n_outputs: int, pooling: str = "cls", problem: str = "single",
                 hidden: bool = False, dropout: float = 0.1, use_pooler: bool = True) -> None:
        super().__init__()
        if problem not in PROBLEMS:
            raise ValueError(f"problem {problem!r} is not one of {', '.join(PROBLEMS)}")
        self.pooling, self.problem, self.use_pooler = pooling, problem, use_pooler
        self.dense = nn.Linear(d_model, d_model) if hidden else None
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_outputs)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                pooled: torch.Tensor | None = None) -> torch.Tensor:
        """h (B, T, D), mask (B, T), pooled (B, D) from the model's pooler (or None) -> logits (B, C)."""
        if self.pooling == "cls" and self.use_pooler and pooled is not None:
            x = pooled
        else:
            x = pool(h, mask, self.pooling)
        return self.classify(x)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """A pooled vector (B, D) -> logits (B, C): the layers after the pooling."""
        if self.dense is not None:
            x = torch.tanh(self.dense(self.dropout(x)))
        return self.out(self.dropout(x))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Mean loss and its number of targets: labels (B,) class ids | (B,) floats | (B, C) 0/1 floats."""
        logits = logits.float()
        if self.problem == "single":
            return F.cross_entropy(logits, labels), int(labels.numel())
        if self.problem == "regression":
            return F.mse_loss(logits.squeeze(-1), labels.float()), int(labels.numel())
        if self.problem == "pairwise":  # 2B scores: the B chosen rows, then the B rejected ones
            scores = logits.squeeze(-1)
            B = scores.shape[0] // 2
            return bradley_terry_loss(scores[:B], scores[B:]), B
        return F.binary_cross_entropy_with_logits(logits, labels.float()), int(labels.numel())


class TokenHead(nn.Module):
    """Dropout -> linear on every token: (B, T, D) -> (B, T, C); CE over tokens whose label is not -100."""

    def __init__(self, d_model: int, n_tags: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_tags)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, pooled=None) -> torch.Tensor:
        return self.out(self.dropout(h))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """labels (B, T) tag ids, -100 on special tokens, padding and non-first sub-tokens."""
        n = int((labels != IGNORE_INDEX).sum())
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        return (loss if n else logits.sum() * 0.0), n


class SpanHead(nn.Module):
    """Start and end logits per token for extractive QA: (B, T, D) -> (B, T, 2); padding gets -inf."""

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, 2)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, pooled=None) -> torch.Tensor:
        logits = self.out(self.dropout(h)).float()  # (B, T, 2)
        if mask is not None:
            logits = logits.masked_fill(mask[..., None] == 0, torch.finfo(logits.dtype).min)
        return logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """labels (B, 2): start and end token index of the answer (both 0, the first token, if it was cut off)."""
        start = F.cross_entropy(logits[..., 0], labels[:, 0])
        end = F.cross_entropy(logits[..., 1], labels[:, 1])
        return (start + end) / 2, int(labels.numel())
