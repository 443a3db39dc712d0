"""(IA)^3: Infused Adapter by Inhibiting and Amplifying Inner Activations (Liu et al. 2022, "Few-Shot
Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context Learning").

Three learned vectors rescale the keys, the values and the FFN's inner activation:

    k <- l_k * (W_k x)        v <- l_v * (W_v x)        ffn(x) = W_down (l_ff * act(W_up x))

so a layer adds only 2 d_kv + d_ff parameters. The vectors start at one (the identity). On ``ffn.down``
the vector scales the layer's *input* (the inner activation); on any other target, its output. Both
merge exactly into the weight: ``diag(l) W`` (and ``l * b``) for outputs, ``W diag(l)`` for inputs.

Example:
    >>> import torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("bert-tiny", n_layers=2).eval(), PeftConfig(method="ia3"))
    >>> model.parameter_report().trainable   # 2 layers x (384 + 384 + 1536)
    4608
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.peft.layer import dense_weight, features, param_device, param_dtype, plain_linear
from lmforge.peft.method import PeftMethod
from lmforge.peft.nf4 import LINEARS
from lmforge.peft.targets import find_targets, logical_name, matches

# Targets whose vector scales the input: the FFN's second projection, so l_ff acts on act(W_up x).
FEEDFORWARD = ("ffn.down",)


class IA3(nn.Module):
    """``adapter(x, base) = base(x) * l`` (output) or ``base(x * l)`` (input); l: (features,)."""

    def __init__(self, n: int, on_input: bool, device=None, dtype=None):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n, device=device, dtype=dtype))
        self.on_input = on_input

    def forward(self, x: torch.Tensor, base) -> torch.Tensor:
        return base(x * self.scale) if self.on_input else base(x) * self.scale

    def merged(self, base: nn.Module) -> nn.Linear:
        weight, bias, l = dense_weight(base), base.bias, self.scale.detach()
        if self.on_input:
            return plain_linear(weight * l.to(weight.dtype)[None, :], bias)
        return plain_linear(weight * l.to(weight.dtype)[:, None], None if bias is None else bias * l.to(bias.dtype))


def attach(model, name: str, cfg, **_) -> None:
    """Add (IA)^3 vectors ``name`` to every linear that ``cfg.target_patterns`` selects."""
    for path in find_targets(model.base_model, cfg.target_patterns, LINEARS):
        layer = model.wrap(path)
        in_f, out_f = features(layer.base)
        on_input = any(matches(logical_name(path), f) for f in FEEDFORWARD)
        layer.adapters[name] = IA3(in_f if on_input else out_f, on_input,
                                   device=param_device(layer.base), dtype=param_dtype(layer.base))


# Keys, values and the FFN's inner activation (the input of ffn.down), as in the paper.
METHOD = PeftMethod("ia3", attach, options=("targets",), default_targets=("k", "v", "ffn.down"), mergeable=True)
