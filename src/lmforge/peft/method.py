"""What a PEFT method says about itself: its name, options, default targets, whether it merges, how it attaches.

Each method file (``lora.py``, ``prefix.py``, ...) ends with one :class:`PeftMethod`, and
:mod:`lmforge.peft.registry` collects them into the tables :class:`~lmforge.peft.config.PeftConfig` and
:class:`~lmforge.peft.model.PeftModel` read. A new method is a new file with its ``METHOD``, listed in the
registry.

Example:
    >>> def attach(model, name, cfg, **_):
    ...     pass
    >>> m = PeftMethod("scale", attach, options=("targets",), default_targets=("q",), mergeable=True)
    >>> m.name, m.uses("targets"), m.uses("r")
    ('scale', True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PeftMethod:
    """One PEFT method, as its own file describes it.

    Args:
        name: the ``PeftConfig.method`` value that selects it.
        attach: ``attach(peft_model, adapter_name, cfg, tokenizer=None)`` adds the adapter to a PeftModel.
        options: the PeftConfig fields it uses besides ``method`` (``targets`` among them when it wraps
            modules); setting any other field is an error.
        default_targets: module-name patterns used when ``targets`` is None (empty for methods without targets).
        mergeable: whether the adapter folds into the base weights (merge, merge_and_unload).
    """

    name: str
    attach: Callable[..., None]
    options: tuple[str, ...] = ()
    default_targets: tuple[str, ...] = ()
    mergeable: bool = False

    def uses(self, option: str) -> bool:
        """Whether PeftConfig field ``option`` belongs to this method."""
        return option in self.options
