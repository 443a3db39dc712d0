"""The time budget: how ``--minutes`` is shared among the stages, and how a share becomes a step count.

Each stage has a weight (:data:`WEIGHTS`, summing to 1). A stage does not get a fixed slice of the total:
when it starts it gets the time still left, split in proportion to its weight among the stages still to
run. A stage that finishes early therefore leaves its time to the later ones, and one that overruns takes
it from them, so the run as a whole ends close to the budget even when single estimates are off (a shared
machine slows down and speeds up under us).

A training stage turns its share into steps with a measured throughput (:mod:`lmforge.quickstart.probe`):
``steps = (share - fixed costs) / seconds per step``, so its cosine schedule ends when its share does.

Example:
    >>> budget = Budget(60.0, {"a": 0.5, "b": 0.25, "c": 0.25}, clock=lambda: 0.0)
    >>> budget.allot("a", ["a", "b", "c"])
    30.0
    >>> budget.spent_before = 40.0          # "a" overran by 10 s: "b" and "c" share what is left
    >>> budget.allot("b", ["b", "c"])
    10.0
    >>> steps_for(10.0, seconds_per_step=0.25, fixed=2.0, minimum=4)
    32
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

# Shares of the budget, in stage order. Pre-training gets 41%: it is what the later stages build on, and
# bert-tiny's share is the largest because the fine-tuning comparison, LoRA and the probes read its weights
# (and a masked LM needs a few hundred steps to get past predicting the most frequent tokens). The two runs
# that compare a pre-trained bert-tiny with a random one get the next largest, about an epoch of the reviews
# each: in half an epoch neither body had fit them (docs/lab/notes-quickstart-pretraining.md, sections 11-12).
# Their shares came from the GPT and T5 stages, translation, LoRA, MiniLM, retrieval and the probes.
WEIGHTS: dict[str, float] = {
    "tokenizers": 0.01,
    "data": 0.015,
    "pretrain-gpt": 0.10,
    "pretrain-bert": 0.24,
    "pretrain-t5": 0.07,
    "finetune-bert": 0.15,
    "finetune-bert-scratch": 0.15,
    "finetune-bert-lora": 0.04,
    "finetune-minilm": 0.05,
    "prompting": 0.04,
    "generation": 0.01,
    "translation": 0.06,
    "retrieval": 0.02,
    "probing": 0.035,
    "report": 0.01,
}

# The budget every size below was chosen for; smaller budgets scale data sizes down from it.
REFERENCE_MINUTES = 10.0


@dataclass
class Budget:
    """Seconds left for the stages still to run, and each one's share of them.

    Args:
        total: the whole budget in seconds (``--minutes * 60``).
        weights: stage -> share (see :data:`WEIGHTS`).
        spent_before: seconds spent by earlier invocations on stages that finished (a resumed run).
        clock: seconds since this invocation started (default: counted from the Budget's creation; the
            interpreter's start-up before it, a few seconds, is not counted).
    """

    total: float
    weights: dict[str, float] = field(default_factory=lambda: dict(WEIGHTS))
    spent_before: float = 0.0
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if self.clock is None:
            origin = time.monotonic()
            self.clock = lambda: time.monotonic() - origin

    @property
    def spent(self) -> float:
        """Seconds used so far: earlier invocations' finished stages plus this whole invocation."""
        return self.spent_before + self.clock()

    @property
    def left(self) -> float:
        return max(0.0, self.total - self.spent)

    def allot(self, stage: str, remaining: Sequence[str]) -> float:
        """Seconds for ``stage``: what is left, times its weight over the weights of ``remaining`` (which
        includes ``stage``)."""
        weight = self.weights.get(stage, 0.0)
        pool = sum(self.weights.get(s, 0.0) for s in remaining) or 1.0
        return self.left * weight / pool


def steps_for(seconds: float, seconds_per_step: float, fixed: float = 0.0, minimum: int = 1,
              maximum: int | None = None) -> int:
    """Optimizer steps that fit in ``seconds`` after ``fixed`` seconds of other work (evaluation, saving).

    Never fewer than ``minimum``: a tiny budget still gets a complete (if short) run.
    """
    if seconds_per_step <= 0 or not math.isfinite(seconds_per_step):
        raise ValueError(f"seconds_per_step={seconds_per_step} must be a positive number")
    steps = int((seconds - fixed) / seconds_per_step)
    if maximum is not None:
        steps = min(steps, maximum)
    return max(minimum, steps)


def count_for(seconds: float, seconds_per_item: float, full: int, floor: int = 1) -> int:
    """How many items (texts to embed, examples to score) fit in ``seconds``, between ``floor`` and ``full``.

    Example:
        >>> count_for(10.0, 0.01, full=5000, floor=100), count_for(10.0, 0.5, full=5000, floor=100)
        (1000, 100)
    """
    if seconds_per_item <= 0:
        return full
    return max(floor, min(full, int(seconds / seconds_per_item)))


def scaled(full: int, minutes: float, floor: int = 1) -> int:
    """``full`` scaled by ``minutes`` against :data:`REFERENCE_MINUTES` (never above ``full`` nor below ``floor``).

    Example:
        >>> scaled(1000, 10), scaled(1000, 1, floor=200), scaled(1000, 60)
        (1000, 200, 1000)
    """
    return max(floor, min(full, int(full * minutes / REFERENCE_MINUTES)))
