"""Run a grid into an experiment folder, surviving interruption and failure; then write its report.

    OUT/grid.yaml                         a copy of the grid file (a changed grid is refused unless --extend)
    OUT/experiment.json                   its axes, metrics, cells and seeds, for `lmforge experiment report`
    OUT/cells/<cell>/seed-<s>/            one cell x seed: task.json, cell.log, result.json, pretrain/, finetune/
                                          (prompt/ for a prompt grid)
    OUT/results.jsonl                     one row per cell x seed, in grid order
    OUT/table.md  table.csv  plots/  report.html

Order of events: the grid is expanded and every cell's configs are checked, and the packaged models it names must
be installed (nothing is written for a bad grid);
``OUT`` is locked (:class:`~lmforge.utils.lock.RunFolderLock`); cells with a ``result.json`` are skipped (their
folders are not touched), failed ones too unless ``retry_failed``; the rest run, each in a child process, and
``results.jsonl`` is rewritten as each one ends. A killed runner leaves the cells it was running with their
checkpoints; the next run resumes them.

A row: ``cell, seed, axes, settings, metrics, steps, tokens, flops, params, labels, seconds, threads, status, error,
run`` (``params``: the model's non-embedding parameters; ``labels``: its variants' ``labels:``). Wall-
clock fields (``seconds``) differ between runs; with the same thread count, everything else is reproducible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from lmforge.errors import EXIT_ENVIRONMENT, EnvironmentFault, UserInputError
from lmforge.experiments.backends import BACKENDS, run_local, run_ray, threads_per_cell
from lmforge.experiments.cell import LOG_FILE, RESULT_FILE, TASK_FILE, read_json, write_json
from lmforge.experiments.grid import Grid, GridError, load_grid
from lmforge.experiments.report import CELLS_DIR, EXPERIMENT_FILE, RESULTS_FILE, write_report
from lmforge.utils.faults import ADVICE
from lmforge.utils.io import atomic_write_text, read_text_file
from lmforge.utils.lock import RunFolderLock

GRID_COPY = "grid.yaml"
WALL_CLOCK = ("seconds",)  # row fields that differ between identical runs
INTERRUPTED = (130, -2, 143, -15)  # the cell stopped on SIGINT/SIGTERM after saving a checkpoint


@dataclass
class ExperimentRun:
    """What :func:`run_grid` did: how many cell x seed runs finished, failed, were skipped (already done) or
    were interrupted, and the summarized table."""

    out: Path
    ok: int
    failed: int
    skipped: int
    interrupted: int
    table: list[dict[str, Any]]


def run_folder(out: Path, cell: str, seed: int) -> Path:
    return out / CELLS_DIR / cell / f"seed-{seed}"


def check_grid_copy(grid: Grid, out: Path, extend: bool) -> None:
    """Refuse a grid that differs from the one ``out`` was run with, unless ``extend`` and it only adds cells
    (or seeds): the settings of every existing cell must be unchanged."""
    copy = out / GRID_COPY
    if not copy.is_file():
        return
    meta = read_json(out / EXPERIMENT_FILE) or {}
    old_raw = yaml.safe_load(read_text_file(copy))
    if _cells_part(old_raw) == _cells_part(grid.raw) and meta.get("size") == grid.size:
        return  # claims change no cell: a grid that only adds or edits them resumes, and its copy takes them
    if not extend:
        raise UserInputError(f"{grid.path}: differs from the grid {out} was run with ({copy}"
                             f"{', size ' + str(meta.get('size')) if meta.get('size') != grid.size else ''}); pass "
                             "--extend to add its new cells, or choose another --out")
    old = load_grid(grid.path, meta.get("size"), raw=old_raw)
    new = {cell.id: cell for cell in grid.cells}
    for cell in old.cells:
        if cell.id not in new:
            raise UserInputError(f"{grid.path}: --extend only adds cells; cell {cell.id} of {copy} is missing")
        if new[cell.id].stages != cell.stages:
            changed = sorted(k for s in cell.stages for k in set(cell.stages[s]) | set(new[cell.id].stages.get(s, {}))
                             if cell.stages[s].get(k) != new[cell.id].stages.get(s, {}).get(k))
            raise UserInputError(f"{grid.path}: cell {cell.id}: --extend cannot change an existing cell's settings "
                                 f"({', '.join(changed) or 'its stages'} changed); choose another --out")
    if set(old.seeds) - set(grid.seeds):
        raise UserInputError(f"{grid.path}: --extend only adds seeds; seeds {sorted(set(old.seeds) - set(grid.seeds))}"
                             " are missing")
    if old.metrics != grid.metrics:
        raise UserInputError(f"{grid.path}: metrics: --extend cannot change the metrics ({old.metrics} -> "
                             f"{grid.metrics}); choose another --out")


def _cells_part(raw: Any) -> Any:
    """A grid's raw mapping without the fields that change no cell (``claims``, ``description``)."""
    return {k: v for k, v in raw.items() if k not in ("claims", "description")} if isinstance(raw, dict) else raw


