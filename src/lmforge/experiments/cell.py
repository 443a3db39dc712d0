"""One cell x seed of a grid, run in a process of its own: ``python -m lmforge.experiments.cell RUN/task.json``.

The runner writes ``RUN/task.json`` (the stages' settings, the seed, the thread count) and starts this module in a
child process, so a crash, an out-of-memory kill or a diverged run of one cell leaves the runner and the other cells
alone. The stages are ordinary lmforge runs in ordinary run folders::

    RUN/pretrain/     training.pretrain.pretrain(TrainConfig)              (a pretrain grid)
    RUN/finetune/     tasks.run.run_finetune(settings), --model RUN/pretrain/model for a chained stage
    RUN/prompt/       prompting.generative.run_few_shot(settings): `prompt generate` at the cell's k, seeds [seed]
    RUN/<stage>.json  the stage's metrics, written when it finished: a rerun skips the stage
    RUN/result.json   status ok (metrics, steps, tokens, seconds) or failed (the error): the runner reads it

A stage with checkpoints is resumed (``pretrain --resume`` semantics: the same batches, masks and dropout as an
uninterrupted run, so its metrics match bit for bit); a stage folder without one (a prompt stage has none) is
started afresh.

Example (the shape of a task file; see :func:`run_task`)::

    {"cell": "pos=rope", "seed": 0, "threads": 1, "flops_per_step": 123456, "order": ["pretrain", "finetune"],
     "stages": {"pretrain": {...TrainConfig fields...}, "finetune": {...}}}
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.prompting.generative import run_few_shot
from lmforge.tasks.run import run_finetune
from lmforge.evaluation.benchmarks import task_settings
from lmforge.training.config import TrainConfig
from lmforge.training.logging import METRICS_FILE, read_metrics
from lmforge.training.pretrain import pretrain
from lmforge.training.state import CheckpointManager
from lmforge.training.trainer import MODEL_DIR
from lmforge.utils.io import atomic_write_text

TASK_FILE = "task.json"
RESULT_FILE = "result.json"
LOG_FILE = "cell.log"
EXIT_INTERRUPTED = 130


class CellInterrupted(Exception):
    """A signal stopped a stage: its checkpoint is saved, and the cell is neither finished nor failed."""


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is none (yet)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _fresh(folder: Path) -> bool:
    """Whether a stage starts afresh in ``folder``: no checkpoint to resume from. A folder a killed stage left
    before its first checkpoint is removed, so that nothing of it (a half-written log) leaks into the new run."""
    if CheckpointManager(folder / "checkpoints").steps():
        print(f"{folder.name}: resuming from the newest checkpoint in {folder / 'checkpoints'}", file=sys.stderr,
              flush=True)
        return False
    if folder.exists():
        shutil.rmtree(folder)
    return True


def _last(records: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return next((r for r in reversed(records) if r.get(key) is not None), {})


def pretrain_stage(run: Path, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """Pre-train in ``run/pretrain`` (resuming its checkpoint); the last evaluation's and step's metrics."""
    out = run / "pretrain"
    config = TrainConfig.from_dict({**settings, "out": str(out), "seed": seed, "resume": not _fresh(out)},
                                   source=str(run / TASK_FILE))
    result = pretrain(config)
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        raise CellInterrupted(result.stopped_by)
    records = read_metrics(out / METRICS_FILE)
    evaluation, last = _last(records, "eval_loss"), _last(records, "loss")
    metrics = {k: evaluation.get(k) for k in ("eval_loss", "eval_ppl", "eval_accuracy")}
    metrics["train_loss"] = last.get("loss")
    return {"metrics": metrics, "steps": result.step, "tokens": sum(r.get("tokens", 0) for r in records),
            "model": str(out / MODEL_DIR)}


def finetune_stage(run: Path, settings: dict[str, Any], seed: int, model: str | None) -> dict[str, Any]:
    """Fine-tune in ``run/finetune`` (``model``: the pre-trained stage's folder); the last evaluation's scores."""
    out = run / "finetune"
    given = {k: v for k, v in settings.items() if k != "peft"}
    if model is not None:
        given["model"] = model
    resume = not _fresh(out)
    full = task_settings({**given, "out": str(out), "seed": seed, "resume": resume})  # a task by name resolved here
    full["peft"] = settings.get("peft")
    outcome = run_finetune(full, log=lambda line: print(line, file=sys.stderr, flush=True))
    if outcome.stopped_by in ("SIGINT", "SIGTERM"):
        raise CellInterrupted(outcome.stopped_by)
    records = read_metrics(out / METRICS_FILE)
    # The last evaluation: of --eval and the eval sets, or of the eval sets alone (eval_<NAME>_loss).
    evaluation = next((r for r in reversed(records) if any(k.startswith("eval_") for k in r)), {})
    metrics = {f"finetune_{k[len('eval_'):]}": v for k, v in evaluation.items() if k.startswith("eval_")}
    return {"metrics": metrics, "steps": outcome.step, "tokens": sum(r.get("tokens", 0) for r in records)}


def prompt_stage(run: Path, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """Prompt the cell's model in ``run/prompt`` at its k, with the demonstrations seed ``seed`` draws; the score."""
    out = run / "prompt"
    _fresh(out)
    result = run_few_shot({**settings, "model": [settings["model"]], "shots": [settings["shots"]], "seeds": [seed],
                           "out": str(out)}, log=lambda line: print(line, file=sys.stderr, flush=True))
    score = result["models"][settings["model"]]["table"][0]["mean"]
    return {"metrics": {f"prompt_{result['metric']}": score}, "steps": None, "tokens": None}


STAGES = {"pretrain": pretrain_stage, "prompt": prompt_stage}


def run_task(run: str | Path) -> dict[str, Any]:
    """Run the stages ``run/task.json`` describes (skipping finished ones) and write ``run/result.json``.

    Returns the result; a stage's LmforgeError or bug is recorded as ``status: failed`` with its error line.
    Raises CellInterrupted when a signal stopped a stage (nothing is recorded).
    """
    run = Path(run)
    task = json.loads((run / TASK_FILE).read_text(encoding="utf-8"))
    torch.set_num_threads(task["threads"])
    started = time.perf_counter()
    seconds = (read_json(run / "seconds.json") or {}).get("seconds", 0.0)  # of earlier, interrupted attempts
    record: dict[str, Any] = {"metrics": {}, "steps": None, "tokens": None, "flops": None}
    try:
        model = None
        for stage in task["order"]:  # pretrain before finetune (the file's keys are sorted)
            settings = task["stages"][stage]
            done = read_json(run / f"{stage}.json")
            if done is None:
                done = STAGES[stage](run, settings, task["seed"]) if stage in STAGES else \
                    finetune_stage(run, settings, task["seed"], model)
                write_json(run / f"{stage}.json", done)
            model = done.get("model")
            record["metrics"].update(done["metrics"])
            if record["steps"] is None:  # the budget's stage: the first one
                record["steps"], record["tokens"] = done["steps"], done["tokens"]
        if task.get("flops_per_step"):
            record["flops"] = task["flops_per_step"] * record["steps"]
        record.update(status="ok", error=None)
    except CellInterrupted:
        write_json(run / "seconds.json", {"seconds": seconds + time.perf_counter() - started})
        raise
    except LmforgeError as exc:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug in lmforge: the traceback goes to the cell's log, one line to the result
        traceback.print_exc()
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    record["seconds"] = seconds + time.perf_counter() - started
    write_json(run / RESULT_FILE, record)
    return record


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the runner that started it dies (even by SIGKILL): an orphaned cell
    would keep writing into a folder that a rerun is about to resume."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: a killed runner leaves its cells running to their end
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("LMFORGE_CELL_PDEATHSIG", "1") == "1":
        _die_with_parent()
    try:
        record = run_task(argv[0])
    except CellInterrupted:
        return EXIT_INTERRUPTED
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
