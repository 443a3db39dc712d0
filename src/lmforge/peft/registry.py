"""The PEFT methods, collected from their own files, and the tables built from what they say about themselves.

    REGISTRY          name -> :class:`~lmforge.peft.method.PeftMethod` (attach, options, targets, merging)
    METHODS           the method names, in the order help texts list them
    MERGEABLE         the methods whose adapters fold into the base weights
    DEFAULT_TARGETS   name -> module-name patterns used when ``targets`` is None (methods that take targets)

A new method is one new file ending in ``METHOD = PeftMethod(...)``, added to the list below.

Example:
    >>> METHODS
    ('lora', 'qlora', 'adapter', 'prefix', 'prompt', 'ia3', 'bitfit', 'mam')
    >>> MERGEABLE, DEFAULT_TARGETS["ia3"]
    (('lora', 'qlora', 'ia3', 'bitfit'), ['k', 'v', 'ffn.down'])
    >>> option_methods(["r", "targets"])["r"]
    ('lora', 'qlora')
"""

from __future__ import annotations

from collections.abc import Iterable

from lmforge.peft.adapter import METHOD as ADAPTER
from lmforge.peft.bitfit import METHOD as BITFIT
from lmforge.peft.ia3 import METHOD as IA3
from lmforge.peft.lora import METHOD as LORA
from lmforge.peft.mam import METHOD as MAM
from lmforge.peft.method import PeftMethod
from lmforge.peft.prefix import METHOD as PREFIX
from lmforge.peft.prompt import METHOD as PROMPT
from lmforge.peft.qlora import METHOD as QLORA

REGISTRY: dict[str, PeftMethod] = {m.name: m for m in (LORA, QLORA, ADAPTER, PREFIX, PROMPT, IA3, BITFIT, MAM)}

METHODS = tuple(REGISTRY)
MERGEABLE = tuple(name for name, m in REGISTRY.items() if m.mergeable)
DEFAULT_TARGETS = {name: list(m.default_targets) for name, m in REGISTRY.items() if m.uses("targets")}


def option_methods(options: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Option -> the methods that use it, for each of ``options`` (in that order) that some method uses."""
    table = {option: tuple(name for name, m in REGISTRY.items() if m.uses(option)) for option in options}
    return {option: methods for option, methods in table.items() if methods}
