"""LoRA: a trainable low-rank update beside a frozen linear (Hu et al. 2021, "LoRA: Low-Rank Adaptation
of Large Language Models").

    h = W0 x + (alpha / r) * B A x          A: (r, in), B: (out, r), r << min(in, out)

B starts at zero, so the adapted model is the base model until training moves it; A starts as
nn.Linear's Kaiming-uniform, as in the paper's reference code. rsLoRA (Kalajdzievski 2023) scales by
alpha / sqrt(r) instead, which keeps the update's size stable as r grows. Merging folds
``W = W0 + (alpha/r) B A`` into a plain linear, after which inference costs nothing extra.

Example:
    >>> import torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> base = lmforge.build_model("gpt-tiny", n_layers=2).eval()
    >>> model = apply_peft(base, PeftConfig(method="lora", r=4, targets=["q", "v"]))
    >>> ids = torch.randint(0, 8192, (2, 8))
    >>> with model.disable_adapters():
    ...     before = model(ids).logits
    >>> torch.equal(model(ids).logits, before)  # B = 0: the identity at initialisation
    True
    >>> model.parameter_report().trainable   # 2 layers x 2 targets x (4*384 + 384*4)
    12288
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.peft.layer import dense_weight, features, param_device, param_dtype, plain_linear
from lmforge.peft.method import PeftMethod
from lmforge.peft.nf4 import LINEARS
from lmforge.peft.targets import find_targets

LORA_OPTIONS = ("r", "alpha", "dropout", "rslora", "targets")  # QLoRA takes these too


class LoRA(nn.Module):
    """The update of one linear: ``adapter(x, base) = base(x) + B(A(dropout(x))) * scaling``.

    Shapes: x (..., in) -> (..., out).
    """

    def __init__(self, in_features: int, out_features: int, r: int, scaling: float, dropout: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        self.A = nn.Linear(in_features, r, bias=False, device=device, dtype=dtype)
        self.B = nn.Linear(r, out_features, bias=False, device=device, dtype=dtype)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = scaling
        nn.init.kaiming_uniform_(self.A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.B.weight)  # the update starts at exactly zero

    def forward(self, x: torch.Tensor, base) -> torch.Tensor:
        return base(x) + self.B(self.A(self.dropout(x))) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """(out, in): the dense update (alpha/r) B A."""
        return (self.B.weight @ self.A.weight) * self.scaling

    def merged(self, base: nn.Module) -> nn.Linear:
        weight = dense_weight(base)
        return plain_linear(weight + self.delta_weight().to(weight.dtype), base.bias)


def attach(model, name: str, cfg, **_) -> None:
    """Add LoRA adapter ``name`` to every linear that ``cfg.target_patterns`` selects (``cfg``: a PeftConfig)."""
    for path in find_targets(model.base_model, cfg.target_patterns, LINEARS):
        layer = model.wrap(path)
        in_f, out_f = features(layer.base)
        layer.adapters[name] = LoRA(in_f, out_f, cfg.r, cfg.scaling, cfg.dropout,
                                    device=param_device(layer.base), dtype=param_dtype(layer.base))


# W_q and W_v: the paper's choice.
METHOD = PeftMethod("lora", attach, options=LORA_OPTIONS, default_targets=("q", "v"), mergeable=True)
