"""Activation functions by ModelConfig name.

``gelu`` is the exact erf form (BERT, BART); ``gelu-tanh`` the tanh approximation (GPT-2's
``gelu_new``). Gated variants (GLU family, Shazeer 2020) name the activation applied to the gate:
``geglu``/``geglu-tanh`` -> GELU, ``reglu`` -> ReLU, ``swiglu`` -> SiLU (Llama).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

_BASE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu-tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}
_GATE_OF = {"geglu": "gelu", "geglu-tanh": "gelu-tanh", "reglu": "relu", "swiglu": "silu"}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise function for ``name`` (for a gated name: the function applied to the gate)."""
    return _BASE[_GATE_OF.get(name, name)]
