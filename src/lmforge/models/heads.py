"""Output heads: the LM head, BERT's MLM head, the pooler and BERT's next-sentence head.

- :class:`LMHead` maps hidden states to vocabulary logits, ``(B, T, D) -> (B, T, V)``. Tied to the
  input embeddings by default (Press & Wolf 2017), in which case it owns no weight: the caller passes
  the embedding matrix. T5 v1.0 rescales the decoder output by d_model**-0.5 before its tied head.
- :class:`MLMHead` is BERT's prediction head: dense -> activation -> LayerNorm -> (tied) decoder + bias.
- :class:`RTDHead` is ELECTRA's discriminator head: dense -> activation -> one logit per token,
  ``(B, T, D) -> (B, T)``, > 0 meaning "this token was replaced".
- :class:`Pooler` is BERT's sentence vector: tanh(dense(h[:, 0])), ``(B, T, D) -> (B, D)``.
- :class:`NSPHead` is BERT's next sentence prediction classifier (Devlin et al. 2019, §3.1 "Task #2"): one
  linear layer from the pooler output to two logits, ``(B, D) -> (B, 2)``, class 0 = IsNext, 1 = NotNext
  (HF ``BertForPreTraining.cls.seq_relationship``). Its loss is the mean cross-entropy over the pairs.

Example:
    >>> import torch
    >>> head = LMHead(d_model=8, vocab_size=20, embed_dim=8, tied=False)
    >>> head(torch.randn(2, 3, 8)).shape
    torch.Size([2, 3, 20])
    >>> NSPHead(d_model=8)(Pooler(8)(torch.randn(2, 3, 8))).shape  # (B, 2): IsNext / NotNext logits
    torch.Size([2, 2])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.activations import activation_fn
from lmforge.nn.init import normal_
from lmforge.nn.linear import linear
from lmforge.nn.norms import build_norm
from lmforge.nn.weight_only import WeightOnlyEmbedding

# On a GPU the vocabulary projection runs over a weight padded to this many rows: with a width like GPT-2's 50257
# every output row is misaligned, and cuBLAS falls back to kernels that move one element at a time (on an H100 the
# GPT-2 head and its two backward matmuls took 30 ms of a 66 ms training step; nanoGPT pads its vocabulary to
# 50304 for the same reason). The padded logits are sliced off, so nothing else sees them. A decode step's few
# rows are a matrix-vector product, which alignment hardly changes: they skip the copy of the padded weight.
GPU_VOCAB_MULTIPLE = 64
GPU_PAD_MIN_ROWS = 64


def vocab_projection(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     multiple: int | None = None) -> torch.Tensor:
    """``linear(h, weight, bias)``: h (..., E), weight (V, E) -> logits (..., V). ``multiple``: pad V up to a
    multiple of it for the matmul and return a view of the first V columns (default: 64 on a GPU for at least 64
    rows, no padding on a CPU). Values and gradients are those of the unpadded product.

    Example:
        >>> h, w = torch.randn(2, 3, 8), torch.randn(11, 8)
        >>> out = vocab_projection(h, w, multiple=16)
        >>> out.shape, out.stride()[-2], torch.allclose(out, h @ w.T, atol=1e-6)
        (torch.Size([2, 3, 11]), 16, True)
    """
    if multiple is None:
        few_rows = h.numel() < GPU_PAD_MIN_ROWS * h.shape[-1]
        multiple = 1 if h.device.type == "cpu" or few_rows else GPU_VOCAB_MULTIPLE
    V = weight.shape[0]
    pad = -V % multiple
    if pad == 0:
        return linear(h, weight, bias)
    weight = F.pad(weight, (0, 0, 0, pad))  # (V + pad, E): zero rows
    bias = None if bias is None else F.pad(bias, (0, pad))
    return F.linear(h, weight, bias)[..., :V]


class LMHead(nn.Module):
    def __init__(
        self, d_model: int, vocab_size: int, embed_dim: int, tied: bool, bias: bool = False, scale: bool = False
    ):
        super().__init__()
        # With factorised embeddings (E < D) a tied head first maps D back down to E.
        self.proj = nn.Linear(d_model, embed_dim, bias=False) if tied and embed_dim != d_model else None
        self.weight = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.scale = d_model**-0.5 if scale else 1.0
        if self.weight is not None:
            normal_(self.weight, std=0.02)

    def forward(self, h: torch.Tensor, tied_weight: torch.Tensor | WeightOnlyEmbedding | None = None) -> torch.Tensor:
        """h (..., D) -> logits (..., V); ``tied_weight`` (V, E) is the input embedding when tied (a quantised
        table multiplies with its own kernels)."""
        if self.scale != 1.0:
            h = h * self.scale
        if self.proj is not None:
            h = self.proj(h)
        if isinstance(tied_weight, WeightOnlyEmbedding) and self.weight is None:
            logits = tied_weight.project(h)
            return logits if self.bias is None else logits + self.bias.to(logits.dtype)
        weight = self.weight if self.weight is not None else tied_weight
        return vocab_projection(h, weight, self.bias)


class MLMHead(nn.Module):
    def __init__(
        self, d_model: int, vocab_size: int, embed_dim: int, activation: str, norm: str, eps: float, tied: bool
    ):
        super().__init__()
        self.dense = nn.Linear(d_model, embed_dim)
        self.act = activation_fn(activation)
        self.norm = build_norm(norm, embed_dim, eps)
        self.decoder = None if tied else nn.Linear(embed_dim, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: torch.Tensor, tied_weight: torch.Tensor | None = None) -> torch.Tensor:
        """h (..., D) -> logits (..., V)."""
        h = self.norm(self.act(self.dense(h)))
        weight = self.decoder.weight if self.decoder is not None else tied_weight
        return vocab_projection(h, weight, self.bias)


class RTDHead(nn.Module):
    """ELECTRA's replaced-token detection head (HF ``ElectraDiscriminatorPredictions``): the logit of
    P(token t was replaced) = sigmoid(w . act(W h_t + b) + c)."""

    def __init__(self, d_model: int, activation: str):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_fn(activation)
        self.prediction = nn.Linear(d_model, 1)

    def forward(self, h: torch.Tensor, tied_weight: torch.Tensor | None = None) -> torch.Tensor:
        """h (..., D) -> logits (...); ``tied_weight`` is unused (the head owns its weights)."""
        return self.prediction(self.act(self.dense(h))).squeeze(-1)


class Pooler(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, D)
        return torch.tanh(self.dense(h[:, 0]))


class NSPHead(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # (B, D) -> (B, 2)
        return self.classifier(pooled)
