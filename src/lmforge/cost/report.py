"""Read the price tag of a run folder, or the sum over an experiment's run folders, and put it beside the
lecture's reference points.

A run folder holds ``price_tag.json`` (written by the Trainer at the end of every ``fit``; see
:mod:`lmforge.training.price_tag`). An experiment folder is any folder whose subfolders (at any depth, e.g.
``cells/*/``) are run folders: its tag is the sum over them, Schwartz et al.'s "cost of the hyper-parameter
search". A command that ran a model (generate, evaluate, embed, ...) writes the same fields with
``--price-tag FILE`` (``kind`` "inference"; see :mod:`lmforge.cost.inference`): such a file, or a folder holding
them as ``price_tag.json``, is read and summed alike. CO2e and dollars are recomputed from the summed energy and
device-seconds, with the run's own settings or those given (``--region``, ``--grid-intensity``, ``--price-per-hour``).

What is billed. A CPU run is billed its device-seconds, the process's CPU seconds over the threads it computes on
(``cpu_s`` / ``cpu_threads``, at most the wall time; see :mod:`lmforge.training.price_tag`), so a run on a busy
host is not charged for the time other processes had the cores; a GPU run its wall seconds. A price tag written
before ``cpu_s`` existed has only wall seconds: it is read, billed by them, and the ``billing`` line says so.

Reference points, from the lecture (LING 574, "Note on the costs of LMs"), Strubell, Ganesh & McCallum (2019),
"Energy and Policy Considerations for Deep Learning in NLP", Table 1, CO2e in lbs:

Example:
    >>> rows = reference_rows(0.5)
    >>> rows[0]
    ('this run', 1.1023113109)
    >>> rows[-1]
    ('Transformer (big) w/ neural arch. search', 626155.0)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training.price_tag import PRICE_TAG_FILE, PriceSettings

LBS_PER_KG = 2.2046226218
STRUBELL_2019 = [  # (what, lbs CO2e): Table 1 as quoted in the lecture
    ("Air travel, 1 person, NY<->SF", 1984.0),
    ("Human life, avg, 1 year", 11023.0),
    ("American life, avg, 1 year", 36156.0),
    ("Car, avg incl. fuel, 1 lifetime", 126000.0),
    ("NLP pipeline (parsing, SRL)", 39.0),
    ("NLP pipeline w/ tuning & experiments", 78468.0),
    ("Transformer (big)", 192.0),
    ("Transformer (big) w/ neural arch. search", 626155.0),
]
REFERENCE_SOURCE = ("Strubell, Ganesh & McCallum (2019), Energy and Policy Considerations for Deep Learning in "
                    "NLP, Table 1 (LING 574 lecture, 'Note on the costs of LMs')")
SUMMED = ("total_flops", "total_tokens", "wall_s", "device_s")


def run_folders(path: str | Path) -> list[Path]:
    """``path`` itself if it is a run folder or a price-tag file (an inference command's ``--price-tag FILE``),
    else every run folder below it (sorted)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return [path]
    if not path.is_dir():
        raise InputFileNotFound(f"RUN {path}: no such folder")
    if (path / PRICE_TAG_FILE).is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob(PRICE_TAG_FILE) if p.parent.name != "model")
    if not found:
        raise UserInputError(f"RUN {path}: no price_tag.json in it or below it; give a run folder written by "
                             "lmforge pretrain/finetune/distill (version with price tags), or an experiment folder")
    return found


def read_tag(folder: Path) -> dict[str, Any]:
    """The price tag of a run folder, or the price-tag file ``folder`` itself."""
    file = folder if folder.is_file() else folder / PRICE_TAG_FILE
    try:
        tag = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserInputError(f"{file}: not JSON ({exc})") from None
    if not isinstance(tag, dict):
        raise UserInputError(f"{file}: not a price tag (a JSON object)")
    return tag