def check_runner_options(workers: int, threads: int | None, backend: str) -> None:
    """Refuse a backend lmforge does not have, or fewer than one worker or thread."""
    if backend not in BACKENDS:
        raise UserInputError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if workers < 1 or (threads is not None and threads < 1):
        raise UserInputError(f"--workers {workers} / --threads {threads}: must be >= 1")


def _row(grid: Grid, out: Path, cell, seed: int, result: dict[str, Any], threads: int | None) -> dict[str, Any]:
    return {"cell": cell.id, "seed": seed, "axes": cell.axes, "settings": cell.stages,
            "metrics": {m: result.get("metrics", {}).get(m) for m in grid.metrics},
            "steps": result.get("steps"), "tokens": result.get("tokens"), "flops": result.get("flops"),
            "params": cell.params, "labels": cell.labels,
            "seconds": result.get("seconds"), "threads": threads, "status": result["status"],
            "error": result.get("error"), "run": str(run_folder(out, cell.id, seed).relative_to(out))}


def machine_fault(out: str | Path) -> EnvironmentFault | None:
    """The first failed cell in ``OUT/results.jsonl`` that the machine refused (a full disk, a read-only folder), as
    the :class:`~lmforge.errors.EnvironmentFault` the experiment ends with (exit 3, not a cell's exit 1): the cells
    after it met the same disk, and ``--retry-failed`` reruns them once there is room."""
    path = Path(out) / RESULTS_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []
    for row in rows:
        error = row.get("error") or ""
        if error.startswith(f"{EnvironmentFault.__name__}: "):
            message = error.removeprefix(f"{EnvironmentFault.__name__}: ")
        elif error.startswith(f"the cell's process exited with code {EXIT_ENVIRONMENT};"):
            message = f"{row['run']}: {error}"
        else:
            continue
        code = next((c for c, advice in ADVICE.items() if advice in message), 0)
        return EnvironmentFault(code, f"{message} (cell {row['run']}; rerun with --retry-failed)")
    return None


