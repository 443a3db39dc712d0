"""lmforge: Transformer language models end to end.

The public API is imported lazily so that ``import lmforge`` stays fast for the CLI.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": ("lmforge.config", "ModelConfig"),
    "list_presets": ("lmforge.config", "list_presets"),
    "build_model": ("lmforge.models", "build_model"),
    "Transformer": ("lmforge.models", "Transformer"),
    "load": ("lmforge.checkpoint", "load"),
    "save": ("lmforge.checkpoint", "save"),
    "Tokenizer": ("lmforge.tokenization", "Tokenizer"),
    "from_hf": ("lmforge.interop.hf", "from_hf"),
    "to_hf": ("lmforge.interop.hf", "to_hf"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lmforge' has no attribute {name!r}")
