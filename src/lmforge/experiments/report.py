"""An experiment folder's results as a table with error bars: table.md, table.csv, one PNG per metric, report.html.

Above the table, the grid's ``claims:`` (:mod:`lmforge.experiments.claims`), each judged against the seeds'
noise (:mod:`lmforge.experiments.power`): the measured difference, the smallest difference these seeds can detect,
the paper's effect and the verdict. Under the table, a power line per metric: the median seed standard deviation
and the smallest difference two cells must show to be told apart at it.

Below the table, each cell's price tag (Schwartz et al., 2019, "Green AI"): FLOPs, device-hours, energy, CO2e and
cost summed over its runs' ``price_tag.json`` files, and the experiment's total.

Each cell's value of a metric is the mean over its seeds that finished, with the sample standard deviation (0 for
a single seed); the best cell per metric (lowest loss or perplexity, highest score) is marked. Nothing here
computes a metric: every number comes from ``results.jsonl``.

Example:
    >>> rows = [{"cell": "a", "seed": s, "axes": {"x": "a"}, "status": "ok", "metrics": {"eval_loss": v}}
    ...         for s, v in ((0, 2.0), (1, 4.0))]
    >>> rows.append({"cell": "b", "seed": 0, "axes": {"x": "b"}, "status": "ok", "metrics": {"eval_loss": 1.0}})
    >>> table = summarize(rows, ["a", "b"], ["eval_loss"])
    >>> table[0]["eval_loss"], table[1]["best"]
    ((3.0, 1.4142135623730951, 2), ['eval_loss'])
    >>> print(markdown(table, ["x"], ["eval_loss"]).splitlines()[2])
    | a | a | 2/2 | 3 ± 1.4 |
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import yaml

from lmforge.config import ConfigError
from lmforge.cost.report import run_tags, tag_line
import lmforge.experiments.power as power  # the module itself: the package imports the runner
from lmforge.experiments.claims import LEGEND, Judged, cell_axes, claim_lines, judge, parse_claims, unit
from lmforge.experiments.grid import GridError, check_finite, lower_is_better
from lmforge.utils.figures import figure, png
from lmforge.utils.io import atomic_write_bytes, atomic_write_text

RESULTS_FILE = "results.jsonl"
CELLS_DIR = "cells"  # OUT/cells/<cell>/seed-<s>/: the run folders
EXPERIMENT_FILE = "experiment.json"  # what `report` needs: axes, metrics, cell order, seeds
PLOTS_DIR = "plots"
TABLE_FILE = "table.md"
COLORS = ("#3b6ea8", "#d1773a")


def read_results(out: str | Path) -> list[dict[str, Any]]:
    """The rows of ``OUT/results.jsonl`` (none when it is missing)."""
    path = Path(out) / RESULTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def summarize(rows: list[dict[str, Any]], cells: list[str], metrics: list[str]) -> list[dict[str, Any]]:
    """One entry per cell (in ``cells`` order): ``cell, axes, ok, runs, failed`` (their errors) and, per metric,
    ``(mean, std, n)`` over the seeds that finished (None when none did); ``best``: the metrics it is best at."""
    table = []
    for cell in cells:
        mine = [r for r in rows if r["cell"] == cell]
        ok = [r for r in mine if r["status"] == "ok"]
        entry: dict[str, Any] = {"cell": cell, "axes": mine[0]["axes"] if mine else {}, "ok": len(ok),
                                 "runs": len(mine), "best": [],
                                 "failed": [(r["seed"], r.get("error")) for r in mine if r["status"] != "ok"]}
        for metric in metrics:
            values = [r["metrics"].get(metric) for r in ok]
            values = [v for v in values if check_finite(v)]
            entry[metric] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0,
                             len(values)) if values else None
        table.append(entry)
    for metric in metrics:
        scored = [e for e in table if e[metric] is not None]
        if scored:
            pick = min if lower_is_better(metric) else max
            pick(scored, key=lambda e: e[metric][0])["best"].append(metric)
    return table


def _cell_text(value: tuple[float, float, int] | None) -> str:
    return "–" if value is None else f"{value[0]:.4g} ± {value[1]:.2g}"


def markdown(table: list[dict[str, Any]], axes: list[str], metrics: list[str]) -> str:
    """The table in Markdown: mean ± std per metric, the best cell's value in bold."""
    head = ["cell", *axes, "seeds ok", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in table:
        values = [f"**{_cell_text(e[m])}**" if m in e["best"] else _cell_text(e[m]) for m in metrics]
        lines.append("| " + " | ".join([e["cell"], *(e["axes"].get(a, "") for a in axes), f"{e['ok']}/{e['runs']}",
                                        *values]) + " |")
    directions = ", ".join(f"{m} {'lower' if lower_is_better(m) else 'higher'}" for m in metrics)
    lines += ["", f"Mean ± sample standard deviation over seeds; **bold**: the best cell per metric ({directions} "
                  "is better)."]
    failed = [(e["cell"], seed, error) for e in table for seed, error in e["failed"]]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- {cell} seed {seed}: {error}" for cell, seed, error in failed]
    return "\n".join(lines) + "\n"


def csv_text(table: list[dict[str, Any]], axes: list[str], metrics: list[str]) -> str:
    """The table as CSV: ``METRIC_mean``, ``METRIC_std``, ``METRIC_n`` per metric (full precision), ``best``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["cell", *axes, "ok", "runs", *(f"{m}_{s}" for m in metrics for s in ("mean", "std", "n")),
                     "best"])
    for e in table:
        values = [v for m in metrics for v in (e[m] if e[m] is not None else ("", "", 0))]
        writer.writerow([e["cell"], *(e["axes"].get(a, "") for a in axes), e["ok"], e["runs"],
                         *(repr(v) if isinstance(v, float) else v for v in values), ";".join(e["best"])])
    return buffer.getvalue()


def price_tags(out: str | Path, cells: list[str]) -> dict[str, dict[str, Any]]:
    """Each cell's price tag, summed over its runs (seeds and stages), from their ``price_tag.json`` files (cells
    that have none yet are left out), and ``total``: the whole experiment's."""
    tags = {}
    for cell in cells:
        found = run_tags(Path(out) / CELLS_DIR / cell)
        if found is not None:
            tags[cell] = found["total"]
    every = run_tags(Path(out) / CELLS_DIR) if tags else None
    if every is not None:
        tags["total"] = every["total"]
    return tags


