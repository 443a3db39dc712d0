"""A grid's ``claims:``: the lecture's sentences the grid tests, checked at load time and judged in the report.

Each claim names a metric and which cells should beat which::

    claims:
      - id: relative-beats-absolute
        claim: "Relative position representations beat absolute ones."
        source: Shaw et al. 2018, Table 1
        metric: eval_loss
        better: [relative, rope, t5-bias, alibi]   # cells: a full id (position=rope), AXIS=VARIANT, or a variant name
        than: learned
        paper_effect: "+0.3 BLEU on EN-DE (base)"  # free text, shown beside the verdict
        # paper_delta: 0.3                         # the paper's effect in the metric's units (seeds to detect it)
      - id: sinusoidal-matches-learned
        claim: "Sinusoidal and learned positions perform about the same."
        source: Vaswani et al. 2017, Table 3 (E)
        metric: eval_loss
        expect: same                               # agree within margin (metric units), instead of better
        margin: 0.05
        better: sinusoidal
        than: learned

A selector that matches several cells makes a group claim: one comparison per pair of a ``better`` and a ``than``
cell that agree on every axis no selector of the claim names (``prompting=cot`` against ``prompting=standard``
pairs the cells of equal ``shots``). Claims do not touch the cells: adding them to a grid changes no cell, and a
finished experiment reports them (``lmforge experiment report``, from ``OUT/grid.yaml``).

Example:
    >>> cells = {"pos=rope": {"pos": "rope"}, "pos=alibi": {"pos": "alibi"}, "pos=learned": {"pos": "learned"}}
    >>> [c] = parse_claims("g.yaml", [{"id": "rel", "claim": "Relative beats absolute.", "source": "Shaw 2018",
    ...                                "metric": "eval_loss", "better": ["rope", "pos=alibi"], "than": "learned"}],
    ...                    cells, ["eval_loss"])
    >>> c.pairs
    [('pos=rope', 'pos=learned'), ('pos=alibi', 'pos=learned')]
    >>> parse_claims("g.yaml", [{**c.raw, "than": "learnd"}], cells, ["eval_loss"])
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: g.yaml: claim rel: than: no cell 'learnd' (did you mean 'learned'?)
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from lmforge.config import ConfigError
import lmforge.experiments.power as power  # the module itself: the package imports the runner

FIELDS = ("id", "claim", "source", "metric", "better", "than", "expect", "margin", "paper_effect", "paper_delta")
REQUIRED = ("id", "claim", "source", "metric", "better", "than")


@dataclass
class Claim:
    """One checked claim: its text and source, its metric, the (better, than) cell pairs it compares."""

    id: str
    claim: str
    source: str
    metric: str
    better: list[str]
    than: list[str]
    pairs: list[tuple[str, str]]
    expect: str = "better"
    margin: float | None = None
    paper_effect: str | None = None
    paper_delta: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def direction(self) -> str:
        """``eval_loss: [rope, alibi] better than learned``: the metric and the sides as the grid writes them."""
        def side(key: str) -> str:
            given = self.raw.get(key, getattr(self, key))
            return f"[{', '.join(map(str, given))}]" if isinstance(given, list) and len(given) > 1 else \
                str(given[0] if isinstance(given, list) else given)

        return f"{self.metric}: {side('better')} {'≈' if self.expect == 'same' else 'better than'} {side('than')}"


def cell_axes(cell_id: str) -> dict[str, str]:
    """A cell's axes read off its id (``pos=rope,lr=high``; ``base`` has none).

    Example:
        >>> cell_axes("pos=rope,lr=high"), cell_axes("base")
        ({'pos': 'rope', 'lr': 'high'}, {})
    """
    return dict(part.split("=", 1) for part in cell_id.split(",") if "=" in part)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _suggest(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(candidates)}"


def _select(where: str, key: str, selector: Any, cells: dict[str, dict[str, str]]) -> tuple[list[str], set[str]]:
    """The cells a selector names, and the axes it names: a cell id, ``AXIS=VARIANT[,...]`` or a variant's name."""
    if not isinstance(selector, str) or not selector:
        raise ConfigError(f"{where}: {key}: {selector!r} is not a cell name")
    variants: dict[str, list[str]] = {}
    for axes in cells.values():
        for axis, variant in axes.items():
            variants.setdefault(axis, [])
            if variant not in variants[axis]:
                variants[axis].append(variant)
    candidates = [*cells, *dict.fromkeys(v for vs in variants.values() for v in vs)]
    if selector in cells:
        return [selector], set(cells[selector])
    if "=" in selector:
        wanted = cell_axes(selector)
        for axis, variant in wanted.items():
            if axis not in variants:
                raise ConfigError(f"{where}: {key}: {selector!r}: no axis {axis!r}{_suggest(axis, list(variants))}")
            if variant not in variants[axis]:
                raise ConfigError(f"{where}: {key}: {selector!r}: axis {axis} has no variant {variant!r}"
                                  f"{_suggest(variant, variants[axis])}")
        return [c for c, axes in cells.items() if all(axes.get(a) == v for a, v in wanted.items())], set(wanted)
    owners = [axis for axis, vs in variants.items() if selector in vs]
    if len(owners) > 1:
        raise ConfigError(f"{where}: {key}: {selector!r} is a variant of several axes ({', '.join(owners)}); write "
                          f"AXIS={selector}")
    if not owners:
        raise ConfigError(f"{where}: {key}: no cell {selector!r}{_suggest(selector, candidates)}")
    return [c for c, axes in cells.items() if axes.get(owners[0]) == selector], {owners[0]}


