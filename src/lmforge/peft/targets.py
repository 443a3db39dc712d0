"""Module-name patterns: which modules of a model a PEFT method wraps.

A pattern matches a dotted module name that equals it or ends with ``"." + pattern`` (the rule of HF
peft's ``target_modules`` lists), so ``"q"`` matches ``encoder.layers.0.attn.q`` and
``decoder.layers.0.cross_attn.q`` while ``"attn.q"`` matches only self-attention. ``"ffn"`` expands to the
FFN's linears (``ffn.up``, ``ffn.gate``, ``ffn.down``) when linears are wanted; ``"re:<regex>"``
full-matches the name. A pattern that matches nothing is an error that lists what could match.

Example:
    >>> import lmforge
    >>> from torch import nn
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
    >>> find_targets(model, ["q", "ffn"], (nn.Linear,))
    ['decoder.layers.0.attn.q', 'decoder.layers.0.ffn.up', 'decoder.layers.0.ffn.down']
"""

from __future__ import annotations

import re

from torch import nn

from lmforge.config import ConfigError
from lmforge.peft.layer import AdaptedModule

STACKS = ("encoder.", "decoder.")  # PEFT adapts the Transformer stacks, never embeddings or output heads
FFN_LINEARS = ("ffn.up", "ffn.gate", "ffn.down")


def logical_name(path: str) -> str:
    """A module's name in the unwrapped model: ``ffn.base.up`` (inside a wrapped FFN) -> ``ffn.up``."""
    return ".".join(part for part in path.split(".") if part != "base")


def matches(name: str, pattern: str) -> bool:
    """Whether dotted module ``name`` is selected by ``pattern``."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def find_targets(model: nn.Module, patterns: list[str], kinds: tuple[type, ...], expand_ffn: bool = True) -> list[str]:
    """Paths of the modules of type ``kinds`` inside the stacks that ``patterns`` select, in model order.

    Patterns match the module's name in the unwrapped model (see :func:`logical_name`), so the same
    adapter selects the same layers whatever other adapters already wrap.

    Args:
        model: an lmforge Transformer, possibly with modules already wrapped by other adapters.
        patterns: see the module docstring.
        kinds: module types that may be selected (e.g. ``(nn.Linear,)``).
        expand_ffn: ``"ffn"`` means the FFN's linears (False: the FeedForward module itself).

    Raises:
        ConfigError: a pattern selects nothing; the message lists names that could be selected.
    """
    candidates: dict[str, str] = {}  # logical name -> path in the (possibly wrapped) model
    for path, module in model.named_modules():
        parts = path.split(".")
        if not path.startswith(STACKS) or parts[-1] == "base" or "adapters" in parts or "merged_base" in parts:
            continue  # a wrapper stands for its base; adapters' own layers are never targets
        if isinstance(module, AdaptedModule):
            module = module.base  # an already-wrapped module is selected by the type of what it wraps
        if isinstance(module, kinds):
            candidates[logical_name(path)] = path
    chosen: list[str] = []
    for pattern in patterns:
        group = list(FFN_LINEARS) if expand_ffn and pattern == "ffn" else [pattern]
        hits = [n for n in candidates if any(matches(n, p) for p in group)]
        if not hits:
            kinds_txt = "/".join(k.__name__ for k in kinds)
            leaves = sorted({n.split(".layers.")[-1].split(".", 1)[-1] for n in candidates})
            raise ConfigError(
                f"PeftConfig.targets: {pattern!r} matches no {kinds_txt} module of this model "
                f"(names end with: {', '.join(leaves[:12])}{' ...' if len(leaves) > 12 else ''})"
            )
        chosen += hits
    return [path for name, path in candidates.items() if name in set(chosen)]
