"""Run the quickstart: every stage in order within the budget, skipping finished ones, then the report.

    for each stage not yet recorded in OUT/stages/:
        seconds = its share of the time left (lmforge.quickstart.budget)
        record  = stage.run(ctx, seconds)       # writes its outputs under OUT
        OUT/stages/<stage>.json <- record       # atomic: the stage is finished exactly when this exists
    OUT/report.json, OUT/report.html <- every record; print the summary table

Ctrl-C: a training stage finishes its step and saves a checkpoint (the Trainer handles SIGINT), any other
stage just stops; either way the stage is not recorded, and the same command later resumes it (training)
or redoes it (the rest), after skipping the recorded ones.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import lmforge
import lmforge.quickstart.html as html
import lmforge.quickstart.report as report
from lmforge.quickstart.budget import WEIGHTS, Budget
from lmforge.quickstart.context import Context
from lmforge.quickstart.folder import RunFolder
from lmforge.quickstart.runs import drop_checkpoints
from lmforge.quickstart.serving import chat_commands, serve_command
from lmforge.quickstart.stages import STAGES, Stage
from lmforge.errors import UserInputError
from lmforge.utils.lock import RunFolderLock


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; ``cuda`` without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda: no CUDA device is visible to torch (use --device cpu)")
    if device not in ("cpu", "cuda"):
        raise UserInputError(f"--device {device!r}: choose cpu, cuda or auto")
    return device


def busy_cores(samples: int = 5, interval: float = 0.1) -> float:
    """How many cores other processes are using now: the median count of runnable tasks in ``/proc/stat``
    over ``samples`` readings, less this process. Where that file is missing, the 1-minute load average.

    Why not the load average alone: it trails by a minute, so right after ``make demo``'s own ``pip install``
    a quiet machine still looks one core busy and the run would take half the cores it could.
    """
    counts = []
    for i in range(samples):
        try:
            with open("/proc/stat", encoding="ascii") as f:
                line = next((ln for ln in f if ln.startswith("procs_running")), None)
        except OSError:
            line = None
        if line is None:
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        counts.append(max(0, int(line.split()[1]) - 1))  # this process is running while it reads
        if i + 1 < samples:
            time.sleep(interval)
    return float(sorted(counts)[len(counts) // 2])


def choose_threads(requested: int | None = None) -> int:
    """Torch's intra-op threads for this run: ``requested``, else as many cores as others leave free.

    On a machine where other processes hold the cores, two-thread kernels are several times *slower* than
    one (each parallel region ends at a barrier where one thread spins, waiting for a core the other
    process has), so the quickstart takes only the cores that look free when it starts (:func:`busy_cores`);
    never more than torch's current setting, and at least one.
    """
    import torch

    if requested:
        return requested
    cores = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), int(cores - busy_cores() + 0.5)))


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_quickstart(out: str | Path, minutes: float, device: str = "auto", *, restart: bool = False,
                   progress: bool = True, threads: int | None = None, stages: Sequence[Stage] | None = None,
                   clock: Callable[[], float] | None = None) -> dict[str, Any]:
    """Run (or resume) the quickstart in ``out`` and return the report (also written to ``out``).

    Args:
        out: the run folder.
        minutes: the time budget; every stage scales its work to its share of it.
        device: ``cpu``, ``cuda`` or ``auto``.
        restart: delete an earlier run in ``out`` first (otherwise it is resumed, with the same settings).
        progress: progress bars on stderr.
        threads: torch intra-op threads (default: :func:`choose_threads`).
        stages: the stages to run (default: :data:`~lmforge.quickstart.stages.STAGES`; tests pass stand-ins).
        clock: seconds since the start (default: measured from this call).

    Raises:
        lmforge.quickstart.folder.SettingsMismatch: ``out`` holds a run started with another budget or device.
        KeyboardInterrupt: Ctrl-C; finished stages stay recorded, the interrupted one is resumed next time.
    """
    if not minutes > 0:
        raise UserInputError(f"--minutes {minutes}: must be > 0")
    import torch

    stages = STAGES if stages is None else stages
    device = resolve_device(device)
    previous = torch.get_num_threads()
    torch.set_num_threads(choose_threads(threads))
    try:
        return _run(RunFolder(out), float(minutes), device, restart, progress, stages, clock)
    finally:
        torch.set_num_threads(previous)  # the caller's setting again: a library call leaves no global change


def _run(folder: RunFolder, minutes: float, device: str, restart: bool, progress: bool, stages: Sequence[Stage],
         clock: Callable[[], float] | None) -> dict[str, Any]:
    settings = {"minutes": minutes, "device": device, "lmforge_version": lmforge.__version__,
                "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    folder.check(settings, restart)  # reads only: a refused re-run leaves the folder as it was
    with RunFolderLock(folder.root):  # one writer per folder; restart and start check again under the lock
        if restart:
            folder.restart()
        folder.start(settings)
        return _run_stages(folder, minutes, device, progress, stages, clock)


def _run_stages(folder: RunFolder, minutes: float, device: str, progress: bool, stages: Sequence[Stage],
                clock: Callable[[], float] | None) -> dict[str, Any]:
    import torch

    results = folder.results()
    spent = sum(r.get("seconds", 0.0) for r in results.values())
    budget = Budget(minutes * 60, dict(WEIGHTS), spent_before=spent, clock=clock)
    ctx = Context(folder, minutes, device, budget, progress, results)
    names = [s.name for s in stages]
    say(f"lmforge quickstart: {len(names)} stages in about {minutes:g} minutes on {device} "
        f"({torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() != 1 else ''}); "
        f"run folder {folder.root}"
        + (f" (resuming: {len(results)} stages done)" if results else ""))
    for i, stage in enumerate(stages):
        prefix = f"[{i + 1}/{len(names)}] {stage.name}"
        if folder.done(stage.name):
            drop_checkpoints(folder.path("runs", stage.name))  # in case Ctrl-C came between record and cleanup
            say(f"{prefix}: done earlier, skipped ({results[stage.name].get('summary', '')})")
            continue
        remaining = [n for n in names[i:] if not folder.done(n)] + ["report"]
        seconds = budget.allot(stage.name, remaining)
        say(f"{prefix}: {stage.title} (~{seconds:.0f} s)")
        start = time.perf_counter()
        try:
            record = stage.run(ctx, seconds)
        except KeyboardInterrupt:
            say(f"\ninterrupted in stage {stage.name}: the {len(folder.results())} finished stages are kept in "
                f"{folder.root / 'stages'}; run the same command again to resume")
            raise
        record.update(seconds=round(time.perf_counter() - start, 2), budget_seconds=round(seconds, 2),
                      finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        folder.finish(stage.name, record)
        results[stage.name] = record
        drop_checkpoints(folder.path("runs", stage.name))
        say(f"    done in {record['seconds']:.0f} s: {record.get('summary', '')}")
    return finish(folder, stages)


def finish(folder: RunFolder, stages: Sequence[Stage]) -> dict[str, Any]:
    """Write report.json and report.html from the stage records; print the summary table and the path."""
    start = time.perf_counter()
    titles = {s.name: s.title for s in stages}
    figs = html.figures(report.build(folder, titles))  # the slow part: its time belongs in the timings
    result = report.build(folder, titles, report_seconds=time.perf_counter() - start)
    report.write(result, folder)
    page = html.write(result, folder.root, figs)
    print(report.table(result))
    print(f"report: {page.resolve()}")
    command = serve_command(folder.root)
    if command:
        print(f"serve the trained models (OpenAI-compatible API, playground at http://127.0.0.1:8000/):\n  {command}")
    decoder = result["stages"].get("pretrain-gpt") or {}
    if decoder.get("model_dir") and (folder.root / decoder["model_dir"]).is_dir():
        # not instruction-tuned: it chats through the default template (report.html says how to tune it)
        print(f"chat with the decoder:\n  {chat_commands(decoder['model_dir'], folder.root.resolve())['chat']}")
    sys.stdout.flush()
    return result