def parse_claims(path: str | Path, given: Any, cells: dict[str, dict[str, str]], metrics: Sequence[str]) -> list[Claim]:
    """Check a grid's ``claims:`` against its cells (id -> axes) and metrics.

    Raises:
        ConfigError: one line naming the file, the claim and the field; an unknown cell with a suggestion.
    """
    if given is None:
        return []
    if not isinstance(given, list):
        raise ConfigError(f"{path}: claims: expected a list of claims (id, claim, source, metric, better, than), "
                          f"got {type(given).__name__}")
    claims: list[Claim] = []
    for i, raw in enumerate(given):
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: claims[{i}]: expected a mapping (id, claim, source, metric, better, than), "
                              f"got {raw!r}")
        name = raw.get("id")
        if not isinstance(name, str) or not name or any(ch.isspace() or ch in ",:" for ch in name):
            raise ConfigError(f"{path}: claims[{i}]: id={name!r} must be a short name without spaces")
        where = f"{path}: claim {name}"
        if name in [c.id for c in claims]:
            raise ConfigError(f"{where}: id: two claims are named {name!r}")
        for key in raw:
            if key not in FIELDS:
                raise ConfigError(f"{where}: unknown field {key!r}{_suggest(str(key), FIELDS)}")
        for key in REQUIRED:
            if raw.get(key) in (None, "", []):
                raise ConfigError(f"{where}: {key}: missing (a claim needs {', '.join(REQUIRED)})")
        for key in ("claim", "source", "paper_effect"):
            if key in raw and not isinstance(raw[key], str):
                raise ConfigError(f"{where}: {key}={raw[key]!r} must be text")
        if raw["metric"] not in metrics:
            raise ConfigError(f"{where}: metric: {raw['metric']!r} is not one of the grid's metrics"
                              f"{_suggest(str(raw['metric']), list(metrics))}")
        expect = raw.get("expect", "better")
        if expect not in power.EXPECTS:
            raise ConfigError(f"{where}: expect={expect!r}: choose {' or '.join(power.EXPECTS)}")
        margin = raw.get("margin")
        if expect == "same" and not (_number(margin) and margin > 0):
            raise ConfigError(f"{where}: margin={margin!r}: expect: same needs a margin > 0 in the metric's units "
                              "(how close counts as the same)")
        if expect == "better" and margin is not None:
            raise ConfigError(f"{where}: margin: only an expect: same claim takes a margin")
        if "paper_delta" in raw and not _number(raw["paper_delta"]):
            raise ConfigError(f"{where}: paper_delta={raw['paper_delta']!r} must be a number in the metric's units "
                              "(put text in paper_effect)")
        sides: dict[str, list[str]] = {}
        named: set[str] = set()
        for key in ("better", "than"):
            selectors = raw[key] if isinstance(raw[key], list) else [raw[key]]
            chosen: list[str] = []
            for selector in selectors:
                found, axes = _select(where, key, selector, cells)
                named |= axes
                chosen += [c for c in found if c not in chosen]
            sides[key] = chosen
        free = [a for a in next(iter(cells.values()), {}) if a not in named]  # axes a pair must agree on
        pairs = [(a, b) for a in sides["better"] for b in sides["than"]
                 if a != b and all(cells[a].get(x) == cells[b].get(x) for x in free)]
        if not pairs:
            raise ConfigError(f"{where}: better/than: no pair of distinct cells to compare "
                              f"({', '.join(sides['better'])} against {', '.join(sides['than'])})")
        claims.append(Claim(name, raw["claim"], raw["source"], raw["metric"], sides["better"], sides["than"], pairs,
                            expect, float(margin) if margin is not None else None, raw.get("paper_effect"),
                            float(raw["paper_delta"]) if "paper_delta" in raw else None, dict(raw)))
    return claims


# ------------------------------------------------------------------------------------------- judging
@dataclass
class Judged:
    """A claim with each pair's comparison, its overall verdict and, when inconclusive, the seeds and cost to
    settle it."""

    claim: Claim
    comparisons: list[tuple[str, str, power.Comparison]]
    verdict: str
    seeds: int | None = None
    extra_runs: int = 0
    cell_seconds: float | None = None
    cpu_hours: float | None = None


