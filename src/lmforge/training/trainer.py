"""The training loop: objective-agnostic, token-normalised, resumable to the bit.

One optimizer step::

    raw_k   = next(train_data)                  k = 1..grad_accum  (token ids: (B, T+1) blocks or documents)
    batch_k = objective(raw_k)                  the objective makes inputs and aligned labels (-100 = no loss)
    N       = sum_k count(labels_k != -100)     counted first, over the whole accumulated batch
    for k:  out = model(**batch_k)              out.loss = mean CE over batch_k's n_k targets
            backward(out.loss * n_k / N)        so the gradient is that of the mean over all N targets
    clip the global grad norm; lr = peak * schedule(step); AdamW step

Weighting each micro-batch by its share of the targets (rather than averaging the micro-batch means) makes
``grad_accum=k, batch_size=b`` produce the same update as ``grad_accum=1, batch_size=k*b``, even when the
micro-batches hold different numbers of targets (MLM masks ~15% of each, padding varies).

A loss that sums means over different targets (BERT's MLM + NSP: a mean over masked tokens plus a mean over
sentence pairs; ELECTRA's MLM + lambda * RTD: masked tokens, real tokens) lists them in ``out.loss_terms``
(:class:`lmforge.models.transformer.LossTerm`), each with the batch key that marks its targets. Each term is
weighed by its own share: ``backward(sum_t w_t * loss_t,k * n_t,k / N_t)``, with ``N_t`` the count over the
accumulated batch of the entries of ``batch[key]`` that are not -100 (labels) or, for a term with
``mask=True``, that are nonzero (``attention_mask``: the real tokens, for labels the model makes itself). So
every mean stays a mean over all the step's targets, as with one big batch. The logged loss is the weighted
sum of the terms' means; evaluation reports the term of ``labels`` as ``eval_loss``, ``eval_ppl`` and
``eval_accuracy``, and every other term, unweighted, as ``eval_<name>_loss`` and ``eval_<name>_accuracy``
(``eval_nsp_accuracy``, ``eval_rtd_accuracy``).

The trainer never learns which objective it runs: the objective turns raw batches into model inputs, and
the model computes the loss. A training signal the model does not compute itself (sentence embeddings: one
encoder over every side of a pair, then a contrastive loss) is a ``loss``: ``loss(model, batch)`` returns the
output, and the Trainer runs it in place of ``model(**batch)``, with everything else unchanged; the output's
optional ``metrics`` (name -> number: a preference loss's reward margin, a policy loss's KL) are averaged over
the step's targets and ranks and logged with the step. Evaluation
reports loss, perplexity and the accuracy of the argmax prediction at the labelled positions (masked-token
accuracy for MLM, next-token accuracy for causal LM). A model with a ``training_metrics()`` method adds what it
returns (a dict of scalars and lists) to each step's record: a mixture-of-experts model reports its router
losses, expert load histogram and dropped-token share there (rank 0's view under DDP/FSDP).

Exact resume. A checkpoint (see :mod:`lmforge.training.state`) holds the model, optimizer, step, the RNG
states of Python, numpy and torch, the objective's generator and the data's position. Restoring them all
makes the resumed run draw the same batches, the same masks and the same dropout as the uninterrupted one,
so its losses and weights match bit for bit (fp32, same device and thread count). Creating a DataLoader
iterator draws from torch's global generator, so data loading runs inside ``fork_rng``: it cannot shift the
dropout stream depending on when an iterator happens to be created.

What a finished run keeps (``final_checkpoint``). ``full``: the last checkpoint with the optimizer state, so
``resume`` with a larger ``max_steps`` continues exactly as an unbroken run would. ``weights``: the last
checkpoint without the optimizer state (on a CPU fine-tune the AdamW moments are two thirds of it); resuming
from it restarts the optimizer, with a warning. ``none``: no checkpoint is written at the end and the earlier
ones are removed, leaving the model folder. A run stopped before ``max_steps`` always keeps a full checkpoint.

Signals. SIGINT and SIGTERM finish the current step, save a checkpoint and return; a second SIGINT aborts
at once.

Many ranks (``strategy`` ddp or fsdp, under torchrun; see :mod:`lmforge.training.distributed`). Each rank
draws its own slice of the data (the loaders read rank and world size from the process group). ``N`` above
becomes the target count of the global batch, all-reduced before any backward, and each rank back-propagates
``out.loss * n_k * W / N``: DDP and FSDP average the W ranks' gradients, which leaves the gradient of the mean
over every target of every rank. DDP skips its all-reduce on all but the last micro-step (``no_sync``).
Logged loss, token counts and evaluation sums are reduced over the ranks, and only rank 0 logs and writes
files. A signal on any rank stops every rank after the same step. FSDP checkpoints are sharded
(:mod:`lmforge.training.dist_checkpoint`); checkpoints of either layout resume on any number of ranks.

Example:
    >>> import tempfile, torch, lmforge
    >>> from lmforge.objectives import build_objective
    >>> from lmforge.training import TrainConfig, Trainer
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    >>> data = [torch.randint(0, 50, (4, 17)) for _ in range(3)]  # three batches of 4 blocks of 16+1 tokens
    >>> cfg = TrainConfig(max_steps=3, lr=1e-3, eval_every=0, progress=False, tensorboard=False, precision="fp32")
    >>> result = Trainer(model, build_objective("clm", pad_token_id=0), data, cfg, out=tempfile.mkdtemp()).fit()
    >>> result.step, result.stopped_by
    (3, 'max_steps')
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import shutil
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

import lmforge
from lmforge import checkpoint as model_checkpoint
from lmforge.config import ConfigError
from lmforge.errors import LmforgeError, RunLocked, UserInputError
from lmforge.models.transformer import LossTerm
from lmforge.objectives.base import IGNORE_INDEX
from lmforge.training import dist_checkpoint, distributed
from lmforge.training.activation_checkpointing import enable_activation_checkpointing
from lmforge.training.allocator import keep_freed_memory
from lmforge.training.config import TrainConfig
from lmforge.training.distributed import DistContext
from lmforge.training.logging import METRICS_FILE, RunLogger, summary_line
from lmforge.training.optim import build_optimizer
from lmforge.training.precision import autocast, resolve_precision
from lmforge.training.price_tag import PRICE_TAG_FILE, PriceSettings, PriceTag, counted_flops, open_meter
from lmforge.training.schedules import Schedule
from lmforge.training.state import (
    STATE_FILE,
    CheckpointManager,
    CorruptCheckpoint,
    capture_rng,
    restore_rng,
    seed_all,
    to_json,
)
from lmforge.utils.io import atomic_write_text, make_folder
from lmforge.utils.lock import RunFolderLock, refuse_if_held

MODEL_DIR = "model"
SIGNAL_ECHO_S = 1.0  # with several ranks, a repeated SIGINT this soon after the first is torchrun passing it on


class RunExistsError(LmforgeError, ValueError):
    """The run folder already holds checkpoints, and resuming was not asked for."""


def check_fresh_run(out: str | Path, resume: bool = False) -> None:
    """Raise RunExistsError if ``out`` holds checkpoints and ``resume`` is false (a fresh run would clobber
    them); every command that starts a run in a folder asks this one question. A run another process is
    writing right now is refused as :class:`~lmforge.errors.RunLocked`, naming that process."""
    steps = CheckpointManager(Path(out) / "checkpoints").steps()
    if steps and not resume:
        refuse_if_held(out)  # a run another process is writing right now: name its holder instead
        steps = CheckpointManager(Path(out) / "checkpoints").steps() or steps  # it may have just finished
        raise RunExistsError(f"{out} already holds a run (checkpoints up to step {steps[-1]}): resume it with "
                             "--resume or choose another output folder")


class TrainingDiverged(LmforgeError):
    """The loss or the gradient norm stayed non-finite for ``max_nonfinite_steps`` optimizer steps in a row."""


def run_started(out: str | Path) -> bool:
    """Whether ``out`` holds a run that took a step (a checkpoint or a logged step): a command that fails keeps
    such a folder, and removes one it created that holds only its settings
    (``lmforge.utils.lock.removed_on_failure``)."""
    metrics = Path(out) / METRICS_FILE
    logged = metrics.is_file() and metrics.stat().st_size > 0
    return logged or bool(CheckpointManager(Path(out) / "checkpoints").steps())


@dataclass
class LossOutput:
    """What a Trainer ``loss`` returns: the mean ``loss`` over the batch's ``n_targets`` targets."""

    loss: torch.Tensor
    n_targets: int | None = None
    metrics: dict[str, float] | None = None  # logged with the step: averaged over the step's targets


