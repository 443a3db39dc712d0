"""How far apart two cells must be for a grid's seeds to tell them apart, and what a claim's verdict is.

A cell's seeds give its metric a sample standard deviation ``s``. Two cells' means differ by chance with a standard
error of ``sqrt(s_a²/n_a + s_b²/n_b)``; a difference larger than twice that (about a 95% two-sided interval for a
normal difference) is what this module calls *detectable*. It is a deliberately plain rule, the one a reader checks
by hand from a table of means ± std: with 3 seeds the t distribution's tails are wider than the normal's, so a
difference just over the bound is suggestive rather than settled (a Welch test at n = 3 gives p ≈ 0.1 there).

A claim says one cell is better than another (``expect: better``), or that two are the same within a ``margin``
(``expect: same``). Its difference ``Δ`` is taken in the claimed direction: positive when the ``better`` cell is
better (lower for a loss, higher for a score). Verdicts:

- ``better``: *reproduced* when Δ > bound, *contradicted* when Δ < −bound, else *inconclusive at this scale*;
- ``same``: *reproduced* when the interval Δ ± bound lies inside ±margin, *contradicted* when it lies outside it,
  else *inconclusive at this scale*;
- *inconclusive: one seed, no variance estimate* when either cell has fewer than two seeds.

An inconclusive comparison also says how many seeds per cell, at the measured standard deviations, would make the
difference (the paper's, when the claim gives one in the metric's units, else the observed one) clear the bound.

Example:
    >>> c = compare([5.45, 5.48, 5.47], [5.62, 5.66, 5.63], lower_is_better=True)   # relative vs learned
    >>> c.verdict, round(c.delta, 3), round(c.bound, 3)
    ('reproduced', 0.17, 0.03)
    >>> compare([0.54, 0.52], [0.55, 0.51], lower_is_better=False).verdict
    'inconclusive at this scale'
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive at this scale"
ONE_SEED = "inconclusive: one seed, no variance estimate"
NO_RESULT = "no result"
MIXED = "mixed"
EXPECTS = ("better", "same")


def seed_std(values: Sequence[float]) -> float | None:
    """The sample standard deviation of a cell's seeds (n − 1 in the denominator); None below two seeds.

    Example:
        >>> seed_std([2.0, 4.0]), seed_std([1.0])
        (1.4142135623730951, None)
    """
    return statistics.stdev(values) if len(values) > 1 else None


def detectable(std_a: float, n_a: int, std_b: float, n_b: int) -> float:
    """The smallest detectable difference of two cells' means: twice the standard error of their difference,
    ``2·sqrt(s_a²/n_a + s_b²/n_b)``.

    Example:
        >>> round(detectable(0.023, 3, 0.025, 3), 4)   # 2 * sqrt((0.023**2 + 0.025**2) / 3)
        0.0392
    """
    return 2.0 * math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)


def seeds_needed(std_a: float, std_b: float, difference: float) -> int | None:
    """Seeds per cell (the same for both) for which ``difference`` exceeds :func:`detectable` at these standard
    deviations: the smallest n > 4·(s_a² + s_b²)/difference², at least 2. None when there is no difference to
    detect.

    Example:
        >>> seeds_needed(0.03, 0.04, 0.02)   # 4 * 0.0025 / 0.0004 = 25, so 26
        26
        >>> seeds_needed(0.03, 0.04, 0.0) is None
        True
    """
    difference = abs(difference)
    if difference == 0 or not math.isfinite(difference):
        return None
    return max(2, math.floor(4.0 * (std_a ** 2 + std_b ** 2) / difference ** 2) + 1)


@dataclass
class Comparison:
    """One pair of cells under a claim: the difference in the claimed direction, its bound and the verdict."""

    delta: float | None  # better minus than, signed so that > 0 is the claimed direction; None: a cell has no value
    bound: float | None  # the smallest detectable difference; None below two seeds in a cell
    std: tuple[float | None, float | None]
    n: tuple[int, int]
    verdict: str
    seeds: int | None = None  # per cell, to settle an inconclusive comparison


def compare(better: Sequence[float], than: Sequence[float], lower_is_better: bool, *, expect: str = "better",
            margin: float | None = None, paper_delta: float | None = None) -> Comparison:
    """Judge "``better`` beats ``than``" (or, with ``expect="same"``, "they agree within ``margin``") from each
    cell's per-seed values (see the module docstring)."""
    summary = [(statistics.fmean(v), seed_std(v), len(v)) if v else None for v in (better, than)]
    return compare_summaries(summary[0], summary[1], lower_is_better, expect=expect, margin=margin,
                             paper_delta=paper_delta)


