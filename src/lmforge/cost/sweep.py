"""An IsoFLOP sweep's grid (Chinchilla's approach 2): K compute budgets x M model sizes, D = C / (6N).

Budgets are ``smallest x spacing^k``. Each budget's sizes are centred on its 20-tokens-per-parameter size
(N = sqrt(C / 120)) and spaced by ``size_step`` on a log scale; each size is a shape scaled from ``base``
(:mod:`lmforge.cost.shapes`), and trains for ``D = C / (6 N)`` tokens, that is ``ceil(D / (batch x seq_len))``
steps, with a cosine schedule over exactly those steps. N counts non-embedding parameters and C = 6ND is the
budget's label: the run's measured FLOPs (its price tag) are higher, by the attention and the vocabulary
projection, which dominate at this scale.

The grid is a grid file of the experiment runner (:mod:`lmforge.experiments.grid`): the command (``pretrain``),
the settings every cell shares, and one axis ``cell`` whose variants are the cells, each with its own ``budget``
(steps), model overrides and ``labels`` (its planned budget, N and D, copied into its ``results.jsonl`` row for
``lmforge scaling fit``).

Sizes (documented for ``lmforge scaling sweep --size``): ``small`` (4 budgets from 3e11, x2 apart, 5 sizes from
12.8k to 619k non-embedding parameters: 2.25e13 FLOPs (C = 6ND) in all, 115,270 steps of 8 x 64 tokens, about an
hour of a shared 2-core machine, where a step of these models costs tens of milliseconds whatever their size: the
smallest budget starts above 1e11, whose five sizes would round to repeated shapes) and ``medium`` (5 budgets from
1e15, x4 apart, 7 sizes: a GPU or a Ray cluster).

Example:
    >>> grid = isoflop_grid("gpt-tiny", budgets=[1e13], sizes=3, batch_size=4, seq_len=32, head_dim=16)
    >>> [len(sweep_cells(grid)), grid["command"]]
    [3, 'pretrain']
    >>> all(abs(6 * c["n"] * c["d"] / c["budget"] - 1) < 0.2 for c in sweep_cells(grid))
    True
"""

from __future__ import annotations

import math
from typing import Any

from lmforge.cost.shapes import scaled_shape
from lmforge.errors import UserInputError

SWEEP_FILE = "sweep.yaml"  # the sweep's grid file, inside its experiment folder
SIZES = {"small": {"smallest": 3e11, "spacing": 2.0, "budgets": 4, "sizes": 5},
         "medium": {"smallest": 1e15, "spacing": 4.0, "budgets": 5, "sizes": 7}}


def budgets_of(smallest: float, spacing: float, count: int) -> list[float]:
    if not smallest > 0 or not spacing > 1 or count < 1:
        raise UserInputError(f"--smallest-budget {smallest}, --spacing {spacing}, --budgets {count}: need a budget "
                             "> 0, a spacing > 1 and at least one budget")
    return [smallest * spacing**k for k in range(count)]


def isoflop_grid(base: str, budgets: list[float], sizes: int = 5, size_step: float = 2.0, batch_size: int = 8,
                 seq_len: int = 64, head_dim: int | None = None, settings: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The experiment runner's grid of an IsoFLOP sweep; a budget too small for one step of the smallest model is
    refused."""
    if sizes < 3:
        raise UserInputError(f"--sizes {sizes}: an IsoFLOP profile needs at least 3 sizes per budget")
    if any(not c > 0 for c in budgets):
        raise UserInputError(f"--budgets {budgets}: every budget must be > 0 FLOPs")
    extra = {"head_dim": head_dim} if head_dim else {}
    tokens_per_step = batch_size * seq_len
    variants = []
    for c in budgets:
        centre = math.sqrt(c / 120)  # D = 20 N and C = 6 N D
        for j in range(sizes):
            target = centre * size_step ** (j - (sizes - 1) / 2)
            shape = scaled_shape(base, target, {**extra, "max_seq_len": max(seq_len, 8)})
            n = shape["n"]
            if variants and variants[-1]["labels"]["budget"] == c and variants[-1]["labels"]["n"] == n:
                raise UserInputError(f"--sizes: at {c:.3g} FLOPs two sizes round to the same {n:,}-parameter shape "
                                     "(shapes round to whole heads and layers); raise the smallest budget or lower "
                                     "--head-dim")
            d = c / (6 * n)
            steps = math.ceil(d / tokens_per_step)
            if d < tokens_per_step:
                raise UserInputError(f"--budgets: {c:.3g} FLOPs trains the {n:,}-parameter model for {d:.0f} tokens, "
                                     f"less than one step ({tokens_per_step} tokens); raise the smallest budget")
            # Each cell decays its learning rate over its own length (Chinchilla's cosine matched to the run) and
            # is scored once, at its last step.
            variants.append({"name": f"c{c:.2e}-n{n:.2e}", "budget": {"steps": steps},
                             "overrides": {**extra, "max_seq_len": max(seq_len, 8), **shape["overrides"]},
                             "warmup": steps // 20, "eval_every": steps,
                             "labels": {"budget": c, "n": n, "d": steps * tokens_per_step}})
    variants.sort(key=lambda v: -v["budget"]["steps"])  # longest first: parallel workers finish together
    return {"command": "pretrain",
            "description": f"IsoFLOP sweep of {base}: {len(budgets)} budgets x {sizes} sizes, D = C / (6N)",
            "settings": {"model": base, "batch_size": batch_size, "seq_len": seq_len, "grad_accum": 1,
                         "schedule": "cosine", "min_lr_ratio": 0.1, **(settings or {})},
            "axes": [{"name": "cell", "variants": variants}], "seeds": [0], "metrics": ["eval_loss", "eval_ppl"]}


def sweep_cells(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The planned cells of a grid from :func:`isoflop_grid`: name, budget, N, D and steps of each.

    Example:
        >>> grid = isoflop_grid("gpt-tiny", budgets=[1e13], sizes=3, batch_size=4, seq_len=32, head_dim=16)
        >>> cells = sweep_cells(grid)
        >>> [sorted(cells[0]), len(cells)]
        [['budget', 'd', 'n', 'name', 'steps'], 3]
    """
    return [{"name": v["name"], **v["labels"], "steps": v["budget"]["steps"]} for v in grid["axes"][0]["variants"]]
