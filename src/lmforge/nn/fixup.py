"""Fixup: residual learning without normalisation (Zhang, Dauphin & Ma 2019), the "Fixup" row of Narang et al. 2021.

Fixup replaces the norms by an initialisation under which every residual branch starts at zero, with the
paper's three rules applied to a Transformer's branches (self-attention, cross-attention, feed-forward)::

    1. the last layer of each branch starts at 0:         attn.o, cross_attn.o, ffn.down  (weights and biases)
    2. the other weight layers inside a branch are scaled: W <- W * L^(-1 / (2m - 2))    (q, k, v; ffn.up, gate)
       L = the network's residual branches (2 per encoder/decoder-only layer, 3 per encoder-decoder decoder
       layer), m = 2 layers per branch (v -> o; up -> down), so the factor is L^(-1/2)
    3. a scalar multiplier (at 1) per branch and a scalar bias (at 0) on its input:   x + s * F(x + b)

This is the paper's original formulation (its three rules, stated for ResNets) applied branch by branch, as
its own machine-translation experiment applies Fixup to the Transformer; it is not T-Fixup (Huang et al. 2020),
whose per-matrix scales differ. Narang et al. do not spell out their adaptation. The other
layers keep the model's own initialisation before scaling (N(0, 0.02) for GPT-2-style models), and the
layers' per-feature biases (``bias=True``) play rule 3's scalar biases inside the sublayer. The norms of
every layer are gone (``ModelConfig.fixup=True``); the stack's final norm follows ``final_norm`` (set it to
false for a network without any norm). Rule 1's classifier at 0 is not applied: the LM head is usually tied
to the token embeddings, which cannot start at zero.

At initialisation every branch adds exactly 0, so a Fixup stack is the identity on its embeddings.

Example:
    >>> fixup_scale(n_branches=8)  # 8 ** -0.5
    0.3535533905932738
    >>> residual_branches("encoder-decoder", n_layers=2, n_decoder_layers=2)
    10
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

BRANCH_LAYERS = 2  # m: weight layers in series in each branch (values -> output; up -> down)
LAST_LAYERS = ("attn.o", "ffn.down")  # rule 1 (cross_attn.o ends the same way)
INNER_LAYERS = ("attn.q", "attn.k", "attn.v", "ffn.up", "ffn.gate")  # rule 2


def fixup_scale(n_branches: int, m: int = BRANCH_LAYERS) -> float:
    """Rule 2's factor ``L^(-1 / (2m - 2))`` for ``L = n_branches`` residual branches of ``m`` layers."""
    return n_branches ** (-1.0 / (2 * m - 2))


def residual_branches(arch: str, n_layers: int, n_decoder_layers: int) -> int:
    """L: the residual branches of the whole network (an encoder-decoder's decoder layers have three)."""
    if arch == "encoder-decoder":
        return 2 * n_layers + 3 * n_decoder_layers
    return 2 * n_layers


class FixupBranch(nn.Module):
    """Rule 3 on one residual branch: ``F(x) -> s * F(x + b)``, with scalars s = 1 and b = 0 at the start."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return self.scale * sublayer(x + self.bias)  # (..., D)


def fixup_branches(cross: bool) -> nn.ModuleDict:
    """One :class:`FixupBranch` per residual branch of a layer: ``attn``, (``cross``,) ``ffn``."""
    return nn.ModuleDict({name: FixupBranch() for name in ("attn", *(("cross",) if cross else ()), "ffn")})


@torch.no_grad()
def fixup_init(model: nn.Module, n_branches: int) -> None:
    """Apply rules 1-3 in place to every layer under ``model`` (after its ordinary initialisation).

    A weight shared by several layers (ALBERT, T5's shared encoder-decoder) is rescaled once.
    """
    factor = fixup_scale(n_branches)
    for name, module in model.named_modules():  # shared modules come once
        if isinstance(module, FixupBranch):
            module.reset_parameters()
        elif isinstance(module, nn.Linear) and ".layers." in f".{name}":
            if name.endswith(LAST_LAYERS):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
            elif name.endswith(INNER_LAYERS):
                module.weight.mul_(factor)
