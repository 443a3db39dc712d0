"""lmforge: Transformer language models end to end.

The public API is imported lazily so that ``import lmforge`` stays fast for the CLI.
"""

from __future__ import annotations

from lmforge.utils.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": "config",
    "list_presets": "config",
    "build_model": "models",
    "Transformer": "models",
    "load": "checkpoint",
    "save": "checkpoint",
    "Tokenizer": "tokenization",
    "from_hf": "interop.hf",
    "to_hf": "interop.hf",
}

__all__ = sorted(_LAZY) + ["__version__"]

__getattr__ = lazy_exports(__name__, _LAZY)
