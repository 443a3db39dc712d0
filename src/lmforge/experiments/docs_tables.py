"""The documentation's measured tables: regenerated from the grids by one command, and checked for staleness.

Each measured grid has a lab note ``docs/lab/experiments/GRID-SIZE.md``: a header (the command, date, commit,
machine, host load, wall time) and exactly the ``table.md`` its experiment folder's report holds. The manifest
``docs/lab/experiments/tables.json`` records, per table, the grid, the size, the commit and date it was measured
and the **fingerprint** of what determines its numbers: the grid's cells as :func:`~lmforge.experiments.load_grid`
expands them for that size (their commands, settings, steps, budget, seeds, metrics) as canonical JSON, sha256.
Comments, the description and a ``claims:`` section do not count, nor do settings left at their defaults, so
rewording a grid or adding a config field leaves its table current; changing a learning rate does not.

A grid whose fingerprint moved has a stale table: :func:`check_tables` says so, unless a ``rerun_notes`` entry
``{fingerprint, date, note}`` for the new fingerprint says why the change leaves the numbers standing (a
renamed cell, a setting that only moves a log). Code changes are not fingerprinted: a changed model is caught by
re-running, which :func:`regenerate` makes one command (``lmforge experiment docs``, ``make docs-tables``).

Example:
    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> grid = '''# a comment
    ... command: pretrain
    ... description: two encodings
    ... settings: {model: gpt-tiny, objective: clm, data: data, lr: 0.001,
    ...            overrides: {n_layers: 1, d_model: 32, n_heads: 2}}
    ... axes: [{name: pos, variants: [{overrides: {position: rope}}, {overrides: {position: alibi}}]}]
    ... budget: {steps: 20}
    ... '''
    >>> _ = (d / "g.yaml").write_text(grid)
    >>> _ = (d / "reworded.yaml").write_text(grid.replace("two encodings", "rope or alibi").replace("# a", "# one"))
    >>> _ = (d / "faster.yaml").write_text(grid.replace("lr: 0.001", "lr: 0.003"))
    >>> fingerprint(d / "g.yaml") == fingerprint(d / "reworded.yaml"), fingerprint(d / "g.yaml") == \\
    ...     fingerprint(d / "faster.yaml")
    (True, False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from lmforge.errors import UserInputError
from lmforge.experiments.grid import Grid, GridError, load_grid, read_grid
from lmforge.experiments.report import RESULTS_FILE, TABLE_FILE, read_results
from lmforge.peft.config import PeftConfig
from lmforge.training.config import TrainConfig
from lmforge.utils.io import atomic_write_text, read_text_file

TABLES_DIR = Path("docs/lab/experiments")  # relative to the repository root
MANIFEST = "tables.json"
# Grid fields that describe rather than determine: they never reach a cell.
NOT_MEASURED = ("description", "claims")
# The header commands that prepare a grid's inputs (see the grids' comments), and the file each leaves when done.
PREPARE = {("tokenizer", "train"): None, ("data", "prepare"): "manifest.json"}
_CHDIR = threading.Lock()  # the working folder is the process's: one change at a time
DATASET_PATH = re.compile(r"\$\(lmforge datasets path ([A-Za-z0-9_.:-]+)\)")


# ------------------------------------------------------------------------------------------- fingerprint
def _field_defaults(cls) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


def _explicit(settings: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without the entries at their defaults: a new config field (at the old behaviour) is no
    change to the grid."""
    return {k: v for k, v in settings.items() if k not in defaults or v != defaults[k]}


def _relative(value: Any, folder: str) -> Any:
    """``value`` with the grid folder's absolute path taken out of its strings (the loader resolves relative
    paths that exist there): the fingerprint must not depend on where the checkout lives."""
    if isinstance(value, dict):
        return {k: _relative(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, folder) for v in value]
    if isinstance(value, str) and value.startswith(folder + os.sep):
        return value[len(folder) + 1:]
    return value


def measured_grid(path: str | Path, size: str | None = None) -> Grid:
    """The grid file ``path`` loaded for ``size`` without the fields that do not reach a cell (description,
    claims).

    It loads from an empty folder: a data path relative to the working folder (``data/austen-gpt``, prepared
    from the repository root) then finds nothing, so the loader skips reading the prepared data for a FLOP count,
    which no fingerprinted field holds. The fingerprint stays fast, and the same with the data prepared or not.
    """
    path = Path(path).resolve()
    raw = {k: v for k, v in read_grid(path).items() if k not in NOT_MEASURED}
    with _CHDIR, tempfile.TemporaryDirectory() as empty:
        cwd = os.getcwd()
        os.chdir(empty)
        try:
            return load_grid(path, size, raw=raw)
        finally:
            os.chdir(cwd)