def compare_summaries(better: tuple[float, float | None, int] | None, than: tuple[float, float | None, int] | None,
                      lower_is_better: bool, *, expect: str = "better", margin: float | None = None,
                      paper_delta: float | None = None) -> Comparison:
    """:func:`compare` from each cell's (mean, sample std, seeds), as a table of means ± std gives them (the std
    is None, or ignored, below two seeds).

    Example:
        >>> compare_summaries((5.467, 0.025, 3), (5.635, 0.023, 3), lower_is_better=True).verdict
        'reproduced'
    """
    n = (better[2] if better else 0, than[2] if than else 0)
    if better is None or than is None or not n[0] or not n[1]:
        return Comparison(None, None, (None, None), n, NO_RESULT)
    sign = -1.0 if lower_is_better else 1.0
    delta = sign * (better[0] - than[0])
    std = (better[1] if n[0] > 1 else None, than[1] if n[1] > 1 else None)
    if std[0] is None or std[1] is None:
        return Comparison(delta, None, std, n, ONE_SEED)
    bound = detectable(std[0], n[0], std[1], n[1])
    if expect == "same":
        if margin is None:
            raise ValueError("expect='same' needs a margin")
        if abs(delta) + bound < margin:
            return Comparison(delta, bound, std, n, REPRODUCED)
        if abs(delta) - bound > margin:
            return Comparison(delta, bound, std, n, CONTRADICTED)
        gap = margin - abs(delta)  # how far the bound must shrink, on whichever side of the margin Δ lies
        return Comparison(delta, bound, std, n, INCONCLUSIVE, seeds_needed(std[0], std[1], gap))
    if delta > bound:
        return Comparison(delta, bound, std, n, REPRODUCED)
    if delta < -bound:
        return Comparison(delta, bound, std, n, CONTRADICTED)
    target = paper_delta if paper_delta is not None else delta
    return Comparison(delta, bound, std, n, INCONCLUSIVE, seeds_needed(std[0], std[1], target))


def overall(verdicts: Sequence[str]) -> str:
    """A group claim's verdict from its pairs': reproduced (or contradicted) only when every pair is; *mixed* when
    some pairs are reproduced and others contradicted; otherwise the pairs' common inconclusive verdict, or
    *inconclusive at this scale*.

    Example:
        >>> overall(["reproduced", "reproduced"]), overall(["reproduced", "contradicted"])
        ('reproduced', 'mixed')
        >>> overall(["reproduced", "inconclusive at this scale"])
        'inconclusive at this scale'
    """
    kinds = set(verdicts)
    if len(kinds) == 1:
        return verdicts[0]
    if {REPRODUCED, CONTRADICTED} <= kinds:
        return MIXED
    if kinds <= {ONE_SEED, NO_RESULT}:
        return ONE_SEED
    return INCONCLUSIVE


def median_std(stds: Sequence[float]) -> float | None:
    """The median of the cells' seed standard deviations (None without any): the power line's typical noise.

    Example:
        >>> median_std([0.011, 0.023, 0.025, 0.008])
        0.017
    """
    return statistics.median(stds) if stds else None
