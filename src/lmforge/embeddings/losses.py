"""Sentence-embedding losses (Sentence-BERT, Reimers & Gurevych 2019).

    loss                               inputs                                   labels
    triplet_loss                       anchor a, positive p, negative n  (B,D)  none
    multiple_negatives_ranking_loss    anchor a, positive p (B,D) [+ hard n]    none (row i matches row i)
    cosine_similarity_loss             u, v (B,D)                               score in [-1, 1] or {0, 1}
    softmax_loss (SoftmaxClassifier)   u, v (B,D)                               class index in [0, k)

* Triplet: ``max(||a - p|| - ||a - n|| + eps, 0)``, Euclidean distance, eps = 1 as in SBERT.
* Multiple negatives ranking (in-batch negatives, Henderson et al. 2017): every other positive in the batch
  is a negative, so a batch of B pairs gives B-1 negatives per anchor for free. It is the cross-entropy of
  ``scale * cos(a_i, p_j)`` over j with target j = i; optional hard negatives add B more columns.
* Cosine similarity: ``MSE(cos(u, v), label)`` (SBERT's regression objective for STS).
* Softmax (SBERT's classification objective, §3, for NLI): ``o = softmax(W [u; v; |u - v|])`` with a trained
  W of shape (k, 3D), and the cross-entropy of o against the label. The element-wise difference |u - v| was the
  most important part of the concatenation in SBERT's ablation (Table 6). W belongs to the training run only:
  the saved model is the encoder.

Example:
    >>> import torch
    >>> a, p, n = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    >>> float(triplet_loss(a, a, n + 100)) == 0.0     # positive at distance 0, negative far: no loss
    True
    >>> multiple_negatives_ranking_loss(a, p).shape
    torch.Size([])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import UserInputError


def triplet_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                 margin: float = 1.0) -> torch.Tensor:
    """Mean over the batch of ``max(||a - p||_2 - ||a - n||_2 + margin, 0)``; inputs (B, D)."""
    d_pos = (anchor - positive).norm(dim=-1)  # (B,)
    d_neg = (anchor - negative).norm(dim=-1)
    return F.relu(d_pos - d_neg + margin).mean()


def multiple_negatives_ranking_loss(anchor: torch.Tensor, positive: torch.Tensor,
                                    negative: torch.Tensor | None = None, scale: float = 20.0) -> torch.Tensor:
    """Cross-entropy over the (B, B[+B]) cosine-similarity matrix with the diagonal as the targets.

    ``scale`` (a temperature of 1/20, as in sentence-transformers) sharpens the softmax: cosines live in
    [-1, 1], too narrow a range for a confident distribution otherwise.
    """
    candidates = positive if negative is None else torch.cat([positive, negative], 0)  # (B or 2B, D)
    sims = F.normalize(anchor, dim=-1) @ F.normalize(candidates, dim=-1).T * scale     # (B, B or 2B)
    return F.cross_entropy(sims, torch.arange(anchor.size(0), device=anchor.device))


def cosine_similarity_loss(u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``mean((cos(u_i, v_i) - label_i)^2)``; inputs (B, D), labels (B,)."""
    return F.mse_loss(F.cosine_similarity(u, v, dim=-1), labels.to(u.dtype))


class SoftmaxClassifier(nn.Module):
    """SBERT's NLI classifier over a sentence pair's embeddings: logits ``W [u; v; |u - v|] + b``.

    Args:
        dim: embedding size D.
        num_labels: classes k (3 for NLI: entailment, neutral, contradiction).

    Example:
        >>> clf = SoftmaxClassifier(dim=4, num_labels=3)
        >>> u, v = torch.randn(2, 4), torch.randn(2, 4)
        >>> clf(u, v).shape, clf.linear.in_features
        (torch.Size([2, 3]), 12)
    """

    def __init__(self, dim: int, num_labels: int) -> None:
        super().__init__()
        if num_labels < 2:
            raise UserInputError(f"the softmax loss classifies pairs into num_labels >= 2 classes (got {num_labels})")
        self.linear = nn.Linear(3 * dim, num_labels)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        features = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3D)
        return self.linear(features.to(self.linear.weight.dtype))  # (B, k)


def softmax_loss(u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor, classifier: SoftmaxClassifier) -> torch.Tensor:
    """SBERT's classification objective: ``CE(W [u; v; |u - v|] + b, label)``, mean over the B pairs; u, v
    (B, D), labels (B,) class indices."""
    return F.cross_entropy(classifier(u, v), labels.long())


LOSSES = {"mnrl": multiple_negatives_ranking_loss, "triplet": triplet_loss, "cosine": cosine_similarity_loss,
          "softmax": softmax_loss}
EMBEDDING_LOSSES = tuple(LOSSES)  # the names, default (in-batch negatives) first: flags and checks use these


def loss_function(name: str):
    """The loss called ``name`` (one of :data:`EMBEDDING_LOSSES`); another name is a UserInputError."""
    if name not in LOSSES:
        raise UserInputError(f"loss={name!r}: use one of {', '.join(EMBEDDING_LOSSES)}")
    return LOSSES[name]
