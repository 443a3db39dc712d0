"""AdamW with decoupled weight decay on the weight matrices only.

Weight decay pulls weights towards zero. That is a sensible prior for the matrices of linear layers, but
not for biases, for the gains of LayerNorm/RMSNorm (whose neutral value is 1, not 0), or for embedding
tables (a rare token's row would shrink every step while its gradient is almost always zero). So the
parameters fall into two groups, and the kinds listed in ``no_decay`` get ``weight_decay=0``:

    kind        parameters
    bias        every ``*.bias``
    norm        weights of LayerNorm / RMSNorm modules
    embedding   token, segment and learned position tables; T5/Shaw relative-position tables

A tied LM head shares the token table's tensor, so it follows the embedding rule. An untied head is a
linear map and is decayed.

The fused AdamW kernel (one kernel over all parameters instead of a dozen elementwise ops each) is used
when the installed torch has one for the parameters' device; otherwise the ``foreach`` implementation.

Example:
    >>> import lmforge
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
    >>> groups = param_groups(model, weight_decay=0.1)
    >>> [g["weight_decay"] for g in groups], len(groups[1]["names"]) > 0
    ([0.1, 0.0], True)
    >>> opt = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    >>> type(opt).__name__
    'AdamW'
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from lmforge.nn.norms import RMSNorm
from lmforge.nn.positions.learned import LearnedPositions
from lmforge.nn.positions.shaw_relative import ShawRelativePositions
from lmforge.nn.positions.t5_bias import T5RelativeBias

NORM_TYPES = (nn.LayerNorm, RMSNorm, nn.GroupNorm, nn.BatchNorm1d)
EMBEDDING_TYPES = (nn.Embedding, LearnedPositions, ShawRelativePositions, T5RelativeBias)


def parameter_kind(module: nn.Module, name: str) -> str:
    """``"bias"``, ``"norm"``, ``"embedding"`` or ``"weight"`` for parameter ``name`` owned by ``module``."""
    if name == "bias":
        return "bias"
    if isinstance(module, NORM_TYPES):
        return "norm"
    if isinstance(module, EMBEDDING_TYPES):
        return "embedding"
    return "weight"


def param_groups(
    model: nn.Module, weight_decay: float, no_decay: Iterable[str] = ("bias", "norm", "embedding")
) -> list[dict]:
    """Two AdamW groups: ``[decayed, not decayed]``, each with ``params``, ``names`` and ``weight_decay``.

    Trainable parameters only; a tensor shared by several modules (tied embeddings) appears once, under the
    kind of the first module that owns it, which for lmforge models is the embedding table.
    """
    skip = set(no_decay)
    decay: dict[str, list] = {"params": [], "names": [], "weight_decay": weight_decay}
    keep: dict[str, list] = {"params": [], "names": [], "weight_decay": 0.0}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            group = keep if parameter_kind(module, name) in skip else decay
            group["params"].append(param)
            group["names"].append(f"{module_name}.{name}" if module_name else name)
    return [decay, keep]


def _fused_available(params: list[torch.Tensor]) -> bool:
    if not params:
        return False
    try:  # torch decides per device and dtype; asking it is the only reliable check across versions
        torch.optim.AdamW([torch.zeros(1, device=params[0].device, dtype=params[0].dtype)], fused=True)
    except (RuntimeError, ValueError, TypeError):
        return False
    return all(p.dtype.is_floating_point for p in params)


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.01,
    betas: Iterable[float] = (0.9, 0.999),
    eps: float = 1e-8,
    no_decay: Iterable[str] = ("bias", "norm", "embedding"),
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`; ``fused=None`` picks the fused kernel when available.

    Each group keeps its ``names`` (AdamW ignores extra keys), so a checkpoint can say which parameter a
    piece of optimizer state belongs to.
    """
    groups = [g for g in param_groups(model, weight_decay, no_decay) if g["params"]]
    params = [p for g in groups for p in g["params"]]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **fused_or_foreach(params, fused))


def fused_or_foreach(params: list[torch.Tensor], fused: bool | None = None) -> dict[str, bool]:
    """AdamW's keyword for ``params``: ``{"fused": True}`` where torch has the fused kernel for their device and
    dtype (or ``fused=True`` asks for it), else ``{"foreach": True}``."""
    use_fused = _fused_available(params) if fused is None else fused
    return {"fused": True} if use_fused else {"foreach": True}