class _WithLoss(nn.Module):
    """The model and a Trainer ``loss`` as one module: DDP must see the loss's forward passes as its own."""

    def __init__(self, model: nn.Module, loss) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, **batch):
        return self.loss(self.model, batch)


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` did.

    Attributes:
        step: optimizer steps done in total (including those before a resume).
        stopped_by: ``"max_steps"``, ``"steps"`` (the ``steps`` budget of this call), ``"SIGINT"`` or ``"SIGTERM"``.
        checkpoint: the checkpoint folder written last (None if nothing was saved).
        model_dir: the final model folder (``OUT/model``), written once ``max_steps`` is reached.
        metrics: the last step's record (loss, lr, grad_norm, eval_* ...).
        loop_s: seconds of this call's training loop (steps, evaluations, logs, checkpoints).
        tokens: input tokens of this call's steps (tokens / loop_s is the job's throughput).
        sizes: bytes of the last checkpoint's ``weights`` and ``optimizer`` state (what ``final_checkpoint``
            weights / none save).
        kept: what the finished run kept (``full``, ``weights``, ``none``); None when it stopped early.
    """

    step: int
    stopped_by: str
    checkpoint: Path | None = None
    model_dir: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    loop_s: float = 0.0
    tokens: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    kept: str | None = None

    def summary(self) -> str:
        """One line: loop time, total time, tokens/s and what the final checkpoint holds (and could save)."""
        return summary_line(self.loop_s, self.tokens, self.sizes if self.kept else None, self.kept or "full")


def _check_slice(data, ctx: DistContext, name: str) -> None:
    """Refuse data built for another rank layout: every rank would silently train on the same batches."""
    state = _state_of(data)
    if isinstance(state, dict) and "rank" in state and "world_size" in state:
        if (state["rank"], state["world_size"]) != (ctx.rank, ctx.world_size):
            raise ValueError(f"{name} serves rank {state['rank']} of {state['world_size']}, but this process is rank "
                             f"{ctx.rank} of {ctx.world_size}: build the datasets after distributed.setup() (they "
                             "read the rank from the process group), or pass rank= and world_size=")


class Trainer:
    """Pre-train ``model`` on ``objective(batch)`` for each raw batch of ``train_data``.

    Args:
        model: an lmforge Transformer (anything whose ``forward(**batch)`` returns ``loss`` and ``n_targets``).
        objective: a collator ``objective(raw_batch) -> dict of tensors`` with ``labels``; its
            ``state_dict()`` / ``load_state_dict()`` (if any) are checkpointed.
        train_data: an iterable of raw batches, re-iterated at each epoch end; its ``state_dict()`` /
            ``load_state_dict()`` (e.g. :class:`lmforge.data.PackedDataset`) make resume exact.
        config: a :class:`TrainConfig` (optimizer, schedule, precision, eval/save cadence, ...).
        out: run folder (default ``config.out``): ``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``,
            ``loss.png`` and, at the end, ``model/``.
        eval_data: raw batches for evaluation (the first ``config.eval_batches``, the same ones every time).
        eval_objective: collator for evaluation (default: a copy of ``objective`` as it is now); its random
            state is reset before every evaluation, so every evaluation sees the same masks.
        tokenizer: saved into the final model folder so that it is self-contained.
        loss: ``loss(model, batch) -> output with loss and n_targets`` (e.g. :class:`LossOutput`), called in place
            of ``model(**batch)`` for training (default: the model computes its own loss). Its
            ``count_targets(batch)``, if it has one, says how many targets its mean is over (see
            :meth:`count_targets`). :meth:`evaluate` scores the argmax of the output's ``logits`` against
            ``labels``; a loss without them takes no ``eval_data``. Not with FSDP, whose hooks are on
            ``model.forward``.
        model_files: name -> text of further files written into the final model folder (e.g. the pooling
            settings of a sentence encoder).
        on_start: called once (on the main rank) when the run starts, after the resume checks passed and
            the run folder is locked, before the first step: writes the caller's own run files (config,
            settings, tokenizer), so that a refused run leaves the folder as it was.
        dist: this process's place in the job, from :func:`lmforge.training.distributed.setup` (default: set up
            from ``config.strategy`` and ``config.device``). Build the datasets after it: they take their slice
            from the process group.
        lock: the run folder's :class:`~lmforge.utils.lock.RunFolderLock`, held already by a caller that wrote
            files of its own into ``out`` before the Trainer was built; the first ``fit()`` releases it at its end.
        job: the name the progress bar shows (``pretrain``, ``finetune``, ``embedding`` ...).
    """

    def __init__(self, model: torch.nn.Module, objective, train_data: Iterable, config: TrainConfig, *,
                 out: str | Path | None = None, eval_data: Iterable | None = None, eval_objective=None,
                 tokenizer=None, loss=None, model_files: dict[str, str] | None = None,
                 dist: DistContext | None = None, on_start: Callable[[], None] | None = None,
                 lock: RunFolderLock | None = None, job: str = "train") -> None:
        if out is None and config.out is None:
            raise ValueError("the Trainer needs a run folder: pass out=... or set config.out")
        self.config = config.validate()
        self.out = Path(out if out is not None else config.out)
        self.dist = dist if dist is not None else distributed.setup(config.strategy, config.device,
                                                                    config.dist_timeout)
        self.device = self.dist.device
        if self.device.type == "cpu":
            keep_freed_memory()  # a step's large tensors reuse mapped pages (lmforge.training.allocator)
        _check_slice(train_data, self.dist, "train_data")
        _check_slice(eval_data, self.dist, "eval_data")
        self.objective = objective
        self.train_data = train_data
        self.eval_data = eval_data
        self.eval_objective = eval_objective if eval_objective is not None else copy.deepcopy(objective)
        self._eval_objective_state = copy.deepcopy(_state_of(self.eval_objective))
        self._eval_data_state = copy.deepcopy(_state_of(eval_data))
        self.tokenizer = tokenizer
        self.loss = loss
        self.model_files = model_files
        if loss is not None and self.dist.strategy == "fsdp":
            raise ConfigError("a Trainer with a loss runs on one process or with DDP, not with FSDP")
        if config.final_checkpoint == "weights" and self.dist.strategy == "fsdp":
            raise ConfigError("final_checkpoint=weights: FSDP checkpoints are sharded with their optimizer state; "
                              "use full or none")
        self.job = job
        self.autocast_dtype = resolve_precision(config.precision, self.device)
        if config.activation_checkpointing:
            enable_activation_checkpointing(model)
        # self.model keeps the plain parameter names (FSDP: it is now sharded); _wrapped is what a step calls.
        placed, self._wrapped = distributed.wrap_model(model if loss is None else _WithLoss(model, loss), self.dist,
                                                       **self._fsdp_options())
        self.model = placed if loss is None else placed.model
        # Built after wrapping: FSDP replaces the parameters by sharded ones, which the optimizer must hold.
        self.optimizer = build_optimizer(self.model, config.lr, config.weight_decay, config.betas, config.eps,
                                         config.no_decay)
        self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.schedule = Schedule.from_config(config)
        self._forward = torch.compile(self._wrapped) if config.compile else self._wrapped
        self.checkpoints = CheckpointManager(self.out / "checkpoints", keep=config.keep_checkpoints)
        self.step = 0
        self.tokens_seen = 0
        self.skipped_steps = 0
        self._batches = None  # the live iterator over train_data (created lazily, re-created each epoch)
        self._started = False
        self._last_saved: tuple[int, Path] | None = None
        self._signal: int | None = None
        self.on_start = on_start
        # One writer per run folder: held from the start of each fit() to its end (only the main rank writes).
        self._lock = lock if lock is not None else RunFolderLock(self.out) if self.dist.is_main else None
        self._locked = lock is not None
        self._nonfinite = 0  # optimizer steps in a row with a non-finite loss or gradient norm
        self._skipped_seen = 0
        # What the run costs (lmforge.training.price_tag): every rank reads its own device's energy counter, and
        # all agree on whether the run's energy is measured (one collective, here) so that the sums mean one thing.
        meter = open_meter(self.device, self.dist.world_size)
        if self.dist.world_size > 1 and not self.dist.all_reduce([meter is not None], "min")[0]:
            meter = None
        self.price_tag = PriceTag(PriceSettings.resolve(self.device.type, config.region, config.grid_intensity,
                                                        config.power_watts, config.price_per_hour), meter)

    def _fsdp_options(self) -> dict[str, Any]:
        cfg = self.config
        bf16 = cfg.fsdp_param_dtype == "bf16" or (cfg.fsdp_param_dtype == "auto" and
                                                  self.autocast_dtype == torch.bfloat16)
        return {"param_dtype": torch.bfloat16 if bf16 else None,
                "reduce_dtype": torch.bfloat16 if cfg.fsdp_reduce_dtype == "bf16" else torch.float32,
                "cpu_offload": cfg.fsdp_cpu_offload}

    # ------------------------------------------------------------------ one step
    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}

    def _next_raw(self):
        for _ in range(2):  # at most one epoch boundary per call
            if self._batches is None:
                self._batches = iter(self.train_data)
            try:
                with torch.random.fork_rng(devices=[]):
                    return next(self._batches)
            except StopIteration:
                self._batches = None
        raise UserInputError("the training data yielded no batches")

    def accumulate(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        """Forward and backward over collated micro-batches, leaving the gradient of the token-mean loss
        over all of them in ``.grad``.

        Returns:
            ``{"loss": mean CE over every target token (None if there is none), "targets": their count}``.
        """
        world = self.dist.world_size
        counts = [self.count_targets(b) for b in batches]
        total = sum(counts)  # known before any backward: the divisor of every term
        if world > 1:  # the global batch's count: every rank divides by the same N
            total = int(self.dist.all_reduce([total])[0])
        # (key, mask) of each term -> its count over the accumulated batch (further terms: lazily)
        totals = {("labels", False): total}
        self.optimizer.zero_grad(set_to_none=True)
        loss_sums: dict[tuple[str, bool], torch.Tensor] = {}
        extra: dict[str, float] = {}  # metric name -> sum over micro-batches of value * n_targets
        for k, batch in enumerate(batches):
            with distributed.gradient_sync(self._wrapped, sync=k == len(batches) - 1):
                with autocast(self.device, self.autocast_dtype):
                    out = self._forward(**batch)
                if out.loss is None:
                    raise ValueError("the model returned no loss; the objective's batches must carry labels")
                # counts[k] is this batch's count_targets, which a model's n_targets must equal; a compiled
                # model may return its count as a device tensor, which reading here would sync on
                n = out.n_targets if isinstance(out.n_targets, int) else counts[k]
                terms = [((t.labels_key, t.mask), t.loss * t.weight,
                          n if (t.labels_key, t.mask) == ("labels", False) else _count(batch, t.labels_key, t.mask))
                         for t in getattr(out, "loss_terms", None) or ()] or [(("labels", False), out.loss, n)]
                for key, _, _ in terms:
                    if key not in totals:  # every micro-batch is collated already: count the key over all of them
                        count = sum(_count(b, *key) for b in batches)
                        totals[key] = int(self.dist.all_reduce([count])[0]) if world > 1 else count
                # Each term is the mean over this micro-batch's n targets; n / total turns it into its share of
                # the mean over the whole accumulated batch, and the factor `world` undoes the averaging of
                # the ranks' gradients by DDP/FSDP.
                # A term with no target in this micro-batch has a NaN mean (0/0): it adds nothing, but stays in the
                # graph (its gradient is zero) so that every rank's backward reaches the same parameters.
                sum((loss if n else torch.nan_to_num(loss)) * (n * world / max(totals[key], 1))
                    for key, loss, n in terms).backward()
            for key, loss, n in terms:
                if n:
                    loss_sums[key] = loss_sums.get(key, 0.0) + loss.detach().float() * n
            for name, value in (getattr(out, "metrics", None) or {}).items():  # a loss's own numbers, n-weighted
                extra[name] = extra.get(name, 0.0) + float(value) * n
        keys = [key for key in totals if totals[key]]  # global counts: the same keys on every rank
        sums = [float(loss_sums.get(key, 0.0)) for key in keys]
        if world > 1:
            sums = self.dist.all_reduce(sums)
        loss = sum(s / max(totals[key], 1) for key, s in zip(keys, sums))
        names = sorted(extra)
        values = self.dist.all_reduce([extra[n] for n in names]) if world > 1 and names else [extra[n] for n in names]
        metrics = {name: v / max(total, 1) for name, v in zip(names, values)}
        return {"loss": loss if total else None, "targets": total, "rank_targets": counts, "metrics": metrics}

    def count_targets(self, batch: dict[str, Any]) -> int:
        """How many targets the model's mean loss over ``batch`` is over: its labelled tokens (labels != -100).

        It must equal the ``n_targets`` the model returns. A ``loss`` that averages otherwise (per example, say)
        counts with its own ``count_targets(batch)``; a model that does overrides this in a subclass."""
        counter = getattr(self.loss, "count_targets", None)
        if counter is not None:
            return int(counter(batch))
        if "labels" not in batch:
            raise ValueError("the objective produced a batch without 'labels': the trainer needs labelled batches")
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def train_step(self) -> dict[str, Any]:
        """One optimizer step on the next ``grad_accum`` batches; returns the step's metrics record."""
        cfg = self.config
        batches = [self._to_device(self.objective(self._next_raw())) for _ in range(cfg.grad_accum)]
        tokens = sum(int(v.numel()) for b in batches for k, v in b.items() if k.endswith("input_ids"))
        # Data whose shapes change mid-run (lmforge.training.seq_len_schedule) says so in the step's record; a
        # counted FLOP rate (a model without a formula) is then measured again, at the new shapes.
        data_record = self.train_data.step_record() if callable(getattr(self.train_data, "step_record", None)) \
            else {}
        if data_record.get("seq_len_switch") and self.price_tag.flops_method != "analytic":
            self.price_tag.flop_check = None
        stats = self._counted(batches, tokens) if self.price_tag.flop_check is None else self.accumulate(batches)
        flops = self.price_tag.step_flops(self.model if self.loss is None else None, batches,
                                          stats["rank_targets"], tokens, packed=not cfg.compile)
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        lr = cfg.lr * self.schedule(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = distributed.full_value(grad_norm)  # FSDP: a DTensor, the norm over every rank's shards
        loss_finite = stats["loss"] is None or math.isfinite(stats["loss"])
        if math.isfinite(grad_norm) and loss_finite:
            self.optimizer.step()
        else:
            # Skipped, as GradScaler skips an overflowing step: one bad batch must not poison the weights and
            # the Adam moments, and a run that keeps diverging stops (fit) with weights still finite, so the
            # newest checkpoint stays the last good one.
            self.skipped_steps += 1
            what = "gradient norm" if loss_finite else "loss"
            warnings.warn(f"step {self.step + 1}: non-finite {what}; update skipped", stacklevel=2)
        self.optimizer.zero_grad(set_to_none=True)
        wall, joules, device_s, cpu_s = self.price_tag.rank_values()
        if self.dist.world_size > 1:  # one all-reduce for the step's counts, as before: now with the price tag's
            tokens, flops, device_s, joules, cpu_s = self.dist.all_reduce([tokens, flops, device_s, joules, cpu_s])
            tokens = int(tokens)
        self.price_tag.add(tokens, flops, wall, joules, device_s=device_s, cpu_s=cpu_s)
        self.step += 1
        self.tokens_seen += tokens
        model_metrics = getattr(self.model, "training_metrics", None)
        return {"step": self.step, "loss": stats["loss"], "lr": lr,
                "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
                "tokens": tokens, "targets": stats["targets"], **stats["metrics"],
                **(model_metrics() if callable(model_metrics) else {}), **data_record}

    def _counted(self, batches: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
        """:meth:`accumulate` under FlopCounterMode (the once-per-run cross-check of the analytic FLOPs); a
        compiled or FSDP-sharded model is not counted (the counter cannot see inside them)."""
        if self.config.compile or self.dist.strategy == "fsdp":
            self.price_tag.flop_check = {"skipped": "compile" if self.config.compile else "fsdp"}
            return self.accumulate(batches)
        with counted_flops() as counter:
            stats = self.accumulate(batches)
        model = self.model if self.loss is None else None
        analytic = self.price_tag.step_flops(model, batches, stats["rank_targets"], tokens)  # never compiled here
        self.price_tag.check(analytic if self.price_tag.flops_method == "analytic" else None,
                             counter.get_total_flops(), tokens)
        return stats

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and argmax accuracy over the labelled tokens of the first ``eval_batches`` batches,
        and the loss and accuracy of each further loss term (module docstring).

        Returns ``{}`` without evaluation data. The model's train/eval mode is restored afterwards.
        """
        if self.eval_data is None:
            return {}
        _load_state(self.eval_objective, copy.deepcopy(self._eval_objective_state))
        _load_state(self.eval_data, copy.deepcopy(self._eval_data_state))
        was_training = self.model.training
        self.model.eval()
        # metric prefix -> [loss sum, correct, count]: "eval" for the token labels, "eval_<name>" for further
        # terms (NSP, ELECTRA's RTD), whose accuracy is left out when they have no logits.
        sums: dict[str, list[float]] = {}
        unscored: set[str] = set()
        data = iter(self.eval_data)
        try:
            for _ in range(self.config.eval_batches):
                try:
                    with torch.random.fork_rng(devices=[]):
                        raw = next(data)
                except StopIteration:
                    raw = None
                # Every rank must run as many forwards as the others (FSDP all-gathers in each one).
                if self.dist.world_size > 1 and not self.dist.all_reduce([raw is not None], "min")[0]:
                    break
                if raw is None:
                    break
                batch = self._to_device(self.eval_objective(raw))
                with autocast(self.device, self.autocast_dtype):
                    out = self._forward(**batch)
                for term in getattr(out, "loss_terms", None) or [LossTerm("tokens", "labels", out.loss, out.logits)]:
                    main = (term.labels_key, term.mask) == ("labels", False)
                    prefix = "eval" if main else f"eval_{term.name}"
                    labels = term.labels if term.labels is not None else batch[term.labels_key]
                    target = labels[labels != IGNORE_INDEX]  # (n,), in the order of the logits' rows
                    correct = _correct(term.logits, target)
                    if correct is None:
                        unscored.add(prefix)
                    acc = sums.setdefault(prefix, [0.0, 0, 0])
                    acc[0] += float(term.loss) * len(target)
                    acc[1] += correct or 0
                    acc[2] += len(target)
        finally:
            self.model.train(was_training)
        names = list(sums)
        if self.dist.world_size > 1:
            flat = self.dist.all_reduce([v for name in names for v in sums[name]])
            sums = {name: flat[3 * i:3 * i + 3] for i, name in enumerate(names)}
        if not sums.get("eval", [0, 0, 0])[2]:
            return {}
        record = {}
        for prefix in names:
            loss_sum, correct, count = sums[prefix]
            if not count:
                continue
            loss = loss_sum / count
            record[f"{prefix}_loss"] = loss
            if prefix == "eval":
                record["eval_ppl"] = math.exp(loss) if loss < 700 else None
            if prefix not in unscored:
                record[f"{prefix}_accuracy"] = correct / count
        return record

    # ------------------------------------------------------------------ checkpoints
    def rank_state(self) -> dict[str, Any]:
        """What differs between ranks, in JSON form: RNG states, the objective's and the loader's positions."""
        return {"rng": to_json(capture_rng()), "objective": to_json(_state_of(self.objective)),
                "data": to_json(_state_of(self.train_data))}

    def state_dict(self) -> dict[str, Any]:
        """Everything but weights and optimizer tensors that resuming needs, in JSON form (this rank's view)."""
        return {
            "step": self.step, "tokens": self.tokens_seen, "skipped_steps": self.skipped_steps,
            "price_tag": self.price_tag.state_dict(),
            **self.rank_state(),
            "schedule": self.schedule.state_dict(), "config": self.config.to_dict(),
            "strategy": self.dist.strategy, "world_size": self.dist.world_size,
            "lmforge_version": lmforge.__version__, "saved_at": time.time(),
        }

    def checkpoint_module(self):
        """What a checkpoint's weights are (``config``, ``state_dict``, ``load_state_dict``): the model. A subclass
        may narrow it, e.g. to the trainable tensors of a PEFT run (lmforge.tasks.peft.TrainableState)."""
        return self.model

    def save_checkpoint(self, weights_only: bool = False) -> Path:
        """Write ``OUT/checkpoints/step-NNNNNNNN`` (atomically), update ``latest``, rotate old ones;
        ``weights_only`` leaves the optimizer state out (a finished run's ``final_checkpoint: weights``).

        With several ranks every rank must call it: rank 0 stores every rank's :meth:`rank_state`, and FSDP
        writes one DCP shard per rank.
        """
        if not hasattr(self.train_data, "state_dict"):
            warnings.warn("train_data has no state_dict(): a resumed run will restart the data from its "
                          "beginning", stacklevel=2)
        state = self.state_dict()
        if self.dist.world_size > 1:
            state["ranks"] = self.dist.gather_json(self.rank_state())
        if self.dist.strategy == "fsdp":
            folder = dist_checkpoint.save_sharded(self.checkpoints, self.step, self.model, self.optimizer, state,
                                                  self.dist)
        else:
            if self.dist.is_main:  # DDP replicas are identical: rank 0's model and optimizer stand for all
                self.checkpoints.save(self.step, self.checkpoint_module(), None if weights_only else self.optimizer,
                                      state)
            self.dist.barrier()
            folder = self.checkpoints.path(self.step)
        self._last_saved = (self.step, folder)
        return folder

    def resume(self) -> bool:
        """Load the newest intact checkpoint of ``OUT`` (falling back, with a warning, past corrupt ones).

        Returns False (with a warning) when the run folder has no checkpoint yet: the run starts at step 0.
        """
        found = self._find_checkpoint()
        if found is None:
            warnings.warn(f"{self.checkpoints.root}: no checkpoint to resume from; starting at step 0", stacklevel=2)
            return False
        folder, raw = found
        state = dist_checkpoint.load_training_checkpoint(folder, self.checkpoint_module(), self.optimizer, raw,
                                                         self.dist)
        self.step, self.tokens_seen = state["step"], state["tokens"]
        self.skipped_steps = self._skipped_seen = state.get("skipped_steps", 0)
        self.price_tag.load_state_dict(state.get("price_tag"))
        self._restore_rank_state(state)
        self._batches = None  # the next batch comes from the restored position
        self._last_saved = (self.step, folder)
        return True

    def _find_checkpoint(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest intact checkpoint: rank 0 checks the checksums (warning past damaged ones) and tells
        the other ranks which one, so that all load the same step."""
        if self.dist.world_size == 1:
            return self.checkpoints.latest_valid()
        found, choice = None, None
        if self.dist.is_main:
            try:
                found = self.checkpoints.latest_valid()
                choice = {"name": found[0].name if found else None}
            except CorruptCheckpoint as exc:
                choice = {"error": str(exc)}
        choice = self.dist.broadcast_json(choice)
        if "error" in choice:
            raise CorruptCheckpoint(choice["error"])
        if choice["name"] is None:
            return None
        folder = self.checkpoints.root / choice["name"]
        return folder, found[1] if found else json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))

    def _restore_rank_state(self, state: dict[str, Any]) -> None:
        """This rank's RNG, objective and loader state; mapped over when the number of ranks changed."""
        ranks = state.get("ranks") or [{k: state[k] for k in ("rng", "objective", "data")}]
        rank, world = self.dist.rank, self.dist.world_size
        mine = ranks[rank % len(ranks)]
        _load_state(self.objective, mine["objective"])
        if len(ranks) == world:
            _load_state(self.train_data, mine["data"])
            restore_rng(mine["rng"])
            return
        data, repeated = dist_checkpoint.reshard_data_state([r["data"] for r in ranks], _state_of(self.train_data))
        _load_state(self.train_data, data)
        seed_all(distributed.rank_seed(self.config.seed + self.step, rank))  # no saved stream fits: fresh ones
        if self.dist.is_main:
            where = ("the data restarts from its beginning" if data is None else
                     f"the data continues at the same global sample ({repeated} samples are seen twice)" if repeated
                     else "the data continues at the same global sample")
            warnings.warn(f"resuming a checkpoint of {len(ranks)} rank(s) on {world}: weights and optimizer state "
                          f"are resharded exactly, {where}, and the random streams are new", stacklevel=3)

    def save_model(self) -> Path:
        """Write the final model folder ``OUT/model`` (config, weights, tokenizer), loadable by lmforge.load.

        FSDP gathers the whole model to rank 0 first; only rank 0 writes. Collective with several ranks.
        """
        path = self.out / MODEL_DIR
        model = dist_checkpoint.unsharded_copy(self.model, self.dist) if self.dist.strategy == "fsdp" else self.model
        # A training-only wrapper (ELECTRA's generator + discriminator) names the model it trains: that is saved.
        model = getattr(model, "saved_model", model)
        if self.dist.is_main:
            price = {PRICE_TAG_FILE: json.dumps(self.price_tag.summary(), indent=1) + "\n"}
            model_checkpoint.save(model, path, tokenizer=self.tokenizer, extra_files={**(self.model_files or {}),
                                                                                      **price})
        self.dist.barrier()
        return path

    # ------------------------------------------------------------------ the loop
    def check_fresh(self) -> None:
        """Raise RunExistsError if ``OUT`` already holds checkpoints (a fresh run would clobber them)."""
        check_fresh_run(self.out)

    def _check_start(self) -> None:
        """Resume from ``OUT`` or check that it holds no run: only reads, so a refusal leaves ``OUT`` untouched."""
        if self.config.resume:
            if self.resume():
                return
        else:
            self.check_fresh()
        # A fresh run: the same seed gives the same dropout masks and the same data order every time
        # (and each rank its own masks; rank 0 those of a single-process run).
        seed_all(distributed.rank_seed(self.config.seed, self.dist.rank))

    def _checkpoint_listing(self) -> tuple[list[int], str | None]:
        latest = self.checkpoints.root / "latest"
        return self.checkpoints.steps(), latest.read_text(encoding="utf-8") if latest.is_file() else None

    def _begin(self) -> None:
        # Check, lock, re-check, write: the checks come first so that a refused run writes nothing (not
        # even the lock file); the lock then makes this the only writer, and if another writer changed the
        # checkpoints between the check and the lock, the check is made again.
        seen = self._checkpoint_listing()
        try:
            self._check_start()
        except LmforgeError:
            if self.dist.is_main:  # a folder another run is writing: name its holder, not the state it is in
                refuse_if_held(self.out)
            raise
        self._acquire_lock()
        if self._checkpoint_listing() != seen:
            self._check_start()
        make_folder(self.out)
        if self.on_start is not None and self.dist.is_main:
            self.on_start()

    def _acquire_lock(self) -> None:
        """Lock ``OUT`` on the main rank (the only one that writes); every rank fails if that fails."""
        error = None
        if self._lock is not None and not self._locked:
            try:
                self._lock.acquire()
                self._locked = True
            except LmforgeError as exc:
                error = exc
        if self.dist.world_size > 1:
            message = self.dist.broadcast_json({"error": str(error) if error else None})["error"]
            if message and error is None:
                raise RunLocked(message)
        if error is not None:
            raise error

    def _release_lock(self) -> None:
        if self._lock is not None and self._locked:
            self._lock.release()
            self._locked = False

    def fit(self, steps: int | None = None) -> TrainResult:
        """Train until ``config.max_steps`` (or for at most ``steps`` more steps), then save a checkpoint.

        The first call resumes from ``OUT`` when ``config.resume`` is set, and refuses to overwrite an existing
        run otherwise. The schedule always spans ``config.max_steps``, so ``fit(steps=n)`` twice equals
        ``fit()`` up to step ``2n``. Reaching ``max_steps`` also writes ``OUT/model``. ``OUT`` is locked
        (:class:`~lmforge.utils.lock.RunFolderLock`) for the duration of the call.

        Raises:
            RunLocked: another process is writing to ``OUT``.
            TrainingDiverged: ``config.max_nonfinite_steps`` steps in a row had a non-finite loss or gradient
                norm; nothing is saved, so the newest checkpoint is the last good one.
        """
        try:
            if not self._started:
                self._begin()
                self._started = True
            else:
                self._acquire_lock()
            return self._fit(steps)
        finally:
            self._release_lock()

    def _fit(self, steps: int | None) -> TrainResult:
        cfg = self.config
        target = cfg.max_steps if steps is None else min(cfg.max_steps, self.step + steps)
        stopped_by = "max_steps" if target == cfg.max_steps else "steps"
        record: dict[str, Any] = {}
        self.model.train()
        # Only rank 0 logs: its records already hold the numbers reduced over all ranks.
        logger = RunLogger(self.out, self.step, cfg.max_steps, cfg.progress, cfg.tensorboard, job=self.job) \
            if self.dist.is_main else None
        self.dist.barrier()  # every rank's clock starts together: no rank is charged for waiting on another's setup
        self.price_tag.start()
        began, tokens_before = time.perf_counter(), self.tokens_seen
        try:
            with self._catch_signals():
                while self.step < target:
                    record = self.train_step()
                    record.update(self.price_tag.record())
                    if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.max_steps):
                        record.update(self.evaluate())
                    if logger is not None:
                        logger.log(record)
                    self._check_divergence(record)
                    signum = self._agreed_signal()
                    if signum is not None:
                        stopped_by = signal.Signals(signum).name
                        break
                    if cfg.save_every and self.step % cfg.save_every == 0 and self.step < target \
                            and not self._nonfinite:  # the checkpoint after a good step stays the newest
                        self.save_checkpoint()
                        if logger is not None:
                            logger.plot()
                if self._nonfinite and cfg.max_nonfinite_steps and stopped_by in ("max_steps", "steps"):
                    # Fewer bad steps than the limit, but the run ends on them: neither a checkpoint nor the model
                    # is saved from a diverged step (a short run at a huge LR would otherwise "finish").
                    self._diverged(record, f"by its end, step {self.step}: its last {self._nonfinite} step(s)")
                finished = self.step >= cfg.max_steps
                keep = cfg.final_checkpoint if finished else "full"
                if keep != "none" and (self._last_saved is None or self._last_saved[0] != self.step
                                       or keep == "weights"):
                    self.save_checkpoint(weights_only=keep == "weights")
        finally:
            if logger is not None:
                logger.close()
        loop_s = time.perf_counter() - began
        if self.dist.is_main:  # the run's totals so far, beside its metrics
            atomic_write_text(self.out / PRICE_TAG_FILE, json.dumps(self.price_tag.summary(), indent=1) + "\n")
        model_dir = self.save_model() if finished else None
        sizes = self._checkpoint_sizes()
        if finished and cfg.final_checkpoint == "none":
            self._remove_checkpoints()
        return TrainResult(self.step, stopped_by, self._last_saved[1] if self._last_saved else None, model_dir,
                           record, loop_s=loop_s, tokens=self.tokens_seen - tokens_before, sizes=sizes,
                           kept=cfg.final_checkpoint if finished else None)

    def _checkpoint_sizes(self) -> dict[str, int]:
        """Bytes of a checkpoint's weights and of the optimizer state: what ``final_checkpoint`` can save."""
        weights = sum(t.numel() * t.element_size() for t in self.checkpoint_module().state_dict().values()
                      if isinstance(t, torch.Tensor))
        moments = sum(t.numel() * t.element_size() for state in self.optimizer.state.values()
                      for t in state.values() if isinstance(t, torch.Tensor))
        return {"weights": int(weights), "optimizer": int(moments)}

    def _remove_checkpoints(self) -> None:
        """``final_checkpoint: none``: the finished run keeps its model folder, not its checkpoints."""
        self.dist.barrier()
        if self.dist.is_main:
            shutil.rmtree(self.checkpoints.root, ignore_errors=True)
        self._last_saved = None

    def _check_divergence(self, record: dict[str, Any]) -> None:
        """Count the steps in a row whose update was skipped for a non-finite loss or gradient norm; raise
        TrainingDiverged at ``config.max_nonfinite_steps``. Every rank sees the same reduced numbers."""
        loss = record.get("loss")
        bad = self.skipped_steps > self._skipped_seen or (loss is not None and not math.isfinite(loss))
        self._skipped_seen = self.skipped_steps
        self._nonfinite = self._nonfinite + 1 if bad else 0
        limit = self.config.max_nonfinite_steps
        if limit and self._nonfinite >= limit:
            self._diverged(record, f"at step {self.step}: {self._nonfinite} steps in a row")

    def _diverged(self, record: dict[str, Any], when: str) -> None:
        """Raise TrainingDiverged: ``when`` (step, bad steps in a row), the loss and LR, the last good checkpoint."""
        last = str(self._last_saved[1]) if self._last_saved else "none (no checkpoint was saved)"
        lr = record.get("lr", self.config.lr)
        peak = f" of peak lr {self.config.lr:.3g}" if lr != self.config.lr else ""
        raise TrainingDiverged(
            f"training diverged {when} with a non-finite loss or gradient norm (loss {record.get('loss')}, lr "
            f"{lr:.3g}{peak}); the last good checkpoint is {last} and nothing newer was saved, no model either. "
            "Lower the learning rate (or raise the warmup), or set max_nonfinite_steps (0: never stop)")

    def _agreed_signal(self) -> int | None:
        """The signal that stops the run, if any rank caught one: all ranks stop after the same step."""
        if self.dist.world_size == 1:
            return self._signal
        return int(self.dist.all_reduce([self._signal or 0], "max")[0]) or None

    @contextlib.contextmanager
    def _catch_signals(self):
        """During the loop, SIGINT/SIGTERM ask for a checkpoint-and-stop after the current step."""
        self._signal = None
        if threading.current_thread() is not threading.main_thread():
            yield  # Python delivers signals to the main thread only; nothing to install from here
            return

        first_at = [0.0]

        def handler(signum, frame):
            if self._signal is not None and signum == signal.SIGINT:
                # torchrun forwards the terminal's Ctrl-C to ranks that got it already: that echo, within
                # moments of the first, is not a second Ctrl-C.
                if self.dist.world_size == 1 or time.monotonic() - first_at[0] > SIGNAL_ECHO_S:
                    raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the checkpoint
                return
            if self._signal is None:
                first_at[0] = time.monotonic()
            self._signal = signum
            if self.dist.is_main:
                print(f"\n{signal.Signals(signum).name}: finishing step {self.step + 1} and saving a checkpoint "
                      "(Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def _count(batch: dict[str, Any], key: str, mask: bool = False) -> int:
    """The targets ``batch[key]`` marks: its labelled entries (not -100), or with ``mask`` its nonzero ones."""
    if key not in batch:
        raise ValueError(f"a loss term counts its targets in batch[{key!r}], which the objective's batch lacks")
    return int((batch[key] != 0).sum() if mask else (batch[key] != IGNORE_INDEX).sum())


def _correct(logits: torch.Tensor | None, target: torch.Tensor) -> int | None:
    """How many of the n ``target`` s (n,) the flat ``logits`` predict: argmax of (n, C), or > 0 of (n,)."""
    if logits is None:
        return None
    predicted = logits.argmax(-1) if logits.dim() == target.dim() + 1 else (logits > 0).long()
    return int((predicted == target).sum())


def _state_of(obj) -> Any:
    return obj.state_dict() if obj is not None and hasattr(obj, "state_dict") else None


def _load_state(obj, state) -> None:
    if obj is not None and state is not None and hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
