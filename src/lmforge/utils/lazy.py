"""Package namespaces that import their modules on first use (PEP 562).

``import lmforge`` and the CLI's ``--help`` stay fast, and a package's ``__init__`` imports none of its own
modules, so importing one module of a package never drags in the others (see the layer test).

Example:
    >>> getattr_ = lazy_exports("lmforge", {"ModelConfig": "config"})  # in a package: __getattr__ = ...
    >>> getattr_("ModelConfig").__name__
    'ModelConfig'
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``table`` maps each public name to the submodule defining it."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