def fingerprint_payload(grid: Grid) -> dict[str, Any]:
    """What determines a grid's numbers, as plain data: command, size, seeds, metrics, budget and, per cell, its
    id, axes, steps, tokens per step and each stage's explicit settings."""
    train_defaults, peft_defaults = _field_defaults(TrainConfig), _field_defaults(PeftConfig)
    cells = []
    for cell in grid.cells:
        stages = {}
        for name, settings in cell.stages.items():
            settings = dict(settings)
            if name == "pretrain":
                settings = _explicit(settings, train_defaults)
            if isinstance(settings.get("peft"), dict):
                settings["peft"] = _explicit(settings["peft"], peft_defaults)
            stages[name] = settings
        cells.append({"id": cell.id, "axes": cell.axes, "steps": cell.steps, "tokens_per_step": cell.tokens_per_step,
                      "stages": stages})
    budget = None if grid.budget is None else {k: v for k, v in grid.budget.to_dict().items() if v is not None}
    payload = {"command": grid.command, "size": grid.size, "seeds": grid.seeds, "metrics": grid.metrics,
               "budget": budget, "cells": cells}
    return _relative(payload, str(grid.path.parent.resolve()))


def fingerprint(path: str | Path, size: str | None = None) -> str:
    """sha256 of the canonical JSON of :func:`fingerprint_payload` for the grid file ``path`` at ``size``."""
    payload = fingerprint_payload(measured_grid(path, size))
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------- manifest
def table_name(grid: str | Path, size: str | None) -> str:
    """The lab note's file name: ``positions-small.md`` (``-default`` without a size)."""
    return f"{Path(grid).stem}-{size or 'default'}.md"


