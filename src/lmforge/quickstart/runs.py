"""Training stages' shared steps: plan the step count from a probe, resume an interrupted run, read its curve.

    plan_run      probe -> seconds/step and set-up time -> max_steps, saved as OUT/stages/<stage>.plan.json;
                  a re-run after Ctrl-C finds the plan and the run's checkpoints and resumes the same schedule
    read_curve    OUT/runs/<stage>/metrics.jsonl -> the loss curve the report plots
    drop_checkpoints  once a stage is recorded, its optimizer state is dead weight on disk
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from lmforge.quickstart.budget import steps_for
from lmforge.quickstart.context import Context
from lmforge.quickstart.probe import Probe
from lmforge.training.logging import METRICS_FILE, read_metrics
from lmforge.training.state import CheckpointManager


def plan_run(ctx: Context, stage: str, seconds: float, probe: Callable[[], Probe],
             fixed: Callable[[float], float] = lambda s: 0.0, minimum: int = 4,
             maximum: int | None = None, setup: float | None = None) -> tuple[dict[str, Any], bool]:
    """The step plan of a training stage, and whether the run resumes from a checkpoint.

    Args:
        ctx: the run.
        stage: the stage's name; its run folder is ``OUT/runs/<stage>``.
        seconds: the stage's share of the budget.
        probe: measures seconds per optimizer step (a :class:`~lmforge.quickstart.probe.Probe`); its own
            time is taken from the share.
        fixed: seconds of the stage's other work (evaluation, decoding) given the seconds per step.
        minimum, maximum: bounds on the step count.
        setup: seconds the run spends before its first step (loading, encoding, building). Default: what the
            probe spent besides its timed steps, since it builds the same trainer the run will.

    Returns:
        ``(plan, resume)``: the plan holds ``max_steps`` and the measurements behind it. ``resume`` is True when
        an earlier attempt of this stage left a plan and a checkpoint: train on from there with the same plan.
        Otherwise a partial run folder without a checkpoint is removed, and the stage is planned afresh.
    """
    run_dir = ctx.path("runs", stage)
    if ctx.folder.plan_file(stage).is_file() and CheckpointManager(run_dir / "checkpoints").steps():
        plan, _ = ctx.folder.plan(stage, dict)
        return plan, True
    ctx.folder.forget_plan(stage)
    shutil.rmtree(run_dir, ignore_errors=True)

    def make() -> dict[str, Any]:
        start = time.perf_counter()
        measured = probe()
        probe_seconds = time.perf_counter() - start
        per_step = measured.seconds_per_step
        ready = setup if setup is not None else max(0.0, probe_seconds - measured.steps * per_step)
        other = fixed(per_step)
        steps = steps_for(seconds - probe_seconds - ready, per_step, other, minimum, maximum)
        return {"budget_seconds": round(seconds, 2), "probe_seconds": round(probe_seconds, 2),
                "seconds_per_step": per_step, "setup_seconds": round(ready, 2), "other_seconds": round(other, 2),
                "max_steps": steps}

    plan, _ = ctx.folder.plan(stage, make)
    return plan, False


def warmup_for(steps: int, share: float = 0.1) -> int:
    """Linear warmup steps: ``share`` of the run, at least 1, always fewer than ``steps`` (so something decays)."""
    return max(0, min(steps - 1, max(1, round(steps * share))))


def read_curve(run_dir: Path) -> dict[str, list]:
    """Training loss per step and evaluation loss where evaluated, from a run's ``metrics.jsonl``."""
    records = read_metrics(Path(run_dir) / METRICS_FILE)
    train = [(r["step"], r["loss"]) for r in records if _finite(r.get("loss"))]
    evals = [(r["step"], r["eval_loss"]) for r in records if _finite(r.get("eval_loss"))]
    return {"step": [s for s, _ in train], "loss": [round(v, 5) for _, v in train],
            "eval_step": [s for s, _ in evals], "eval_loss": [round(v, 5) for _, v in evals]}


def total_tokens(run_dir: Path) -> int:
    """Input tokens the run trained on (every logged step's ``tokens``; a resumed run's log is continuous)."""
    return sum(int(r.get("tokens") or 0) for r in read_metrics(Path(run_dir) / METRICS_FILE))


def loss_drop(curve: dict[str, list], window: int = 5) -> tuple[float | None, float | None]:
    """Mean training loss over the first and the last ``window`` steps (noise-robust start and end points)."""
    losses = curve["loss"]
    if not losses:
        return None, None
    k = max(1, min(window, len(losses) // 3 or 1))
    return sum(losses[:k]) / k, sum(losses[-k:]) / k


def measured_step_seconds(run_dir: Path) -> float | None:
    """Seconds per step of a finished run, measured over its logged steps after the first (which warms up).

    The Trainer logs each step's ``tokens`` and the ``tokens_per_s`` since logging began, so the elapsed time at
    step i is the running token count over that rate. None with fewer than three steps. (A resumed run restarts
    that clock: use it for runs that went through in one go.)
    """
    records = read_metrics(Path(run_dir) / METRICS_FILE)
    elapsed, tokens = [], 0
    for r in records:
        tokens += r.get("tokens") or 0
        if not r.get("tokens_per_s"):
            return None
        elapsed.append(tokens / r["tokens_per_s"])
    if len(elapsed) < 3:
        return None
    return (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1)


def drop_checkpoints(run_dir: Path) -> None:
    """Delete a finished run's checkpoints (weights + optimizer state): only resuming needed them."""
    shutil.rmtree(Path(run_dir) / "checkpoints", ignore_errors=True)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
