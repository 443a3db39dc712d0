"""MAM adapter, "Mix-And-Match" (He et al. 2022, "Towards a Unified View of Parameter-Efficient Transfer
Learning").

He et al. show prefix tuning, adapters and LoRA are all a modification ``h <- h + s * delta_h`` of some
hidden state, differing in where delta_h is computed and how it is combined. Their best mix spends a few
parameters where attention is (prefix tuning, l = 30) and many where the FFN is (a *parallel* adapter,
r = 512, scaled by s = 4):

    attention:  prefix tuning, as in :mod:`lmforge.peft.prefix`
    FFN:        h <- FFN(x) + s * f(x W_down) W_up             (parallel: reads the FFN's input x)

A parallel adapter reads the sublayer's input, where a Houlsby adapter reads its output. W_up starts at
zero, so the adapter part starts as the identity; the prefix changes outputs from the start.

Example:
    >>> import lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> cfg = PeftConfig(method="mam", num_virtual_tokens=4, adapter_dim=8, prefix_projection=False)
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=1), cfg)
    >>> model.parameter_report().trainable   # prefix 1*2*384*4 + adapter 384*8+8+8*384+384
    9608
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn.ffn import FeedForward
from lmforge.peft.adapter import Bottleneck
from lmforge.peft.layer import param_device, param_dtype
from lmforge.peft.method import PeftMethod
from lmforge.peft.prefix import PREFIX_OPTIONS
from lmforge.peft.prefix import attach as attach_prefix
from lmforge.peft.targets import find_targets


class ParallelAdapter(nn.Module):
    """``adapter(x, base) = base(x) + s * bottleneck(x)``: (..., D) -> (..., D)."""

    def __init__(self, d: int, m: int, scale: float, activation: str = "relu", device=None, dtype=None):
        super().__init__()
        self.bottleneck = Bottleneck(d, m, activation, device=device, dtype=dtype)
        self.scale = scale

    def forward(self, x: torch.Tensor, base) -> torch.Tensor:
        return base(x) + self.scale * self.bottleneck(x)


def attach(model, name: str, cfg, **kwargs) -> None:
    """Add a parallel adapter ``name`` beside every FFN ``cfg.target_patterns`` selects, and a prefix."""
    d = model.base_model.config.d_model
    for path in find_targets(model.base_model, cfg.target_patterns, (FeedForward,), expand_ffn=False):
        layer = model.wrap(path)
        layer.adapters[name] = ParallelAdapter(d, cfg.adapter_dim, cfg.adapter_scale, cfg.adapter_activation,
                                               device=param_device(layer.base), dtype=param_dtype(layer.base))
    attach_prefix(model, name, cfg, **kwargs)


# The parallel adapter sits beside each FFN sublayer.
METHOD = PeftMethod("mam", attach, options=("adapter_dim", "adapter_activation", "adapter_scale", *PREFIX_OPTIONS,
                                            "targets"), default_targets=("ffn",))
