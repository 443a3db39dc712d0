"""Mixture of softmaxes (Yang et al. 2018, "Breaking the Softmax Bottleneck: A High-Rank RNN Language Model").

One softmax over ``h W^T`` gives a log-probability matrix of rank at most d, whatever the context. A mixture of
K softmaxes, weighted by a learned prior that depends on the context, is not bounded so:

    pi = softmax(W_pi h)                          (K,)   the prior, no bias (as in the authors' code)
    h_k = tanh(W_k h + b_k)                       (K, E) one latent vector per component
    p(t) = sum_k pi_k softmax(h_k W^T + b)[t]            W (V, E): the output embedding, tied or not

The layer returns ``log p`` over the whole vocabulary, (..., V), computed as a logsumexp of
``log pi_k + log_softmax(h_k W^T + b)``: it is normalised, so the cross-entropy of the LM loss is exactly
-log p(target) (the log of the mixture, not a mixture of logs) and generation reads it as logits. Each position
is scored on its own, so decoding with a KV cache gives what a full forward gives.

Example:
    >>> import torch
    >>> mos = MixtureOfSoftmaxes(d_model=16, vocab_size=20, n_experts=3, embed_dim=16, tied=False)
    >>> logp = mos(torch.randn(2, 5, 16))
    >>> logp.shape, bool(torch.allclose(logp.exp().sum(-1), torch.ones(2, 5)))
    (torch.Size([2, 5, 20]), True)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.init import normal_
from lmforge.nn.linear import linear


class MixtureOfSoftmaxes(nn.Module):
    """Hidden states (..., d_model) -> log-probabilities (..., V), a mixture of ``n_experts`` softmaxes.

    Args:
        d_model: the input width D.
        vocab_size: V.
        n_experts: K.
        embed_dim: E, the width of the output embedding (the input embedding's, when tied).
        tied: multiply by the input embedding (passed to :meth:`forward`) rather than an own (V, E) weight.
        bias: a bias on the vocabulary logits, shared by the components.
    """

    def __init__(self, d_model: int, vocab_size: int, n_experts: int, embed_dim: int, tied: bool,
                 bias: bool = False):
        super().__init__()
        self.n_experts, self.embed_dim = n_experts, embed_dim
        self.prior = nn.Linear(d_model, n_experts, bias=False)
        self.latent = nn.Linear(d_model, n_experts * embed_dim)
        self.weight = None if tied else nn.Parameter(normal_(torch.empty(vocab_size, embed_dim), std=0.02))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self, h: torch.Tensor, tied_weight: torch.Tensor | None = None) -> torch.Tensor:
        """h (..., D), ``tied_weight`` (V, E) when tied -> log p (..., V)."""
        weight = self.weight if self.weight is not None else tied_weight
        acc = torch.promote_types(h.dtype, torch.float32)  # never normalise in bf16
        log_prior = F.log_softmax(self.prior(h).to(acc), dim=-1)  # (..., K)
        latent = torch.tanh(self.latent(h)).unflatten(-1, (self.n_experts, self.embed_dim))  # (..., K, E)
        logits = linear(latent, weight.to(latent.dtype), self.bias)  # (..., K, V)
        return torch.logsumexp(log_prior[..., None] + F.log_softmax(logits.to(acc), dim=-1), dim=-2)  # (..., V)