def write_results(grid: Grid, out: Path) -> list[dict[str, Any]]:
    """Rewrite ``OUT/results.jsonl`` from the cells' ``result.json`` files, in grid order."""
    rows = []
    for cell, seed in grid.runs():
        run = run_folder(out, cell.id, seed)
        result = read_json(run / RESULT_FILE)
        if result is not None:
            task = read_json(run / TASK_FILE) or {}
            rows.append(_row(grid, out, cell, seed, result, task.get("threads")))
    atomic_write_text(out / RESULTS_FILE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return rows


def run_grid(grid_path: str | Path, out: str | Path, *, size: str | None = None, workers: int = 1,
             threads: int | None = None, backend: str = "local", address: str | None = None,
             retry_failed: bool = False, extend: bool = False,
             log: Callable[[str], None] = lambda line: None) -> ExperimentRun:
    """Run every cell x seed of the grid file ``grid_path`` not yet finished into ``out`` (see the module
    docstring), then write the report.

    Args:
        size: one of the grid's ``sizes`` (e.g. ``small``).
        workers: cells run at once by the local backend.
        threads: torch threads per cell (default: the cores shared out among ``workers``; for Ray, ``num_cpus``).
        backend: ``local`` (child processes) or ``ray`` (Ray tasks; ``address`` picks the cluster).
        retry_failed: run the failed cells again (resuming their checkpoints).
        extend: accept a grid that adds cells or seeds to the one ``out`` was run with.
    """
    check_runner_options(workers, threads, backend)
    grid = load_grid(grid_path, size)
    grid.check_models()
    check_inputs(grid)  # every cell's, before the first one runs: a typo fails one line, not every cell
    out = Path(out)
    check_grid_copy(grid, out, extend)  # before the lock creates OUT: a refused grid changes nothing
    local_threads = threads or threads_per_cell(workers)

    def threads_of(cell) -> int:  # a Ray cell uses the cores it reserved
        return (threads or max(1, int(cell.resources.num_cpus))) if backend == "ray" else local_threads

    with RunFolderLock(out):
        check_grid_copy(grid, out, extend)
        atomic_write_text(out / GRID_COPY, read_text_file(grid.path))
        write_json(out / EXPERIMENT_FILE, {"grid": str(grid.path.resolve()), "size": grid.size,
                                           "title": f"{grid.path.stem}{f' ({grid.size})' if grid.size else ''}",
                                           "command": grid.command, "axes": grid.axes, "metrics": grid.metrics,
                                           "cells": [c.id for c in grid.cells], "seeds": grid.seeds})
        pending, skipped = [], 0
        for cell, seed in grid.runs():
            run = run_folder(out, cell.id, seed)
            result = read_json(run / RESULT_FILE)
            if result is not None and (result["status"] == "ok" or not retry_failed):
                skipped += 1
                continue
            if result is not None:
                (run / RESULT_FILE).unlink()
            write_json(run / TASK_FILE, {"cell": cell.id, "seed": seed, "threads": threads_of(cell),
                                         "stages": cell.stages, "order": list(cell.stages),
                                         "flops_per_step": cell.flops_per_step})
            pending.append((run, cell))
        write_results(grid, out)
        counts = {"ok": 0, "failed": 0, "interrupted": 0}

        def done(run: Path, code: int) -> None:
            result = read_json(run / RESULT_FILE)
            if result is None and code in INTERRUPTED:
                counts["interrupted"] += 1
                log(f"{run.relative_to(out)}: interrupted (resumes from its checkpoint on the next run)")
                return
            if result is None:  # the process died without a word: killed, out of memory, a crash in C
                result = {"status": "failed", "error": f"the cell's process exited with code {code}; see "
                                                        f"{run / LOG_FILE}", "metrics": {}}
                write_json(run / RESULT_FILE, result)
            counts["ok" if result["status"] == "ok" else "failed"] += 1
            log(f"{run.relative_to(out)}: {result['status']}"
                + (f" ({result['error']})" if result.get("error") else ""))
            write_results(grid, out)

        log(f"{len(pending)} run(s) to do, {skipped} already done"
            + (f"; {local_threads} thread(s) per cell" if backend == "local" else ""))
        if pending and backend == "local":
            run_local([run for run, _ in pending], workers, local_threads, done)
        elif pending:
            run_ray([(run, c.resources.num_cpus, c.resources.num_gpus, threads_of(c)) for run, c in pending], address,
                    done)
        write_results(grid, out)
        table = write_report(out)
    return ExperimentRun(out, counts["ok"], counts["failed"], skipped, counts["interrupted"], table)


# The settings of each stage that name a file or folder the cell reads. A data set's name (``rt-sentiment:dev``) is
# no path; a value that is one (a separator or a data file's suffix) must exist before any cell runs.
INPUTS = {"pretrain": ("data", "tokenizer", "model"), "finetune": ("train", "eval", "tokenizer", "model", "data_dir"),
          "prompt": ("data", "pool", "model")}
ALWAYS_PATHS = {("pretrain", "data"), ("pretrain", "tokenizer"), ("finetune", "tokenizer"), ("finetune", "data_dir")}
DATA_SUFFIXES = (".tsv", ".csv", ".jsonl", ".json", ".conll", ".gz", ".parquet", ".arrow", ".txt", ".yaml")


def _missing(stage: str, key: str, value: Any) -> bool:
    if not isinstance(value, str) or not value or Path(value).exists():
        return False
    if ":" in value:  # NAME:SPLIT of a shipped data set, DIR:SPLIT of a stored one: the head must exist if a path
        head = value.rpartition(":")[0]
        return Path(head).is_absolute() and not Path(head).exists()
    return (stage, key) in ALWAYS_PATHS or "/" in value or value.startswith(".") or value.endswith(DATA_SUFFIXES)


def check_inputs(grid: Grid) -> None:
    """Refuse a grid one of whose cells names an input file or folder that does not exist (one line naming the
    cell, the setting and the path), before any cell runs or anything is written.

    Raises:
        GridError: the first missing input, in grid order.
    """
    for cell in grid.cells:
        for stage, settings in cell.stages.items():
            values = [(key, settings.get(key)) for key in INPUTS.get(stage, ())]
            values += [(f"eval_sets.{name}", v) for name, v in (settings.get("eval_sets") or {}).items()] \
                if isinstance(settings.get("eval_sets"), dict) else []
            for key, value in values:
                if _missing(stage, key.split(".")[0] if key.startswith("eval_sets") else key, value):
                    raise GridError(f"{grid.path}: cell {cell.id}: {stage} {key}: {value}: no such file or folder; "
                                    "fix the grid (no cell was run)")


def report(out: str | Path) -> list[dict[str, Any]]:
    """Rewrite the report of the experiment folder ``out`` from its results (``lmforge experiment report``)."""
    out = Path(out)
    if not (out / EXPERIMENT_FILE).is_file():
        raise UserInputError(f"{out}: not an experiment folder (no {EXPERIMENT_FILE}); run `lmforge experiment run "
                             "GRID --out DIR` first")
    with RunFolderLock(out):
        return write_report(out)


__all__ = ["ExperimentRun", "GridError", "check_grid_copy", "check_inputs", "check_runner_options", "report",
           "run_grid", "write_results"]