def billing(tags: list[dict[str, Any]]) -> str:
    """One line: what the device-seconds of ``tags`` are (CPU seconds, GPU wall time, or old wall-time tags).

    Example:
        >>> billing([{"settings": {"device": "cpu"}, "wall_s": 4.0, "device_s": 1.0, "cpu_s": 1.0, "cpu_threads": 1}])
        'billed: CPU seconds / threads (1), not wall time; the run had its cores 25% of the wall time'
        >>> billing([{"settings": {"device": "cpu"}, "wall_s": 4.0, "device_s": 4.0}])
        'billed: wall time (1 price tag from before CPU seconds were recorded)'
    """
    parts = []
    cpu = [t for t in tags if t.get("settings", {}).get("device", "cpu") == "cpu" and "cpu_s" in t]
    old = [t for t in tags if "cpu_s" not in t]
    gpu = [t for t in tags if t.get("settings", {}).get("device", "cpu") != "cpu" and "cpu_s" in t]
    if cpu:
        threads = sorted({str(t.get("cpu_threads") or 1) for t in cpu})
        wall, device = sum(t.get("wall_s") or 0 for t in cpu), sum(t.get("device_s") or 0 for t in cpu)
        # ranks multiply device-seconds, not wall seconds: the share is per rank only for one-rank runs
        share = f"; the run had its cores {device / wall:.0%} of the wall time" if wall and device <= wall else ""
        parts.append(f"CPU seconds / threads ({', '.join(threads)}), not wall time{share}")
    if gpu:
        parts.append("GPU wall time")
    if old:
        parts.append(f"wall time ({len(old)} price tag{'s' if len(old) > 1 else ''} from before CPU seconds were "
                     "recorded)")
    return "billed: " + "; ".join(parts)


def price_tag(path: str | Path, region: str | None = None, grid_intensity: float | None = None,
              price_per_hour: float | None = None, power_watts: float | None = None) -> dict[str, Any]:
    """The tag of a run, or the sum over an experiment's runs (``runs``: how many, ``per_run``: each one's)."""
    folders = run_folders(path)
    tags = [read_tag(f) for f in folders]
    total: dict[str, Any] = {k: sum(t.get(k) or 0 for t in tags) for k in SUMMED}
    # an old tag has no CPU seconds: its wall seconds, which it was billed by, stand in for them
    total["cpu_s"] = sum(t["cpu_s"] if "cpu_s" in t else t.get("device_s") or 0 for t in tags)
    total["billing"] = billing(tags)
    co2 = cost = kwh = 0.0
    given = {k: v for k, v in (("region", region), ("grid_intensity", grid_intensity),
                                ("power_watts", power_watts), ("price_per_hour", price_per_hour)) if v is not None}
    for tag in tags:
        saved = tag.get("settings", {})
        # the run's own settings, with the ones given here in their place (a region brings its intensity)
        merged = {**saved, **given} if "grid_intensity" in given or "region" not in given else \
            {**saved, **given, "grid_intensity": None}
        if "region" not in given and merged.get("region") == "custom":  # the run gave its intensity, not a region
            merged["region"] = None
        settings = PriceSettings.resolve(merged.get("device", "cpu"), merged.get("region"),
                                         merged.get("grid_intensity"), merged.get("power_watts"),
                                         merged.get("price_per_hour"))
        measured = tag.get("energy_method", "").startswith("measured")
        joules = tag["energy_kwh"] * 3.6e6 if measured else None
        derived = settings.derived(tag.get("device_s", 0.0), joules)
        kwh += derived["energy_kwh"]
        co2 += derived["co2e_kg"]
        cost += derived["cost_usd"]
    methods = sorted({t.get("energy_method", "?") for t in tags})
    total.update({"energy_kwh": kwh, "co2e_kg": co2, "co2e_lbs": co2 * LBS_PER_KG, "cost_usd": cost,
                  "energy_method": "; ".join(methods), "runs": len(tags),
                  "flop_check_ratio": [t.get("flop_check", {}).get("ratio") for t in tags if t.get("flop_check")]})
    if len(folders) > 1:
        total["per_run"] = [{"run": str(f), **{k: t.get(k) for k in (*SUMMED, "energy_kwh", "co2e_kg", "cost_usd")}}
                            for f, t in zip(folders, tags)]
    return total


