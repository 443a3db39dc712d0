"""The Weighted Transformer's branched attention (Ahmed et al. 2017, "Weighted Transformer Network for Machine
Translation").

Multi-head attention concatenates its heads and projects them together. The Weighted Transformer keeps each
head as a branch of its own, through its own output projection and its own feed-forward network, and learns
how much each branch counts:

    head_i       = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      (B, T, hd)
    branch_i     = kappa_i * head_i W_i^O                                    (B, T, D)
    BranchedAttn = sum_i alpha_i FFN_i(branch_i)                             (B, T, D)
    kappa = softmax(k), alpha = softmax(a)    (positive, each summing to 1; k, a learned, initialised at 0)

``weighted_branches=True`` replaces a block's attention output projection and its feed-forward sublayer by
these branches, so a block is one residual sublayer, ``x + BranchedAttn(Norm(x))`` (pre-norm), as in the
reference implementations, which wrap the whole branched attention in one residual and norm. Every branch has
a full ``d_ff`` network, as Narang et al. 2021 ran it (280M parameters against the baseline's 223M): the block
costs about ``n_heads`` times the feed-forward FLOPs. The branch FFNs are stacked like a mixture of experts'
(:class:`~lmforge.nn.moe.Experts`), with every token sent to every branch.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=10, weighted_branches=True)
    >>> WeightedBranches(cfg)(torch.randn(3, 5, 16)).shape  # the concatenated heads (B, T, H hd)
    torch.Size([3, 5, 16])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.init import normal_
from lmforge.nn.moe import Experts


class WeightedBranches(nn.Module):
    """Concatenated heads (..., H hd) -> (..., D): per-head output projections, kappa, FFNs, alpha.

    Parameters: ``out`` (H, hd, D) (each head's W_i^O), ``kappa`` and ``alpha`` (H,) logits, ``experts``
    (the H branch FFNs).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.dim_per_head
        self.out = nn.Parameter(torch.empty(cfg.n_heads, cfg.dim_per_head, cfg.d_model))
        self.kappa = nn.Parameter(torch.zeros(cfg.n_heads))
        self.alpha = nn.Parameter(torch.zeros(cfg.n_heads))
        self.experts = Experts(cfg.n_heads, cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias, cfg.ffn_dropout)
        self.init_std = cfg.initializer_range
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W^O as a Linear of the model's init; kappa and alpha uniform (the branch FFNs init as experts)."""
        normal_(self.out, std=self.init_std)
        if not self.kappa.is_meta:
            nn.init.zeros_(self.kappa)
            nn.init.zeros_(self.alpha)

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        lead, H = heads.shape[:-1], self.n_heads
        h = heads.reshape(-1, H, self.head_dim).transpose(0, 1)  # (H, N, hd)
        branch = torch.bmm(h, self.out.to(h.dtype)) * self.kappa.softmax(0).to(h.dtype)[:, None, None]  # (H, N, D)
        N, D = branch.shape[1], branch.shape[2]
        counts = torch.full((H,), N, dtype=torch.long, device=heads.device)  # every row through every branch
        f = self.experts(branch.reshape(H * N, D), counts).view(H, N, D)  # FFN_i(branch_i)
        out = (f * self.alpha.softmax(0).to(f.dtype)[:, None, None]).sum(0)  # (N, D)
        return out.reshape(*lead, D)
