"""BitFit: fine-tune only the bias terms (Ben Zaken et al. 2022, "BitFit: Simple Parameter-efficient
Fine-tuning for Transformer-based Masked Language-models").

Each targeted linear or LayerNorm gets a trainable ``delta_b`` added to its output, starting at zero:

    y = W x + (b + delta_b)

which is training ``b`` itself (the same gradient) while the base stays frozen and shareable, so BitFit
adapters save, switch and mix like the others. Layers without a bias (T5, Llama) gain one, starting at
zero: the natural extension of "train the biases" to bias-free models. Merging adds ``delta_b`` to the
bias; it needs the base layer to have one.

Example:
    >>> import lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("bert-tiny", n_layers=1), PeftConfig(method="bitfit"))
    >>> model.parameter_report().trainable   # q, k, v, o, up, down biases + 3 LayerNorm biases
    4608
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn.norms import RMSNorm
from lmforge.peft.layer import dense_weight, param_device, param_dtype, plain_linear
from lmforge.peft.method import PeftMethod
from lmforge.peft.nf4 import LINEARS
from lmforge.peft.targets import find_targets


class BiasDelta(nn.Module):
    """``adapter(x, base) = base(x) + delta_b``; delta_b: (features,), zero at initialisation."""

    def __init__(self, n: int, device=None, dtype=None):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, base) -> torch.Tensor:
        return base(x) + self.bias

    def merged(self, base: nn.Module) -> nn.Module:
        if isinstance(base, RMSNorm) or (isinstance(base, nn.LayerNorm) and base.weight is None):
            raise ValueError(f"BitFit: cannot merge a bias into {type(base).__name__}, which has no bias term")
        delta = self.bias.detach()
        if isinstance(base, nn.LayerNorm):
            merged = nn.LayerNorm(base.normalized_shape, base.eps, device=delta.device, dtype=base.weight.dtype)
            with torch.no_grad():
                merged.weight.copy_(base.weight)
                merged.bias.copy_(delta if base.bias is None else base.bias + delta)
            return merged
        bias = delta if base.bias is None else base.bias.detach() + delta.to(base.bias.dtype)
        return plain_linear(dense_weight(base), bias)


def _width(module: nn.Module) -> int:
    if isinstance(module, (nn.LayerNorm, RMSNorm)):
        return module.weight.shape[0] if module.weight is not None else module.normalized_shape[-1]
    return module.out_features


def attach(model, name: str, cfg, **_) -> None:
    """Add bias deltas ``name`` to every linear and norm that ``cfg.target_patterns`` selects."""
    kinds = (*LINEARS, nn.LayerNorm, RMSNorm)
    for path in find_targets(model.base_model, cfg.target_patterns, kinds):
        layer = model.wrap(path)
        layer.adapters[name] = BiasDelta(_width(layer.base), device=param_device(layer.base),
                                         dtype=param_dtype(layer.base))


def merge_needs_bias(model, name: str) -> list[str]:
    """Targets of BitFit adapter ``name`` whose base has no bias to merge into."""
    missing = []
    for path, layer in model.wrappers():
        adapter = layer.adapters[name] if name in layer.adapters else None
        if isinstance(adapter, BiasDelta) and getattr(layer.base, "bias", None) is None:
            missing.append(path)
    return missing


# Every linear and norm of the stacks.
METHOD = PeftMethod("bitfit", attach, options=("targets",), default_targets=("q", "k", "v", "o", "ffn", "re:.*norm"),
                    mergeable=True)