def run_tags(path: str | Path) -> dict[str, Any] | None:
    """The sum over the run folders in or below ``path`` (``total``) and each one's tag (``runs``: path relative
    to ``path``, FLOPs, tokens, seconds, energy and its method, CO2e, cost), for a report's price-tag table; None
    when no run below it has a price tag yet.

    Example:
        >>> import tempfile
        >>> run_tags(tempfile.mkdtemp()) is None
        True
    """
    path = Path(path)
    try:
        total = price_tag(path)
    except UserInputError:
        return None
    folders = run_folders(path)
    runs = []
    for folder in folders:
        tag = read_tag(folder)
        runs.append({"run": folder.relative_to(path).as_posix() or ".", "energy_method": tag.get("energy_method"),
                     **{k: tag.get(k) for k in (*SUMMED, "energy_kwh", "co2e_kg", "cost_usd")}})
    return {"total": {k: v for k, v in total.items() if k != "per_run"}, "runs": runs}


def tag_line(tag: dict[str, Any]) -> str:
    """A price tag in one line: FLOPs, device-hours, energy (and how it was obtained), CO2e, cost.

    Example:
        >>> tag_line({"total_flops": 1.5e12, "device_s": 36.0, "energy_kwh": 6.5e-4, "energy_method": "estimated",
        ...           "co2e_kg": 3.1e-4, "cost_usd": 5e-4})
        '1.5e+12 FLOPs, 0.01 device-h, 0.00065 kWh (estimated), 0.31 g CO2e, $0.0005'
    """
    kinds = sorted({part.split(":")[0].strip() for part in str(tag.get("energy_method") or "").split(";")} - {""})
    method = " and ".join(kinds)
    return (f"{tag.get('total_flops') or 0:.3g} FLOPs, {(tag.get('device_s') or 0) / 3600:.3g} device-h, "
            f"{tag.get('energy_kwh') or 0:.3g} kWh{f' ({method})' if method else ''}, "
            f"{(tag.get('co2e_kg') or 0) * 1000:.3g} g CO2e, ${tag.get('cost_usd') or 0:.2g}")


def reference_rows(co2e_kg: float) -> list[tuple[str, float]]:
    """('this run', lbs CO2e) followed by the lecture's reference points, in lbs CO2e."""
    return [("this run", co2e_kg * LBS_PER_KG), *STRUBELL_2019]


def format_tag(tag: dict[str, Any]) -> str:
    """The tag as aligned lines, then the reference points with their source."""
    what = f"{tag['runs']} runs (sum)" if tag["runs"] > 1 else "1 run"
    lines = [f"price tag of {what}",
             f"  FLOPs           {tag['total_flops']:.4g}",
             f"  tokens          {tag['total_tokens']:,}",
             f"  CPU time        {tag.get('cpu_s', tag['device_s']):,.1f} CPU-s, beside {tag['wall_s']:,.1f} s of "
             "wall time",
             f"  device time     {tag['device_s'] / 3600:.4g} device-h (the billed time)",
             f"  {tag.get('billing') or 'billed: device time'}",
             f"  energy          {tag['energy_kwh']:.4g} kWh ({tag['energy_method']})",
             f"  CO2e            {tag['co2e_kg']:.4g} kg ({tag['co2e_lbs']:.4g} lbs)",
             f"  cost            ${tag['cost_usd']:.4g}"]
    lines.append(f"for scale, CO2e in lbs ({REFERENCE_SOURCE}):")
    lines += [f"  {name:<42} {lbs:>14,.6g}" for name, lbs in reference_rows(tag["co2e_kg"])]
    return "\n".join(lines)