def judge(claim: Claim, values: dict[str, list[float]], lower_is_better: bool,
          costs: dict[str, tuple[float, float]] | None = None) -> Judged:
    """Judge ``claim`` from each cell's per-seed values of its metric; ``costs``: a cell's mean (seconds,
    CPU-seconds) per run, for the budget of an inconclusive verdict.

    Example:
        >>> c = Claim("r", "Rope beats learned.", "x", "eval_loss", ["a"], ["b"], [("a", "b")])
        >>> j = judge(c, {"a": [5.46, 5.48, 5.47], "b": [5.50, 5.45, 5.53]}, True, {"a": (100, 100), "b": (90, 90)})
        >>> j.verdict, j.seeds, j.extra_runs, round(j.cell_seconds)
        ('inconclusive at this scale', 13, 20, 1900)
    """
    comparisons = [(a, b, power.compare(values.get(a, []), values.get(b, []), lower_is_better, expect=claim.expect,
                                        margin=claim.margin, paper_delta=claim.paper_delta))
                   for a, b in claim.pairs]
    verdict = power.overall([c.verdict for _, _, c in comparisons])
    judged = Judged(claim, comparisons, verdict)
    open_ = [c.seeds for _, _, c in comparisons if c.verdict == power.INCONCLUSIVE and c.seeds is not None]
    if verdict not in (power.REPRODUCED, power.CONTRADICTED, power.MIXED) and open_:
        judged.seeds = max(open_)
        cells = list(dict.fromkeys(x for a, b, c in comparisons if c.verdict == power.INCONCLUSIVE for x in (a, b)))
        more = {cell: max(0, judged.seeds - len(values.get(cell, []))) for cell in cells}
        judged.extra_runs = sum(more.values())
        if costs and all(cell in costs for cell in cells):
            judged.cell_seconds = sum(n * costs[cell][0] for cell, n in more.items())
            judged.cpu_hours = sum(n * costs[cell][1] for cell, n in more.items()) / 3600
    return judged


def unit(metric: str) -> str:
    """The unit a metric's differences are written in (losses in nats)."""
    return " nats" if metric.endswith("_loss") else ""


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.4g}"


def comparison_text(metric: str, c: power.Comparison, expect: str = "better", margin: float | None = None) -> str:
    """``Δ = +0.164 nats, detectable ≥ 0.052 (σ 0.023/0.025, 3 seeds)``: a pair's difference in the claimed
    direction and the bound it is judged against.

    Example:
        >>> print(comparison_text("eval_loss", power.compare([5.45, 5.48, 5.47], [5.62, 5.66, 5.63], True)))
        Δ = +0.17 nats, detectable ≥ 0.0298 (σ 0.0153/0.0208, 3 seeds)
    """
    if c.delta is None:
        return f"no finished seed ({c.n[0]}/{c.n[1]} values)"
    text = f"Δ = {c.delta:+.3g}{unit(metric)}"
    if c.bound is None:
        return text + f" ({c.n[0]}/{c.n[1]} seeds)"
    seeds = f"{c.n[0]} seeds" if c.n[0] == c.n[1] else f"{c.n[0]}/{c.n[1]} seeds"
    text += f", detectable ≥ {c.bound:.3g} (σ {c.std[0]:.3g}/{c.std[1]:.3g}, {seeds})"
    if expect == "same":
        text += f", margin ±{_num(margin or 0)}"
    return text


def budget_text(j: Judged) -> str:
    """What settling an inconclusive claim would take: seeds per cell, more runs and their cost."""
    if j.seeds is None:
        return ""
    what = "the paper's difference" if j.claim.paper_delta is not None and j.claim.expect == "better" else \
        "the observed difference"
    text = f"≈ {j.seeds} seeds per cell would detect {what} ({j.extra_runs} more runs"
    if j.cell_seconds is not None:
        text += f", ≈ {j.cell_seconds:,.0f} cell-seconds = {j.cpu_hours:.2g} CPU-hours"
    return text + ")"


def claim_lines(j: Judged) -> list[str]:
    """The claim's Markdown: one line (a group claim adds one indented line per pair)."""
    c = j.claim
    head = f"- **{c.id}**: {c.claim} ({c.source}; {c.direction()})"
    if len(j.comparisons) == 1:
        head += f" {comparison_text(c.metric, j.comparisons[0][2], c.expect, c.margin)}."
    else:
        counts = {v: sum(x.verdict == v for _, _, x in j.comparisons) for v in
                  dict.fromkeys(x.verdict for _, _, x in j.comparisons)}
        head += f" {len(j.comparisons)} pairs: {', '.join(f'{n} {v}' for v, n in counts.items())}."
    if c.paper_effect:
        head += f" Paper: {c.paper_effect}."
    head += f" **{j.verdict}**"
    budget = budget_text(j)
    head += f"; {budget}." if budget else "."
    lines = [head]
    if len(j.comparisons) > 1:
        lines += [f"  - {a} vs {b}: {comparison_text(c.metric, x, c.expect, c.margin)}: {x.verdict}"
                  for a, b, x in j.comparisons]
    return lines


LEGEND = ("Δ: the difference of the cells' means in the claimed direction (> 0: as claimed); detectable: twice "
          "the standard error of that difference, 2·sqrt(σ_a²/n_a + σ_b²/n_b) over the seeds; a claim is "
          "reproduced (or contradicted) when Δ clears it in (or against) the claimed direction.")
