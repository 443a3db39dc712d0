"""What every quickstart stage is handed: the run folder, the device, the budget, and earlier stages' results.

A stage is a function ``run(ctx, seconds) -> record``: it does its work in about ``seconds``, writes its
outputs under ``ctx.folder``, and returns a JSON-able record (numbers, curves, texts, and a one-line
``summary`` for the final table). The runner stores the record as ``OUT/stages/<name>.json`` once the function
returns, which is what marks the stage finished.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.quickstart.budget import Budget, scaled
from lmforge.quickstart.folder import RunFolder
from lmforge.training.precision import autocast, resolve_precision

SEED = 0
SEQ_LEN = 128  # the presets allow 256 (t5: 512); 128 halves attention cost and fits every demo text
PROBE_SHARE = 0.003  # of the whole budget, per throughput probe (clamped to 0.5-2 s)


class StageInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) reached a training stage: the Trainer saved a checkpoint and stopped."""


@dataclass
class Context:
    """The run as the stages see it.

    Attributes:
        folder: the run folder.
        minutes: the whole budget, in minutes (data sizes scale with it).
        device: ``"cpu"`` or ``"cuda"`` (resolved).
        budget: the time budget (see :mod:`lmforge.quickstart.budget`).
        progress: show progress bars.
        results: finished stages' records, by name (kept up to date by the runner).
    """

    folder: RunFolder
    minutes: float
    device: str
    budget: Budget
    progress: bool = True
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def probe_seconds(self) -> float:
        """How long a throughput probe times steps: longer for longer budgets, where a better estimate of
        many steps pays for itself (about 2 s at 10 minutes, 0.5 s at one)."""
        return min(2.0, max(0.5, self.budget.total * PROBE_SHARE))

    def scaled(self, full: int, floor: int = 1) -> int:
        """A data size for this budget: ``full`` at 10 minutes, proportionally less below (at least ``floor``)."""
        return scaled(full, self.minutes, floor)

    def result(self, stage: str) -> dict[str, Any]:
        """The record of an earlier stage this one builds on."""
        if stage not in self.results:
            raise RuntimeError(f"stage {stage!r} has not finished; it must run before this one")
        return self.results[stage]

    def path(self, *parts: str) -> Path:
        return self.folder.path(*parts)

    def relative(self, path: Path) -> str:
        """``path`` relative to the run folder, as records store it (the folder may move)."""
        return str(Path(path).relative_to(self.folder.root))

    def log(self, message: str) -> None:
        print(f"    {message}", file=sys.stderr, flush=True)

    def inference(self):
        """The autocast context for frozen-model passes (embedding, probing): bf16 where the hardware has
        it, as in training; fp32 elsewhere."""
        import torch

        device = torch.device(self.device)
        return autocast(device, resolve_precision("auto", device))

    def train_settings(self, **settings: Any) -> dict[str, Any]:
        """TrainConfig settings every quickstart run shares, updated with ``settings``."""
        base = {"device": self.device, "progress": self.progress, "tensorboard": False, "seed": SEED,
                "save_every": 0, "keep_checkpoints": 1, "precision": "auto"}
        return {**base, **settings}


def check_stopped(result) -> None:
    """Raise :class:`StageInterrupted` when a Trainer run stopped for a signal rather than finishing."""
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        raise StageInterrupted(f"stopped by {result.stopped_by} at step {result.step}")
