"""An experiment folder's results as a table with error bars: table.md, table.csv, one PNG per metric, report.html.

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
import statistics
from pathlib import Path
from typing import Any

from lmforge.cost.report import run_tags, tag_line
from lmforge.experiments.grid import check_finite, lower_is_better
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


def bar_plot(table: list[dict[str, Any]], metric: str) -> bytes | None:
    """PNG bytes: the metric's mean per cell with its standard deviation as the error bar, the best cell
    coloured; None when no cell has a value."""
    scored = [e for e in table if e[metric] is not None]
    if not scored:
        return None
    fig = figure(max(4.0, 0.9 * len(scored) + 1.5), 3.6, dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    x = range(len(scored))
    ax.bar(x, [e[metric][0] for e in scored], yerr=[e[metric][1] for e in scored], capsize=4,
           color=[COLORS[1] if metric in e["best"] else COLORS[0] for e in scored])
    ax.set_xticks(list(x), [e["cell"] for e in scored], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} ({'lower' if lower_is_better(metric) else 'higher'} is better; mean ± std over seeds)",
                 fontsize=9)
    return png(fig, tight=True)


def html_report(title: str, table: list[dict[str, Any]], axes: list[str], metrics: list[str],
                plots: dict[str, bytes], grid_text: str, tags: dict[str, dict[str, Any]] | None = None) -> str:
    """One self-contained page: the table, the plots (inline PNG), failed runs and the grid file."""
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
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;text-align:right}td:first-child{text-align:left}.best{font-weight:bold;"
            "background:#fde9d9}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>Mean ± sample standard deviation over seeds; highlighted: the best "
            "cell per metric.</p><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>" + (f"<h2>Failed runs</h2><ul>{failed}</ul>" if failed else "")
            + (f"<h2>Price tags</h2><p>Each cell summed over its runs.</p><ul>{prices}</ul>" if prices else "") + images
            + f"<h2>Grid</h2><pre>{html.escape(grid_text)}</pre></body></html>\n")


def write_report(out: str | Path) -> list[dict[str, Any]]:
    """Write ``OUT/table.md``, ``table.csv``, ``plots/METRIC.png`` and ``report.html`` from ``OUT/results.jsonl``
    and ``OUT/experiment.json``; returns the summarized table."""
    out = Path(out)
    meta = json.loads((out / EXPERIMENT_FILE).read_text(encoding="utf-8"))
    axes, metrics = meta["axes"], meta["metrics"]
    table = summarize(read_results(out), meta["cells"], metrics)
    tags = price_tags(out, meta["cells"])
    atomic_write_text(out / TABLE_FILE, markdown(table, axes, metrics) + price_markdown(tags))
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
                                                      text, tags))
    return table
