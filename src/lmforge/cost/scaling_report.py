"""Read a sweep's results, and draw its IsoFLOP profiles and fitted frontier.

Results format: ``results.jsonl`` files (in DIR or any folder below it), one JSON object per line with ``n``
(non-embedding parameters), ``d`` (tokens), ``loss`` (final loss) and optionally ``c`` (FLOPs) and ``budget``;
upper-case ``N``/``D``/``C``/``L`` and ``final_loss`` are read too. An experiment runner's rows (``lmforge scaling
sweep``, ``lmforge experiment run``) are read as N its ``params``, D its ``tokens``, C its ``flops``, the loss its
``metrics.eval_loss`` and the budget its ``labels.budget``; failed cells are left out. A run folder below DIR that holds
``price_tag.json`` and ``model/config.json`` with no results row of its own counts as one row: N from its model,
D and C from its price tag, the loss its last evaluation (or training) loss, the budget from its
``cell.json`` when the experiment runner wrote one.

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "results.jsonl").write_text(json.dumps({"N": 1e6, "D": 2e7, "final_loss": 3.2}) + "\\n")
    >>> read_results(d)
    [{'n': 1000000.0, 'd': 20000000.0, 'loss': 3.2}]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.config import ModelConfig
from lmforge.cost.chinchilla import PUBLISHED, ScalingLaw
from lmforge.cost.shapes import non_embedding_parameters
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training.logging import read_metrics
from lmforge.training.price_tag import PRICE_TAG_FILE
from lmforge.utils.figures import figure, png
from lmforge.utils.io import atomic_write_bytes

KEYS = {"n": ("n", "N", "params"), "d": ("d", "D", "tokens"), "c": ("c", "C", "flops", "total_flops"),
        "loss": ("loss", "L", "final_loss", "eval_loss"), "budget": ("budget",)}


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    if isinstance(raw.get("metrics"), dict):  # an experiment runner's row: its model's N, labels and metrics
        raw = {**raw, "n": raw.get("params"), "loss": raw["metrics"].get("eval_loss"),
               **{k: v for k, v in (raw.get("labels") or {}).items() if k == "budget"}}
    row = {}
    for key, names in KEYS.items():
        for name in names:
            if raw.get(name) is not None:
                row[key] = float(raw[name])
                break
    return row


def read_results(folder: str | Path) -> list[dict[str, Any]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputFileNotFound(f"DIR {folder}: no such folder")
    rows = []
    for path in sorted(folder.rglob("results.jsonl")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                try:
                    raw = json.loads(line)
                except ValueError:
                    raise UserInputError(f"{path}:{i + 1}: not a JSON object") from None
                if not isinstance(raw, dict):
                    raise UserInputError(f"{path}:{i + 1}: not a JSON object")
                if raw.get("status", "ok") == "ok":  # a failed cell of an experiment has no loss to fit
                    rows.append(_row(raw))
    if not rows:  # run folders of a sweep run without a results file
        for tag_file in sorted(folder.rglob(PRICE_TAG_FILE)):
            run = tag_file.parent
            config = run / "model" / "config.json"
            if run.name == "model" or not config.is_file():
                continue
            tag = json.loads(tag_file.read_text(encoding="utf-8"))
            metrics = read_metrics(run / "metrics.jsonl")
            losses = [r.get("eval_loss", r.get("loss")) for r in metrics if r.get("eval_loss", r.get("loss"))]
            cell = json.loads((run / "cell.json").read_text()) if (run / "cell.json").is_file() else {}
            cfg = ModelConfig.from_dict(json.loads(config.read_text(encoding="utf-8")), source=str(config))
            if losses:
                rows.append({"n": float(non_embedding_parameters(cfg)), "d": float(tag["total_tokens"]),
                             "c": float(tag["total_flops"]), "loss": float(losses[-1]),
                             **({"budget": float(cell["budget"])} if cell.get("budget") else {})})
    return rows


def _figure():
    fig = figure(7, 4.5)
    return fig, fig.add_subplot()


def _save(fig, path: Path) -> Path:
    atomic_write_bytes(path, png(fig))
    return path


def plot_isoflops(rows: list[dict[str, Any]], fitted: dict[str, Any], path: Path) -> Path:
    """Loss against N, one curve per budget, with each fitted parabola and its vertex."""
    import numpy as np

    from lmforge.cost.scaling_fit import budget_of

    fig, ax = _figure()
    for b in fitted["approach2"]["budgets"]:
        mine = sorted((r["n"], r["loss"]) for r in rows if budget_of(r) == b["c"])
        line = ax.plot(*zip(*mine), "o", label=f"C = {b['c']:.2g}")[0]
        x = np.linspace(np.log10(mine[0][0]), np.log10(mine[-1][0]), 50)
        ax.plot(10**x, np.polyval(b["parabola"], x), "-", color=line.get_color(), linewidth=1)
        ax.plot([b["n_opt"]], [b["loss_opt"]], "*", color=line.get_color(), markersize=12)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("final loss")
    ax.set_title("IsoFLOP profiles (approach 2): parabola in log N per budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_frontier(fitted: dict[str, Any], path: Path) -> Path:
    """N_opt against C: approach 2's vertices and line, approach 3's optimum, and Chinchilla's published one."""
    import numpy as np

    fig, ax = _figure()
    two = fitted["approach2"]
    cs = np.array([b["c"] for b in two["budgets"]])
    ax.plot(cs, [b["n_opt"] for b in two["budgets"]], "o", label="IsoFLOP vertices")
    grid = np.geomspace(cs.min() / 3, cs.max() * 3, 50)
    if "a" in two:
        ax.plot(grid, 10 ** (two["log10_n_intercept"] + two["a"] * np.log10(grid)), "-",
                label=f"approach 2: N_opt ∝ C^{two['a']:.2f}")
    law = ScalingLaw(**{k: fitted["approach3"][k] for k in ("E", "A", "B", "alpha", "beta")})
    ax.plot(grid, [law.parametric_optimum(c)[0] for c in grid], "--",
            label=f"approach 3: N_opt ∝ C^{fitted['approach3']['a']:.2f}")
    ax.plot(grid, [PUBLISHED.optimum(c)[0] for c in grid], ":", label="Chinchilla (published): C^0.50")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel("compute-optimal N")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
