"""``report.json`` (every number of the run) and the summary table printed at the end.

The report is assembled from the stage records in ``OUT/stages/`` only, so it can be rebuilt at any time
(re-running a finished quickstart does exactly that) and never holds a figure the run did not produce.

    report.json
        lmforge_version, versions (python, torch, ...), machine (CPU, cores, torch threads)
        settings       minutes, device, when the run started
        timings        budget_seconds, total_seconds, per stage: seconds taken and its budget share
        stages         each stage's record: losses and curves, accuracies, BLEU, probes, samples, plans
        price_tags     every training run's price tag (FLOPs, device-seconds, energy, CO2e, cost) and their sum
        summary        the rows of the table below
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lmforge
from lmforge.cost.report import run_tags, tag_line
from lmforge.quickstart.folder import RunFolder
from lmforge.utils.io import atomic_write_text
from lmforge.utils.machine import machine_info

REPORT_JSON = "report.json"


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("torch", "tokenizers", "numpy", "matplotlib", "sklearn", "sacrebleu"):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except ImportError:
                continue
        found[name] = getattr(module, "__version__", "?")
    return found


def machine() -> dict[str, Any]:
    info = machine_info(torch_details=True)
    info.pop("python")  # the report lists it among the versions
    if "load_average" in info:
        info["load_average_at_end"] = info.pop("load_average")
    return info


def build(folder: RunFolder, titles: dict[str, str], report_seconds: float = 0.0) -> dict[str, Any]:
    """The report of the run in ``folder``: its settings, every finished stage's record, timings and summary."""
    settings = folder.settings() or {}
    stages = {name: record for name, record in folder.results().items() if record is not None}
    ordered = [n for n in titles if n in stages] + sorted(set(stages) - set(titles))
    stage_seconds = {n: stages[n].get("seconds", 0.0) for n in ordered}
    total = sum(stage_seconds.values()) + report_seconds
    summary = [{"stage": n, "title": titles.get(n, n), "result": stages[n].get("summary", ""),
                "seconds": stage_seconds[n]} for n in ordered]
    return {
        "lmforge_version": lmforge.__version__,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "machine": machine(),
        "settings": settings,
        "timings": {
            "budget_seconds": float(settings.get("minutes", 0)) * 60,
            "total_seconds": total,
            "report_seconds": report_seconds,
            "stages": {n: {"seconds": stage_seconds[n], "budget_seconds": stages[n].get("budget_seconds")}
                       for n in ordered},
        },
        "stages": {n: stages[n] for n in ordered},
        "price_tags": run_tags(folder.root),
        "summary": summary,
        "complete": all(n in stages for n in titles),
    }


def write(report: dict[str, Any], folder: RunFolder) -> Path:
    """Write ``OUT/report.json`` atomically (non-finite numbers become null, so that it is strict JSON)."""
    path = folder.path(REPORT_JSON)
    atomic_write_text(path, json.dumps(_finite(report), indent=1) + "\n")
    return path


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def table(report: dict[str, Any], width: int = 120) -> str:
    """The summary as an aligned text table, ending with the total time against the budget."""
    rows = [(r["title"], r["result"], _clock(r["seconds"])) for r in report["summary"]]
    first = max([len("stage")] + [len(r[0]) for r in rows])
    room = max(20, width - first - 10)
    lines = [f"{'stage':<{first}}  {'result':<{room}}  {'time':>5}", f"{'-' * first}  {'-' * room}  {'-' * 5}"]
    for title, result, clock in rows:
        shown = result if len(result) <= room else result[:room - 3] + "..."
        lines.append(f"{title:<{first}}  {shown:<{room}}  {clock:>5}")
    t = report["timings"]
    lines.append(f"{'-' * first}  {'-' * room}  {'-' * 5}")
    total = f"{_clock(t['total_seconds'])} of a {_clock(t['budget_seconds'])} budget"
    lines.append(f"{'total':<{first}}  {total:<{room}}  {_clock(t['total_seconds']):>5}")
    tags = report.get("price_tags")
    if tags:
        lines.append(f"{'price tag':<{first}}  {tag_line(tags['total'])} over {len(tags['runs'])} training runs "
                     "(each one's in report.json)")
    return "\n".join(lines)
