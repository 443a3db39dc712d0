"""Houlsby adapters: a small bottleneck after each sublayer (Houlsby et al. 2019, "Parameter-Efficient
Transfer Learning for NLP").

    h <- h + f(h W_down + b_down) W_up + b_up        W_down: (D, m), W_up: (m, D), m << D

The adapter sits on the sublayer's output, after its projection back to D and before the residual
addition: here by wrapping the attention output projections (``o``) and the FFN's ``ffn.down``. Houlsby et
al. initialise it near the identity; W_up starts at exactly zero (W_down small and random), so the
adapted model starts as the base model and gradients still reach both matrices from the first step.

Example:
    >>> import lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("bert-tiny", n_layers=2), PeftConfig(method="adapter", adapter_dim=16))
    >>> model.parameter_report().trainable   # 2 layers x 2 adapters x (384*16 + 16 + 16*384 + 384)
    50752
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.peft.layer import features, param_device, param_dtype
from lmforge.peft.method import PeftMethod
from lmforge.peft.nf4 import LINEARS
from lmforge.peft.targets import find_targets

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh, "silu": F.silu}


class Bottleneck(nn.Module):
    """``f(x W_down + b) W_up + b``: (..., D) -> (..., D); zero at initialisation (W_up = 0)."""

    def __init__(self, d: int, m: int, activation: str = "relu", init_std: float = 1e-2, device=None, dtype=None):
        super().__init__()
        self.down = nn.Linear(d, m, device=device, dtype=dtype)
        self.up = nn.Linear(m, d, device=device, dtype=dtype)
        self.act = ACTIVATIONS[activation]
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x)))


class HoulsbyAdapter(nn.Module):
    """``adapter(x, base)``: h = base(x); h + bottleneck(h)."""

    def __init__(self, d: int, m: int, activation: str = "relu", device=None, dtype=None):
        super().__init__()
        self.bottleneck = Bottleneck(d, m, activation, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, base) -> torch.Tensor:
        h = base(x)
        return h + self.bottleneck(h)


def attach(model, name: str, cfg, **_) -> None:
    """Add a Houlsby adapter ``name`` after every linear that ``cfg.target_patterns`` selects."""
    for path in find_targets(model.base_model, cfg.target_patterns, LINEARS):
        layer = model.wrap(path)
        _, out_f = features(layer.base)
        layer.adapters[name] = HoulsbyAdapter(out_f, cfg.adapter_dim, cfg.adapter_activation,
                                              device=param_device(layer.base), dtype=param_dtype(layer.base))


# After every attention output projection and the FFN, as Houlsby et al. place them.
METHOD = PeftMethod("adapter", attach, options=("adapter_dim", "adapter_activation", "targets"),
                    default_targets=("o", "ffn.down"))
