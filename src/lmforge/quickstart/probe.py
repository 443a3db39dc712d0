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
    >>> now, durations = [0.0], iter([1.0, 3.0, 1.0, 3.0])  # a short batch and a long one, twice
    >>> time_steps(step, warmup=0, seconds=0.0, group=2, clock=lambda: now[0])  # a pass's mean, not 1.0
    Probe(seconds_per_step=2.0, steps=4)
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
# Batches of training rows a fine-tuning probe encodes: length bands enough to time an average step (see
# probe_finetuning: it warms up over all of them once).
PROBE_BATCHES = 8


@dataclass(frozen=True)
class Probe:
    """What a probe measured: seconds per optimizer step (the median of the timed steps), and how many steps
    it ran (warm-up included), so that the rest of its time can be told apart as set-up (building the model,
    encoding data)."""

    seconds_per_step: float
    steps: int


def time_steps(step: Callable[[], Any], warmup: int = WARMUP, seconds: float = 1.0, device: str = "cpu", *,
               group: int = 1, clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Median seconds of a call of ``step``: after ``warmup`` untimed calls, timed calls until ``seconds`` have
    passed (between :data:`MIN_REPEATS` and :data:`MAX_REPEATS` calls).

    A time window rather than a fixed count, so that short steps are measured over enough of them. The median
    rather than the mean: on a shared machine one step in a few seconds can be stalled by a neighbour, and a
    mean would plan the whole run at that stall's pace. With ``group`` > 1 the calls are timed ``group`` at a
    time and the median is over the groups' means (at least one group; whole groups only): for fine-tuning's
    length-bucketed batches a group is one pass over the probe's batches, short and long ones, whose step
    times differ 2-3x, so that a median of single steps would be the median length's, below the mean a run
    pays. ``clock`` is for tests.
    """
    for _ in range(warmup):
        step()
    times: list[float] = []  # seconds per call, one entry per group
    least = -(-MIN_REPEATS // group)
    while len(times) < least or (sum(times) * group < seconds and (len(times) + 1) * group <= MAX_REPEATS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        for _ in range(group):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((clock() - start) / group)
    return Probe(statistics.median(times), warmup + len(times) * group)


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
    """Seconds per step of fine-tuning ``body`` (left untouched: a copy is trained) on the first
    :data:`PROBE_BATCHES` batches of ``table``'s rows as ``spec`` says, with ``config``'s batch size and
    precision (and a PEFT adapter when ``peft`` is given)."""
    recipe = recipe or Recipe()
    table = table.head(config.batch_size * PROBE_BATCHES)  # encode only what the probe's steps read
    if spec.task == "classify" and not spec.labels:
        spec = spec.replace(labels=build_task(spec, tokenizer, body.config).label_set(table))
    task = build_task(spec, tokenizer, body.config)
    # Batched as the real run batches them (length buckets).
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
        # Length-bucketed batches each have their own padded length, so each step of a short probe met new
        # shapes (new oneDNN kernels), which a long run meets only in its first few dozen steps: the quickstart's
        # fine-tuning was planned at 1.2-1.5x its real step time. So the warm-up is one pass over the probe's
        # batches, and the timing is over whole later passes, which meet the same lengths again.
        per_pass = len(batches)
        return time_steps(trainer.train_step, warmup=per_pass, seconds=seconds, device=trainer.device.type,
                          group=per_pass)
    finally:
        _remove(scratch)
