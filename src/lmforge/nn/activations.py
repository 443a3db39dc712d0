"""Activation functions by ModelConfig name.

``gelu`` is the exact erf form (BERT, BART); ``gelu-tanh`` the tanh approximation (GPT-2's
``gelu_new``). Gated variants (GLU family, Shazeer 2020) name the activation applied to the gate:
``geglu``/``geglu-tanh`` -> GELU, ``reglu`` -> ReLU, ``swiglu`` -> SiLU (Llama).

The rest of the activation rows of Narang et al. 2021 ("Do Transformer Modifications Transfer Across
Implementations and Applications?", table 1)::

    elu       x if x > 0 else exp(x) - 1                       (Clevert et al. 2016)
    selu      1.0507 * (x if x > 0 else 1.6733 (exp(x) - 1))   (Klambauer et al. 2017)
    sigmoid   1 / (1 + exp(-x))
    softplus  log(1 + exp(x))
    glu       down(sigmoid(gate(x)) * up(x))                   (Dauphin et al. 2017)
    liglu     down(gate(x) * up(x)): bilinear, no nonlinearity (Shazeer 2020's "Bilinear")

The table's other cheap rows live where they act: ReZero (``ModelConfig.rezero``) in :mod:`lmforge.nn.block`,
the Universal Transformer's shared layer with per-step signals (``share_layers`` + ``step_embeddings``) in
:mod:`lmforge.models.stack`. Two rows are left out:

- Fixup initialisation (Zhang et al. 2019) is more than an init: it also removes the norms and adds scalar
  multipliers and biases in front of every projection and activation of each branch, so every FFN and
  attention module would grow parameters HF checkpoints do not have; ReZero covers the same idea (a residual
  branch that starts at zero) with one scalar per layer.
- Mixture of softmaxes (Yang et al. 2018) makes the head return log-probabilities of a mixture, not logits:
  temperature, repetition penalties and the fused cross-entropy all treat the head's output as logits, and
  would silently compute something else on it.

Example:
    >>> x = torch.tensor([-1.0, 0.0, 2.0])
    >>> [round(v, 4) for v in activation_fn("elu")(x).tolist()]  # exp(-1) - 1 for the negative input
    [-0.6321, 0.0, 2.0]
    >>> activation_fn("liglu")(x).tolist()  # the gate of a bilinear layer is the identity
    [-1.0, 0.0, 2.0]
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

_SQRT_8_OVER_PI = 2 * math.sqrt(2 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, any shape.

    Under ``torch.compile`` it is written as ``x * sigmoid(2u)``, the same function
    (``0.5 (1 + tanh(u)) = sigmoid(2u)``): the CPU's vectorised tanh is much slower than its exp, and
    inductor fuses this form, forward and backward, into kernels faster than its tanh lowering (the
    compiled rows of ``benchmarks/train_step.py`` include it). Eager mode keeps ATen's single fused kernel,
    which beats the several kernels this form would launch there.

    Example:
        >>> x = torch.linspace(-6, 6, 101)
        >>> bool(torch.allclose(torch.compile(gelu_tanh)(x), F.gelu(x, approximate="tanh"), atol=1e-6))
        True
    """
    if not torch.compiler.is_compiling():
        return F.gelu(x, approximate="tanh")
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 is computed in fp32, rounded once
    return (xf * torch.sigmoid(_SQRT_8_OVER_PI * (xf + 0.044715 * xf * xf * xf))).to(x.dtype)


def identity(x: torch.Tensor) -> torch.Tensor:
    """The gate function of a bilinear (``liglu``) layer."""
    return x


_BASE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu-tanh": gelu_tanh,
    "silu": F.silu,
    "elu": F.elu,
    "selu": F.selu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "identity": identity,
}
_GATE_OF = {"geglu": "gelu", "geglu-tanh": "gelu-tanh", "reglu": "relu", "swiglu": "silu", "glu": "sigmoid",
            "liglu": "identity"}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise function for ``name`` (for a gated name: the function applied to the gate)."""
    return _BASE[_GATE_OF.get(name, name)]
