"""The README's "Where things are" block lists the layers of tests/test_import_layers.py top-down: every part
once, each line one layer, the lines from the highest layer to the ground floor. A layer added or moved there
fails here until the README says so."""

from __future__ import annotations

import re
from pathlib import Path

from test_import_layers import LAYERS

README = Path(__file__).resolve().parents[1] / "README.md"


def block_lines(text: str) -> list[list[str]]:
    """The parts named on each line of the README's ``src/lmforge/`` block (``nn/`` and ``config.py`` as ``nn``
    and ``config``), in order.

    >>> block_lines("```\\nsrc/lmforge/\\n  cli/   parsing\\n  config.py utils/   the ground floor\\nx/\\n```")
    [['cli'], ['config', 'utils']]
    """
    lines = text[text.index("src/lmforge/\n"):].splitlines()[1:]
    parts = []
    for line in lines:
        if not line.startswith("  "):
            break
        names = re.match(r"\s+((?:[\w]+(?:/|\.py)\s?)+)", line).group(1).split()
        parts.append([n.removesuffix("/").removesuffix(".py") for n in names])
    return parts


def test_the_readme_lists_every_layer_once_top_down():
    lines = block_lines(README.read_text(encoding="utf-8"))
    named = [n for line in lines for n in line]
    top_level = {name for name in LAYERS if name and "." not in name}  # "" is the package, "x.y" a sub-module
    assert sorted(named) == sorted(top_level), "README's src/lmforge/ block and LAYERS name different parts"
    layers = [{LAYERS[n] for n in line} for line in lines]
    assert all(len(s) == 1 for s in layers), [line for line, s in zip(lines, layers) if len(s) > 1]
    order = [s.pop() for s in layers]
    assert order == sorted(order, reverse=True), list(zip(order, lines))
