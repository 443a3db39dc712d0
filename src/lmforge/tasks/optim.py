"""The fine-tuning optimizer: AdamW with layer-wise learning rates (ULMFiT's discriminative fine-tuning).

Layer groups, bottom to top (:func:`layer_groups`): 0 = embeddings (token, position, segment tables, relative
biases), 1..L = the encoder's then the decoder's layers (a stack's final norm joins its last layer), L+1 = the
task head, the pooler and any LM head. ULMFiT's decay is 1/2.6 per layer; ELECTRA-style fine-tuning uses ~0.8.

Per-group LR scales live in the optimizer's param groups (``lr_scale``), which checkpoints store, and
:class:`ScaledAdamW` applies them at each step on top of the LR the Trainer's schedule sets.

Example:
    >>> import lmforge
    >>> body = lmforge.build_model("bert-tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> sorted(set(layer_groups(body).values()))
    [0, 1, 2, 3]
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from lmforge.training.config import TrainConfig
from lmforge.training.optim import fused_or_foreach, parameter_kind

_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.layers\.(\d+)\.")
_TOP = re.compile(r"(?:^|\.)(head|pooler|lm_head|mlm_head)\.|^head\.")
_FINAL_NORM = re.compile(r"(?:^|\.)(encoder|decoder)\.final_norm\.")


def layer_groups(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer group (0 = embeddings .. top = head), for a Transformer or a TaskModel."""
    body = getattr(model, "body", model)  # a TaskModel, a wrapper exposing .body (PEFT), or a Transformer
    cfg = body.config
    n_enc = cfg.n_layers if cfg.arch != "decoder" else 0
    n_dec = cfg.decoder_layers if cfg.arch == "encoder-decoder" else (cfg.n_layers if cfg.arch == "decoder" else 0)
    top = n_enc + n_dec + 1
    groups = {}
    for name, _ in model.named_parameters():
        if (m := _LAYER.search(name)) is not None:
            i = int(m.group(2))
            groups[name] = 1 + i + (n_enc if m.group(1) == "decoder" else 0)
        elif (m := _FINAL_NORM.search(name)) is not None:
            groups[name] = n_enc if m.group(1) == "encoder" else top - 1
        elif _TOP.search(name) or name.startswith("head."):
            groups[name] = top
        else:
            groups[name] = 0
    return groups


class ScaledAdamW(torch.optim.AdamW):
    """AdamW whose param groups may carry ``lr_scale``: each step uses ``lr * lr_scale`` for the group.

    The Trainer sets every group's ``lr`` from the schedule before each step; the scale is applied on top
    and undone afterwards, so ``lr`` always reads as the schedule's value.
    """

    @torch.no_grad()
    def step(self, closure=None):
        base = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = g["lr"] * g.get("lr_scale", 1.0)
        try:
            return super().step(closure)
        finally:
            for g, lr in zip(self.param_groups, base):
                g["lr"] = lr


def build_finetune_optimizer(model: nn.Module, config: TrainConfig, layer_decay: float = 1.0,
                             names: set[str] | None = None) -> ScaledAdamW:
    """AdamW groups by (layer group, decay or not), each with ``lr_scale = layer_decay ** (top - group)``.

    Every parameter in ``names`` (default: all) is included, frozen or not, so that unfrozen layers join the
    same optimizer (AdamW skips parameters whose gradient is None); a PEFT run leaves its frozen base out.
    Weight decay follows :mod:`lmforge.training.optim`, and so does the choice of the fused AdamW kernel: one
    pass over each tensor instead of a dozen ``foreach`` ops, which on a CPU made the optimizer step cost as
    much as the forward pass of a fine-tuned encoder with a large vocabulary.
    """
    depth = layer_groups(model)
    top = max(depth.values())
    skip = set(config.no_decay)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            if names is not None and full not in names:
                continue
            d, decays = depth[full], parameter_kind(module, name) not in skip
            group = groups.setdefault((d, decays), {"params": [], "names": [], "layer_group": d,
                                                    "weight_decay": config.weight_decay if decays else 0.0,
                                                    "lr_scale": layer_decay ** (top - d)})
            group["params"].append(param)
            group["names"].append(full)
    ordered = [groups[k] for k in sorted(groups, key=lambda k: (k[0], not k[1]))]
    params = [p for g in ordered for p in g["params"]]
    return ScaledAdamW(ordered, lr=config.lr, betas=tuple(config.betas), eps=config.eps, **fused_or_foreach(params))
