"""Throughput probes: seconds per optimizer step of a run, measured on the run's own code, model and data.

A probe builds the same trainer the stage is about to build (into a scratch folder, weights thrown away
afterwards), runs a few steps to warm up (allocations, kernel selection) and times the next ones. Measuring
beats estimating from FLOPs here: a shared 2-core machine delivers a different fraction of its peak from
minute to minute, and the budget split (:mod:`lmforge.quickstart.budget`) takes care of what changes later.

Example:
    >>> import time
    >>> probe = time_steps(lambda: time.sleep(0.01), warmup=1, seconds=0.05)
    >>> 0.005 < probe.seconds_per_step < 0.5, probe.steps >= 1 + MIN_REPEATS
    (True, True)
    >>> now, durations = [0.0], iter([4.0, 0.25, 0.5])  # a step stalled by a neighbour, then two normal ones
    >>> def step(): now[0] += next(durations)
    >>> time_steps(step, warmup=0, seconds=0.0, clock=lambda: now[0]).seconds_per_step
    0.5
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from lmforge.tasks.data import ExampleBatches
from lmforge.tasks.model import build_task_model
from lmforge.tasks.recipe import Recipe
from lmforge.tasks.peft import apply_task_peft
from lmforge.tasks.registry import build_task
from lmforge.tasks.trainer import FinetuneTrainer
from lmforge.training.pretrain import build_pretraining

# The first steps of a run are slower than the rest: oneDNN builds a kernel for each new shape, the allocator
# grows its pools. One untimed step left the second and third in the timing, and the quickstart's masked LM
# was planned at 1.5x its real step time (a third of its share unused); three cover most of it.
WARMUP = 3
MIN_REPEATS, MAX_REPEATS = 3, 16


@dataclass(frozen=True)
class Probe:
    """What a probe measured: seconds per optimizer step (the median of the timed steps), and how many steps
    it ran (warm-up included), so that the rest of its time can be told apart as set-up (building the model,
    encoding data)."""

    seconds_per_step: float
    steps: int


def time_steps(step: Callable[[], Any], warmup: int = WARMUP, seconds: float = 1.0, device: str = "cpu", *,
               clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Median seconds of a call of ``step``: after ``warmup`` untimed calls, timed calls until ``seconds`` have
    passed (between :data:`MIN_REPEATS` and :data:`MAX_REPEATS` calls).

    A time window rather than a fixed count: short steps are measured over enough of them to cover, for
    fine-tuning, the different lengths of length-bucketed batches. The median rather than the mean: on a
    shared machine one step in a few seconds can be stalled by a neighbour, and a mean would plan the whole
    run at that stall's pace. ``clock`` is for tests.
    """
    for _ in range(warmup):
        step()
    times: list[float] = []
    while len(times) < MIN_REPEATS or (sum(times) < seconds and len(times) < MAX_REPEATS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(clock() - start)
    return Probe(statistics.median(times), warmup + len(times))


def _remove(scratch: Path) -> None:
    """Delete a probe's scratch folder, and its parent once no other probe's is left in it."""
    shutil.rmtree(scratch, ignore_errors=True)
    with contextlib.suppress(OSError):
        scratch.parent.rmdir()


def probe_pretraining(config, scratch: Path, seconds: float = 1.0) -> Probe:
    """Seconds per step of the pre-training run ``config`` describes (a TrainConfig), timed for about
    ``seconds`` in the scratch folder ``scratch``."""
    probe = config.updated({"out": str(scratch), "eval_every": 0, "save_every": 0, "progress": False,
                            "tensorboard": False, "resume": False})
    try:
        trainer = build_pretraining(probe).trainer
        return time_steps(trainer.train_step, seconds=seconds, device=trainer.device.type)
    finally:
        _remove(scratch)


def probe_finetuning(body: torch.nn.Module, tokenizer, spec, table, config, scratch: Path, *,
                          recipe=None, peft=None, seconds: float = 1.0) -> Probe:
    """Seconds per step of fine-tuning ``body`` (left untouched: a copy is trained) on ``table`` as ``spec``
    says, with ``config``'s batch size and precision (and a PEFT adapter when ``peft`` is given)."""
    recipe = recipe or Recipe()
    if spec.task == "classify" and not spec.labels:
        spec = spec.replace(labels=build_task(spec, tokenizer, body.config).label_set(table))
    task = build_task(spec, tokenizer, body.config)
    # Enough examples for the probe's steps, batched as the real run batches them (length buckets).
    examples = task.encode(table, True)
    batches = ExampleBatches(examples, config.batch_size, seed=config.seed, bucket=recipe.bucket)
    model = build_task_model(copy.deepcopy(body), spec)  # build_task_model strips the LM head in place
    peft_base = None
    if peft is not None:
        apply_task_peft(model, peft, tokenizer=tokenizer)
        peft_base = scratch
    probe = config.updated({"out": str(scratch), "eval_every": 0, "save_every": 0, "progress": False,
                            "tensorboard": False, "resume": False, "max_steps": max(config.max_steps, 10),
                            "warmup": 0})
    try:
        kwargs = {"peft_base": peft_base} if peft_base is not None else {}
        trainer = FinetuneTrainer(model, task, batches, probe, recipe, out=scratch, **kwargs)
        return time_steps(trainer.train_step, seconds=seconds, device=trainer.device.type)
    finally:
        _remove(scratch)