def price_markdown(tags: dict[str, dict[str, Any]]) -> str:
    """The price-tag section of table.md: one line per cell and the total (Schwartz et al., 2019)."""
    if not tags:
        return ""
    lines = ["", "Price tags (each cell summed over its runs; `lmforge cost DIR` for the details):", ""]
    lines += [f"- {cell}: {tag_line(tag)}" for cell, tag in tags.items()]
    return "\n".join(lines) + "\n"


def seed_values(rows: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    """Each cell's finite values of ``metric`` over its finished seeds (what :func:`summarize` averages)."""
    values: dict[str, list[float]] = {}
    for r in rows:
        value = r["metrics"].get(metric) if r["status"] == "ok" else None
        if check_finite(value):
            values.setdefault(r["cell"], []).append(value)
    return values


def run_costs(rows: list[dict[str, Any]], tags: dict[str, dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each cell's mean (seconds, CPU-seconds) per finished run: the rows' ``seconds`` x ``threads``, else its
    price tag's device-seconds over its runs."""
    costs: dict[str, tuple[float, float]] = {}
    for cell in dict.fromkeys(r["cell"] for r in rows):
        timed = [r for r in rows if r["cell"] == cell and r["status"] == "ok" and check_finite(r.get("seconds"))]
        if timed:
            seconds = statistics.fmean(r["seconds"] for r in timed)
            costs[cell] = (seconds, statistics.fmean(r["seconds"] * (r.get("threads") or 1) for r in timed))
        elif check_finite((tags.get(cell) or {}).get("device_s")):
            runs = sum(1 for r in rows if r["cell"] == cell and r["status"] == "ok")
            if runs:
                costs[cell] = (tags[cell]["device_s"] / runs,) * 2
    return costs


def read_claims(out: str | Path, meta: dict[str, Any]) -> list:
    """The claims of ``OUT/grid.yaml`` checked against the folder's cells and metrics (none for a folder whose
    grid has none, e.g. one run before claims existed)."""
    grid = Path(out) / "grid.yaml"
    if not grid.is_file():
        return []
    raw = yaml.safe_load(grid.read_text(encoding="utf-8"))
    try:
        return parse_claims(grid, raw.get("claims") if isinstance(raw, dict) else None,
                            {cell: cell_axes(cell) for cell in meta["cells"]}, meta["metrics"])
    except ConfigError as exc:
        raise GridError(str(exc)) from exc


def judge_claims(claims: list, rows: list[dict[str, Any]], tags: dict[str, dict[str, Any]]) -> list[Judged]:
    """Each claim judged from the rows' per-seed values (and its budget from the runs' seconds or price tags)."""
    costs = run_costs(rows, tags)
    return [judge(c, seed_values(rows, c.metric), lower_is_better(c.metric), costs) for c in claims]


def claims_markdown(judged: list[Judged]) -> str:
    """The Claims section of table.md: one line per claim (a group claim: one more per pair), then the legend."""
    if not judged:
        return ""
    lines = ["## Claims", ""] + [line for j in judged for line in claim_lines(j)] + ["", LEGEND, ""]
    return "\n".join(lines) + "\n"


def power_lines(table: list[dict[str, Any]], metrics: list[str]) -> list[str]:
    """Per metric: the median seed standard deviation over the cells and the smallest difference two cells at
    that standard deviation and seed count can show detectably, 2·σ·sqrt(2/n).

    Example:
        >>> table = [{"m": (1.0, 0.02, 3)}, {"m": (1.1, 0.04, 3)}, {"m": (1.2, 0.0, 1)}]
        >>> power_lines(table, ["m"])
        ['m: median seed σ 0.03 over 2 cells of 3 seeds; two cells must differ by ≥ 0.049 to be told apart']
    """
    lines = []
    for metric in metrics:
        spread = [e[metric] for e in table if e[metric] is not None and e[metric][2] > 1]
        if not spread:
            if any(e[metric] is not None for e in table):
                lines.append(f"{metric}: one seed per cell, no variance estimate: run more seeds to tell cells apart")
            continue
        sigma = power.median_std([s for _, s, _ in spread])
        n = statistics.median_low([k for _, _, k in spread])
        lines.append(f"{metric}: median seed σ {sigma:.3g} over {len(spread)} cells of {n} seeds; two cells must "
                     f"differ by ≥ {power.detectable(sigma, n, sigma, n):.3g}{unit(metric)} to be told apart")
    return lines


def power_markdown(table: list[dict[str, Any]], metrics: list[str]) -> str:
    """The power line under the table (for every grid, with or without claims)."""
    lines = power_lines(table, metrics)
    return "\n".join(["", "Power (2 standard errors of a difference of two cells' means):", "",
                      *(f"- {line}" for line in lines)]) + "\n" if lines else ""


def metric_figure(table: list[dict[str, Any]], metric: str):
    """The metric's mean per cell as a point with its seed standard deviation as the error bar, the best cell
    coloured, on a y-axis zoomed to the data (the means ± std with a margin), so that gaps of a few hundredths
    between cells show; None when no cell has a value.

    Example:
        >>> table = [{"cell": c, "best": [], "m": (v, 0.01, 3)} for c, v in (("a", 6.2), ("b", 6.4))]
        >>> low, high = metric_figure(table, "m").axes[0].get_ylim()
        >>> bool(6.1 < low < 6.19 and 6.41 < high < 6.5)
        True
    """
    scored = [e for e in table if e[metric] is not None]
    if not scored:
        return None
    fig = figure(max(4.0, 0.9 * len(scored) + 1.5), 3.6, dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    for i, e in enumerate(scored):
        mean, std, _ = e[metric]
        ax.errorbar([i], [mean], yerr=[std], fmt="o", capsize=4, markersize=6,
                    color=COLORS[1] if metric in e["best"] else COLORS[0])
    low = min(e[metric][0] - e[metric][1] for e in scored)
    high = max(e[metric][0] + e[metric][1] for e in scored)
    pad = (high - low) * 0.15 or max(abs(high), 1.0) * 0.01  # equal cells: still a visible band around them
    if math.isfinite(low) and math.isfinite(high):
        ax.set_ylim(low - pad, high + pad)
    ax.set_xlim(-0.5, len(scored) - 0.5)
    ax.grid(axis="y", alpha=0.3)
    ax.set_xticks(list(range(len(scored))), [e["cell"] for e in scored], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} ({'lower' if lower_is_better(metric) else 'higher'} is better; mean ± std over seeds)",
                 fontsize=9)
    return fig


def bar_plot(table: list[dict[str, Any]], metric: str) -> bytes | None:
    """PNG bytes of :func:`metric_figure` (means with std error bars on a zoomed axis); None when no cell has a
    value."""
    fig = metric_figure(table, metric)
    return None if fig is None else png(fig, tight=True)


def _html_claims(judged: list[Judged]) -> str:
    if not judged:
        return ""
    items = []
    for j in judged:
        head, *pairs = claim_lines(j)
        sub = "".join(f"<li>{html.escape(p.strip().removeprefix('- '))}</li>" for p in pairs)
        text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(head.removeprefix("- ")))
        items.append(f"<li>{text}"
                     + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
    return f"<h2>Claims</h2><ul>{''.join(items)}</ul><p>{html.escape(LEGEND)}</p>"


def html_report(title: str, table: list[dict[str, Any]], axes: list[str], metrics: list[str],
                plots: dict[str, bytes], grid_text: str, tags: dict[str, dict[str, Any]] | None = None,
                judged: list[Judged] | None = None) -> str:
    """One self-contained page: the claims, the table with its power line, the plots (inline PNG), failed runs
    and the grid file."""
    head = ["cell", *axes, "seeds ok", *metrics]
    rows = []
    for e in table:
        cells = [e["cell"], *(e["axes"].get(a, "") for a in axes), f"{e['ok']}/{e['runs']}"]
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        tds += "".join(f"<td class='best'>{_cell_text(e[m])}</td>" if m in e["best"] else f"<td>{_cell_text(e[m])}</td>"
                       for m in metrics)
        rows.append(f"<tr>{tds}</tr>")
    images = "".join(f"<h2>{html.escape(m)}</h2><img alt='{html.escape(m)}' src='data:image/png;base64,"
                     f"{base64.b64encode(png).decode('ascii')}'>" for m, png in plots.items())
    failed = "".join(f"<li>{html.escape(e['cell'])} seed {seed}: {html.escape(str(error))}</li>"
                     for e in table for seed, error in e["failed"])
    prices = "".join(f"<li>{html.escape(cell)}: {html.escape(tag_line(tag))}</li>"
                     for cell, tag in (tags or {}).items())
    powers = "".join(f"<li>{html.escape(line)}</li>" for line in power_lines(table, metrics))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;text-align:right}td:first-child{text-align:left}.best{font-weight:bold;"
            "background:#fde9d9}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>" + _html_claims(judged or []) + "<h2>Table</h2><p>Mean ± sample "
            "standard deviation over seeds; highlighted: the best cell per metric.</p><table><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"
            + (f"<p>Power (2 standard errors of a difference of two cells' means):</p><ul>{powers}</ul>"
               if powers else "")
            + (f"<h2>Failed runs</h2><ul>{failed}</ul>" if failed else "")
            + (f"<h2>Price tags</h2><p>Each cell summed over its runs.</p><ul>{prices}</ul>" if prices else "") + images
            + f"<h2>Grid</h2><pre>{html.escape(grid_text)}</pre></body></html>\n")


def write_report(out: str | Path) -> list[dict[str, Any]]:
    """Write ``OUT/table.md``, ``table.csv``, ``plots/METRIC.png`` and ``report.html`` from ``OUT/results.jsonl``,
    ``OUT/experiment.json`` and the claims of ``OUT/grid.yaml``; returns the summarized table."""
    out = Path(out)
    meta = json.loads((out / EXPERIMENT_FILE).read_text(encoding="utf-8"))
    axes, metrics = meta["axes"], meta["metrics"]
    claims = read_claims(out, meta)  # first: a broken claims: section is refused before anything is rewritten
    results = read_results(out)
    table = summarize(results, meta["cells"], metrics)
    tags = price_tags(out, meta["cells"])
    judged = judge_claims(claims, results, tags)
    atomic_write_text(out / TABLE_FILE, claims_markdown(judged) + markdown(table, axes, metrics)
                      + power_markdown(table, metrics) + price_markdown(tags))
    atomic_write_text(out / "table.csv", csv_text(table, axes, metrics))
    plots = {}
    for metric in metrics:
        png = bar_plot(table, metric)
        if png is not None:
            plots[metric] = png
            atomic_write_bytes(out / PLOTS_DIR / f"{metric}.png", png)
    grid = out / "grid.yaml"
    text = grid.read_text(encoding="utf-8") if grid.is_file() else ""
    atomic_write_text(out / "report.html", html_report(meta.get("title") or out.name, table, axes, metrics, plots,
                                                      text, tags, judged))
    return table
