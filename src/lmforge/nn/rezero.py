"""ReZero's residual gate, with and without the branch's norm (the ReZero rows of Narang et al. 2021).

    ReZero (Bachlechner et al. 2020, ``rezero=True``):           x = x + alpha * F(x)
    ReZero + LayerNorm / + RMS Norm (``rezero_norm=True``):      x = x + alpha * F(Norm(x))

``alpha`` is one learned scalar per layer, initialised at 0, that gates every residual branch of the layer,
so each layer starts as the identity. Plain ReZero drops the norms; Narang et al.'s "ReZero + LayerNorm" and
"ReZero + RMS Norm" rows (their Table 1) keep the pre-norm Transformer's norm inside each branch and add the
gate as well; ``ModelConfig.norm`` picks which norm (``layernorm`` or ``rmsnorm``). The stack's final norm
follows ``ModelConfig.final_norm`` in every case.

Example:
    >>> import torch
    >>> x, alpha = torch.ones(2, 3), torch.tensor(0.5)
    >>> rezero_branch(x, alpha, lambda h: 2 * h, torch.nn.Identity()).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def keeps_norm(rezero: bool, rezero_norm: bool) -> bool:
    """Whether a layer's branches keep their norm: always without ReZero, and with ReZero only under ``rezero_norm``.

    Example:
        >>> keeps_norm(True, False), keeps_norm(True, True), keeps_norm(False, False)
        (False, True, True)
    """
    return not rezero or rezero_norm


def rezero_branch(x: torch.Tensor, alpha: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor],
                  norm: nn.Module) -> torch.Tensor:
    """``alpha * F(Norm(x))``: what a ReZero branch adds to the residual stream (``norm`` is Identity without
    ``rezero_norm``). x (..., D) -> (..., D)."""
    return alpha * sublayer(norm(x))
