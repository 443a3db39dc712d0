"""``@compile_disable``: ``torch.compiler.disable`` for methods, applied once the compiler is loaded.

Some methods must stay out of ``torch.compile``'s graphs: selecting the labelled positions of a batch has a
data-dependent shape, which dynamo cannot trace without breaking the graph inside the caller. Marking such a method
``@torch.compiler.disable`` makes dynamo call it eagerly instead (one clean graph break at the call). But that
decorator imports ``torch._dynamo``, over a second of CPU, the moment the class is defined, so every process
that imports the model code pays for the compiler, also the many commands that never compile.

``@compile_disable`` defers the decorator to the moment it can matter. Until ``torch._dynamo`` is imported
nothing can be compiled, so the method stays a plain function; ``torch.compile`` imports ``torch._dynamo``
before it traces anything, and at the end of that import every recorded method is replaced on its class by
``torch.compiler.disable(method)``. From then on the class is exactly what the decorator written at class
definition would have made. A class defined after the compiler was loaded is given the disabled method at once.

The import is observed by a finder on ``sys.meta_path`` that answers only for ``torch._dynamo``: it lets the
ordinary path finder locate the package, and runs the replacement after the package's own code has run.

Example::

    >>> import torch
    >>> class Head(torch.nn.Module):
    ...     @compile_disable
    ...     def select(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:  # (B, T, D), (B, T) -> (N, D)
    ...         return h[keep]
    >>> import torch._dynamo  # what torch.compile does first
    >>> getattr(Head.select, "_torchdynamo_disable", False)
    True
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable

DYNAMO = "torch._dynamo"
_pending: list[tuple[type, str, Callable[..., Any]]] = []  # (class, attribute, plain function), until DYNAMO loads


def _disable_pending() -> None:
    import torch

    while _pending:
        owner, name, fn = _pending.pop()
        setattr(owner, name, torch.compiler.disable(fn))


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` with the ordinary path finder and disables the pending methods once it ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname != DYNAMO:
            return None
        if self in sys.meta_path:  # once: the package is imported once per process
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _disable_pending()

        spec.loader.exec_module = exec_module  # this spec's own loader object; the module keeps it as __loader__
        return spec


_finder = _WhenDynamoLoads()


class compile_disable:  # noqa: N801 - used as a decorator, like torch.compiler.disable
    """Decorate a method: it runs eagerly under ``torch.compile`` (see the module docstring).

    The decorator object lives only while its class is being created: ``__set_name__`` puts the plain
    function (or, with the compiler already loaded, the disabled one) on the class in its place.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner: type, name: str) -> None:
        if DYNAMO in sys.modules:
            import torch

            setattr(owner, name, torch.compiler.disable(self.fn))
            return
        setattr(owner, name, self.fn)
        _pending.append((owner, name, self.fn))
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