def read_manifest(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a ``tables.json`` (none when it is missing); a malformed one is one line naming the file."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = json.loads(read_text_file(path, "manifest"))
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    entries = data.get("tables") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UserInputError(f"{path}: expected {{\"tables\": [...]}}")
    for i, entry in enumerate(entries):
        missing = [k for k in ("grid", "size", "table", "fingerprint", "commit", "date")
                   if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise UserInputError(f"{path}: tables[{i}]: missing {', '.join(missing)}")
        for j, note in enumerate(entry.get("rerun_notes") or []):
            if not isinstance(note, dict) or not all(isinstance(note.get(k), str) and note[k].strip()
                                                     for k in ("fingerprint", "date", "note")):
                raise UserInputError(f"{path}: tables[{i}] ({entry['grid']}): rerun_notes[{j}]: give fingerprint, "
                                     "date and note (why the change leaves the numbers standing)")
    return entries


def write_manifest(path: str | Path, entries: list[dict[str, Any]]) -> None:
    """Write ``tables.json`` atomically, entries ordered by grid and size."""
    ordered = sorted(entries, key=lambda e: (e["grid"], e["size"] or ""))
    atomic_write_text(path, json.dumps({"tables": ordered}, indent=2, ensure_ascii=False) + "\n")


def check_tables(root: str | Path = ".", manifest: str | Path | None = None) -> list[str]:
    """One line per stale or missing table of the manifest (``root/docs/lab/experiments/tables.json`` unless
    given); grid and table paths in it are relative to ``root``. Empty: every table is current."""
    root = Path(root)
    manifest = Path(manifest) if manifest is not None else root / TABLES_DIR / MANIFEST
    problems = []
    for entry in read_manifest(manifest):
        grid, size = root / entry["grid"], entry["size"]
        rerun = f"`make docs-tables GRIDS={entry['grid']}{f' SIZE={size}' if size else ''}`"
        table = manifest.parent / entry["table"]
        if not table.is_file():
            problems.append(f"{manifest}: {entry['grid']} ({size}): table {table} is missing; regenerate it with "
                            f"{rerun}")
        if not grid.is_file():
            problems.append(f"{manifest}: {entry['grid']}: no such grid file; remove its entry or restore it")
            continue
        try:
            now = fingerprint(grid, size)
        except GridError as exc:
            problems.append(f"{manifest}: {entry['grid']} ({size}): the grid no longer loads: {exc}")
            continue
        accepted = {entry["fingerprint"], *(n["fingerprint"] for n in entry.get("rerun_notes") or [])}
        if now not in accepted:
            problems.append(f"{manifest}: {entry['grid']} ({size}): the grid changed since its table was measured "
                            f"at {entry['commit']} (fingerprint {now[:12]}, recorded {entry['fingerprint'][:12]}); "
                            f"re-run {rerun}, or add to its rerun_notes {{\"fingerprint\": \"{now}\", \"date\": "
                            "..., \"note\": \"why the numbers stand\"}")
    return problems


# ------------------------------------------------------------------------------------------- data
def prepare_commands(grid_path: str | Path) -> list[list[str]]:
    """The ``lmforge tokenizer train`` / ``lmforge data prepare`` commands a grid's header comment lists (lines
    ending in ``\\`` continue), with ``$(lmforge datasets path NAME)`` put in as the bundled file's path."""
    from lmforge import datasets

    lines = []
    for line in read_text_file(grid_path, "grid").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    commands, current = [], ""
    for line in lines:
        current = f"{current} {line}".strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        words = DATASET_PATH.sub(lambda m: shlex.quote(str(datasets.path(m.group(1)))), current)
        words = shlex.split(words) if current.startswith("lmforge ") else []
        if len(words) > 2 and tuple(words[1:3]) in PREPARE:
            commands.append(words)
        current = ""
    return commands


def _prepared(words: list[str], root: Path) -> bool:
    if "--out" not in words or words.index("--out") + 1 >= len(words):
        return False
    out = root / words[words.index("--out") + 1]
    done = PREPARE[tuple(words[1:3])]
    return (out / done).is_file() if done else out.is_dir() and any(out.iterdir())


def prepare_data(grid_path: str | Path, root: str | Path = ".", log: Callable[[str], None] = print) -> int:
    """Run the preparation commands of the grid's header whose ``--out`` is not there yet, from ``root`` (the
    headers' paths are relative to the repository root); returns how many ran.

    Raises:
        UserInputError: a command failed (its exit code and the command).
    """
    ran = 0
    for words in prepare_commands(grid_path):
        if _prepared(words, Path(root)):
            continue
        log(f"{grid_path}: preparing: {shlex.join(words)}")
        code = subprocess.call([sys.executable, "-m", "lmforge.cli.main", *words[1:]], cwd=root)
        if code != 0:
            raise UserInputError(f"{grid_path}: the header's preparation command failed (exit {code}): "
                                 f"{shlex.join(words)}")
        ran += 1
    return ran


# ------------------------------------------------------------------------------------------- regenerate
def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine() -> str:
    """The CPU's model name and core count (``lscpu``'s model name where there is one)."""
    name = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


class LoadSampler:
    """The 1-minute load average, sampled every ``every`` seconds in a thread while a grid runs."""

    def __init__(self, every: float = 15.0):
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min {secs} s" if hours else f"{minutes} min {secs} s"


def invocations_file(out: Path) -> Path:
    """Where the docs command logs each invocation that ran cells of ``out`` (beside it: the experiment folder
    holds only what the runner writes)."""
    return out.parent / f"{out.name}.invocations.jsonl"


def read_invocations(out: Path) -> list[dict[str, Any]]:
    path = invocations_file(out)
    if not path.is_file():
        return []
    return [json.loads(line) for line in read_text_file(path).splitlines() if line.strip()]


def lab_note(grid: str, size: str | None, command: str, table: str, *, invocations: list[dict[str, Any]],
             rows: list[dict[str, Any]], commit: str, dirty: bool, threads: int | None, host: str, fp: str) -> str:
    """The generated file: a header of how and where it was measured, then the report's ``table.md`` as is.

    ``invocations``: the runs of the command that ran cells (``started``, ``ended``: ISO times; ``wall``: seconds;
    ``ran``: cell x seed runs; ``load``: the 1-minute load average's min and max); a resumed experiment has several,
    and their walls add up."""
    seconds = sum(r.get("seconds") or 0 for r in rows)
    ok = sum(r.get("status") == "ok" for r in rows)
    start = datetime.fromisoformat(invocations[0]["started"])
    end = datetime.fromisoformat(invocations[-1]["ended"])
    wall = sum(i["wall"] for i in invocations)
    low, high = min(i["load"][0] for i in invocations), max(i["load"][1] for i in invocations)
    span = f"{start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC" if start.date() == end.date() else \
        f"{start:%Y-%m-%d %H:%M} UTC to {end:%Y-%m-%d %H:%M} UTC"
    parts = f" in {len(invocations)} invocations (resumed)" if len(invocations) > 1 else ""
    lines = [f"# {Path(grid).name}{f' at size {size}' if size else ''}", "",
             "Generated by `lmforge experiment docs` (`make docs-tables`); do not edit by hand: re-run it.", "",
             f"- command: `{command}`",
             f"- date: {span}",
             f"- commit: `{commit or 'unknown'}`{' with uncommitted changes' if dirty else ''}",
             f"- grid fingerprint: `{fp[:16]}` (docs/lab/experiments/tables.json)",
             f"- machine: {host}; {threads or 'cores / workers'} torch thread(s) per cell",
             f"- host load (1-minute average, sampled during the run): {low:.1f} to {high:.1f}",
             f"- {len(rows)} runs, {ok} ok: {_duration(wall)} wall{parts}, {seconds:,.0f} cell-seconds "
             f"({seconds / 3600:.2f} CPU-hours at one thread per cell)", "",
             "The seconds depend on the host's load; the losses and scores do not (same seeds, same thread count).",
             "", table.rstrip("\n"), ""]
    return "\n".join(lines)


def regenerate(grids: list[str], size: str | None, runs_dir: str | Path, *, root: str | Path = ".",
               workers: int = 1, threads: int | None = None, command: str = "",
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """For each grid (a path relative to ``root``): prepare its data if missing, run it at ``size`` into
    ``runs_dir/GRID-SIZE`` (resuming a folder already there), copy its ``table.md`` with a header into
    ``root/docs/lab/experiments/GRID-SIZE.md`` and record it in the manifest (each written atomically, the
    manifest after the table). Each invocation that ran cells is logged beside the experiment folder
    (:func:`invocations_file`), so that the header of a resumed grid adds up the walls of the runs that did the
    work. Returns the new manifest entries: none for a grid with a failed or interrupted run (its table is not
    copied; the next call resumes an interrupted run, and ``lmforge experiment run GRID --out DIR --size SIZE
    --retry-failed`` reruns the failed ones).

    Raises:
        UserInputError: a grid that is not under ``root``.
    """
    from lmforge.experiments.runner import run_grid  # the runner spawns cells; the checker never needs it

    root = Path(root).resolve()
    manifest = root / TABLES_DIR / MANIFEST
    done = []
    for i, grid in enumerate(grids, 1):
        path = Path(grid) if Path(grid).is_absolute() else root / grid
        try:
            name = path.resolve().relative_to(root).as_posix()
        except ValueError:
            raise UserInputError(f"{grid}: not a grid under {root}; the docs' tables come from the repository's "
                                 "grids") from None
        fp = fingerprint(path, size)  # a bad grid or size fails here, before anything is prepared or run
        log(f"[{i}/{len(grids)}] {name} ({size or 'default size'}): preparing data")
        prepare_data(path, root, log)
        out = Path(runs_dir) / Path(name).stem / (size or "default")
        log(f"[{i}/{len(grids)}] {name}: running into {out}")
        started, clock = datetime.now(timezone.utc), time.monotonic()
        cwd = os.getcwd()
        os.chdir(root)  # the grids' data paths are relative to the repository root, as their headers say
        try:
            with LoadSampler() as load:
                # extend: a grid whose comments or claims changed still resumes (a changed cell is refused)
                result = run_grid(path, out if out.is_absolute() else Path(cwd) / out, size=size, workers=workers,
                                  threads=threads, extend=True, log=lambda line, n=name: log(f"{n}: {line}"))
        finally:
            os.chdir(cwd)
        wall = time.monotonic() - clock
        invocations = read_invocations(result.out)
        if result.ok or result.failed or not invocations:  # this one ran cells (or is all there is to say)
            invocations.append({"started": started.isoformat(timespec="seconds"),
                                "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "wall": round(wall, 1), "ran": result.ok + result.failed,
                                "load": [min(load.samples), max(load.samples)]})
            atomic_write_text(invocations_file(result.out), "".join(json.dumps(i) + "\n" for i in invocations))
        if result.interrupted or any(e["failed"] for e in result.table):  # a partial table is not shipped
            failed = sum(len(e["failed"]) for e in result.table)
            log(f"[{i}/{len(grids)}] {name}: {failed} run(s) failed, {result.interrupted} interrupted (see "
                f"{result.out / RESULTS_FILE}); its table was not copied into the docs")
            continue
        table = read_text_file(result.out / TABLE_FILE)
        rows = read_results(result.out)
        commit, dirty = _git(root, "rev-parse", "--short", "HEAD"), bool(_git(root, "status", "--porcelain"))
        note = lab_note(name, size, command or f"lmforge experiment docs {name} --size {size}", table,
                        invocations=invocations, rows=rows, commit=commit, dirty=dirty,
                        threads=threads or (rows[0].get("threads") if rows else None), host=machine(), fp=fp)
        target = root / TABLES_DIR / table_name(name, size)
        atomic_write_text(target, note)
        entry = {"grid": name, "size": size, "table": target.name, "fingerprint": fp, "commit": commit,
                 "dirty": dirty, "date": f"{started:%Y-%m-%d}", "rerun_notes": []}
        entries = [e for e in read_manifest(manifest) if (e["grid"], e["size"]) != (name, size)]
        write_manifest(manifest, [*entries, entry])
        log(f"[{i}/{len(grids)}] {name}: {target.relative_to(root)} written ({_duration(wall)}), manifest updated")
        done.append(entry)
    return done


__all__ = ["MANIFEST", "TABLES_DIR", "check_tables", "fingerprint", "fingerprint_payload", "measured_grid",
           "prepare_commands", "prepare_data", "read_manifest", "regenerate", "table_name", "write_manifest"]
