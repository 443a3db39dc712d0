"""The fine-tuning recipe: the pre-training Trainer, plus the practice of ULMFiT and BERT.

    practice                                   setting                  how
    small LR with warmup (BERT: 2e-5 .. 5e-5)  TrainConfig lr, warmup   the Trainer's schedules
    slanted triangular LR (ULMFiT eq. 3)       schedule=slanted-triangular
    discriminative fine-tuning (ULMFiT 3.2)    Recipe.layer_decay       group l's LR = lr * decay^(top - l)
    gradual unfreezing (ULMFiT 3.3)            Recipe.unfreeze_every    top group first, one more every N steps
    feature extraction / linear probe          Recipe.freeze_body       only the head trains; body in eval mode
    best checkpoint by a metric                Recipe.metric            OUT/best is rewritten when it improves

Where each part lives: the :class:`Recipe` in :mod:`lmforge.tasks.recipe`; layer groups and the optimizer
(:class:`ScaledAdamW`) in :mod:`lmforge.tasks.optim`; :class:`FinetuneTrainer` in :mod:`lmforge.tasks.trainer`;
PEFT task models and run records in :mod:`lmforge.tasks.peft`; mixtures in :mod:`lmforge.tasks.mixture`.
Everything else is the Trainer's: checkpoints with exact resume, signals, metrics.jsonl/TensorBoard logs.

Run folder: the Trainer's ``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``, ``loss.png``; ``best/`` (the
task folder of the best evaluation; its ``task.json`` records metric, value and step) and ``model/`` (the
final task folder).

Further evaluation sets (``eval_sets={"news": "news_dev.tsv"}``, e.g. out-of-domain data) are scored at every
evaluation beside ``eval``, with the same task, ``eval_limit`` and batch size, and logged as
``eval_<NAME>_<metric>``; only ``eval`` picks ``best/``. The last evaluation is of the final model (the Trainer
evaluates at the last step), so ``FinetuneResult.eval_sets`` equals ``lmforge evaluate`` of ``model/`` on them.

Parameter-efficient fine-tuning (``peft=PeftConfig(...)``): the body gets a PEFT adapter and freezes, the head
trains in full (:mod:`lmforge.tasks.peft`). ``best/`` and ``model/`` are then PEFT task folders: adapter, head
and the path of the base model's folder (a base that lives in no folder, e.g. a preset or random weights, is
saved once to ``OUT/base``). Checkpoints hold only the trainable tensors and their optimizer state; resume
rebuilds the frozen base from its source, after checking it is the one ``OUT/peft.json`` recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torch import nn

from lmforge.checkpoint import load_body, model_source
from lmforge.models.transformer import set_label_smoothing
from lmforge.config import ConfigError
from lmforge.peft.config import PeftConfig
from lmforge.tasks.data import ExampleBatches, Table
from lmforge.tasks.gpt1_transforms import add_transform_tokens, grow_token_embeddings
from lmforge.tasks.mixture import as_table, mixture_rates, task_tables
from lmforge.tasks.model import build_task_model
from lmforge.tasks.optim import ScaledAdamW, build_finetune_optimizer, layer_groups
from lmforge.tasks.peft import PEFT_BASE_DIR, PEFT_FILE, apply_task_peft, parameter_report, peft_base, record_peft_run
from lmforge.tasks.recipe import Recipe
from lmforge.tasks.registry import build_task
from lmforge.tasks.spec import GENERATIVE_TASKS, TaskSpec
from lmforge.tasks.trainer import FinetuneTrainer
from lmforge.training.config import TrainConfig
from lmforge.training.distributed import launcher_env
from lmforge.training.state import seed_all
from lmforge.training.trainer import TrainResult, check_fresh_run
from lmforge.utils.lock import RunFolderLock

# Fine-tuning's public names, importable from this entry point too (each part lives in the module named above).
__all__ = ["FinetuneResult", "FinetuneTrainer", "Recipe", "ScaledAdamW", "build_finetune_optimizer", "finetune",
           "layer_groups"]


@dataclass
class FinetuneResult:
    """What :func:`finetune` did: the Trainer's result, the task model, and the best evaluation.

    ``counts``: training and evaluation examples (``eval_<NAME>`` per further set); ``params``: ``trainable`` and
    ``total`` parameters; ``eval_sets``: {NAME: the last evaluation's scores, with its ``step``}.
    """

    train: TrainResult
    model: nn.Module
    task: Any
    best: dict[str, Any] | None = None
    out: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    eval_sets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def best_value(self) -> float | None:
        return self.best["value"] if self.best else None




def finetune(model, spec: TaskSpec, train, eval=None, *, config: TrainConfig, recipe: Recipe | None = None,
             out: str | Path, tokenizer=None, random_init: bool = False, epochs: float | None = None,
             warmup_ratio: float | None = None, peft: PeftConfig | None = None,
             wrap: Callable[[nn.Module], nn.Module] | None = None,
             log: Callable[[str], None] | None = None,
             on_start: Callable[[], None] | None = None, loss=None,
             eval_sets: dict[str, Any] | None = None) -> FinetuneResult:
    """Fine-tune ``model`` on a task and return the result (see :class:`FinetuneResult`).

    Args:
        model: a folder (lmforge or Hugging Face), a preset name (with ``tokenizer``), or a Transformer.
        spec: the TaskSpec; its ``labels`` are filled from the training data when empty.
        train: a data file, ``NAME:SPLIT``, or a :class:`Table`. For a text2text mixture: None (each mixture
            entry names its ``train``/``eval`` files).
        eval: evaluation data, as ``train`` (optional).
        config: TrainConfig (optimizer, schedule, steps, checkpoints, precision...).
        recipe: fine-tuning settings (:class:`Recipe`).
        out: run folder.
        tokenizer: for presets and folders without one.
        random_init: same architecture, fresh weights (the from-scratch baseline).
        epochs: set ``max_steps`` to this many passes over the training examples.
        warmup_ratio: set ``warmup`` to this share of ``max_steps`` (BERT: 0.1).
        peft: train a PEFT adapter (and the head) instead of the whole model; see the module docstring.
        wrap: a function applied to the assembled TaskModel before training (after ``peft``).
        log: called with one-line progress notes (what is trained on what), e.g. ``print``.
        on_start: writes the caller's run files once the Trainer has checked and locked ``out`` (see
            :class:`~lmforge.training.Trainer`).
        loss: the Trainer's ``loss(model, batch)`` in place of the task model's own (task distillation).
        eval_sets: further evaluation data {NAME: file, ``NAME:SPLIT`` or Table}, scored at every evaluation as
            ``eval_<NAME>_<metric>`` (see the module docstring); not with a mixture.
    """
    # Everything initialised here (a from-scratch body, the new head, PEFT weights) draws from the global
    # generators: seed them, or the same command gives a different model in every process.
    seed_all(config.seed)
    recipe = recipe or Recipe()
    out = Path(out)
    source, lock = model_source(model), None  # a packaged model's name: its folder (a PEFT base needs no copy)
    if peft is not None:
        if recipe.freeze_body:
            raise ConfigError("Recipe.freeze_body trains the head only; it cannot be combined with a PEFT adapter")
        check_fresh_run(out, config.resume)  # before OUT/base or OUT/peft.json of an existing run can be touched
        if not (config.resume and (out / PEFT_FILE).is_file()) and launcher_env()[0] == 0:
            # OUT/base and OUT/peft.json are written before the Trainer exists: lock the folder for them (the
            # Trainer keeps the lock for the run), then check again, now that no other process can write.
            lock = RunFolderLock(out).acquire()
    try:
        if lock is not None:
            check_fresh_run(out, config.resume)
        if peft is not None and config.resume and (out / PEFT_BASE_DIR / "config.json").is_file():
            source, random_init = out / PEFT_BASE_DIR, False  # the snapshot this run's base was saved to
        return _finetune(source, spec, train, eval, config, recipe, out, tokenizer, random_init, epochs,
                         warmup_ratio, peft, wrap, log, on_start, lock, loss, eval_sets or {})
    finally:
        if lock is not None:
            lock.release()  # a no-op once the Trainer's fit has released it


def _finetune(source, spec, train, eval, config, recipe, out, tokenizer, random_init, epochs, warmup_ratio, peft,
              wrap, log, on_start, lock, loss=None, eval_sets=None) -> FinetuneResult:
    if eval_sets and spec.mixture:
        raise ConfigError("eval_sets: a mixture evaluates each of its tasks on its own eval file")
    if config.label_smoothing and spec.task not in GENERATIVE_TASKS:
        raise ConfigError(f"label_smoothing {config.label_smoothing:g}: smooths the token loss of the generative "
                          f"tasks ({', '.join(GENERATIVE_TASKS)}), not task {spec.task!r}")
    set_tables = {name: as_table(data) for name, data in (eval_sets or {}).items()}  # read (checked) before loading
    body, tok = load_body(source, tokenizer, random_init)
    cfg = body.config
    if spec.input_transform != "plain":  # GPT-1's [start], [delim], [extract]: new tokens, learned from here on
        add_transform_tokens(tok)
    train_tables, eval_tables = task_tables(spec, train, eval)
    if spec.task in ("classify", "multilabel", "tag") and not spec.labels:
        spec = spec.replace(labels=build_task(spec, tok, cfg).label_set(train_tables[""]))
    task = build_task(spec, tok, cfg)
    names = list(train_tables)
    train_sets = [_encode(task, train_tables[n], n) for n in names]
    train_sets = [[e for e in s if not e.get("answer_cut")] for s in train_sets]
    if spec.task == "qa" and spec.null_threshold is None and any(not e["gold"] for s in train_sets for e in s):
        spec = spec.replace(null_threshold=0.0)  # SQuAD 2.0 data: predict "no answer" (tune tau on dev)
        task = build_task(spec, tok, cfg)
    # The limit applies per task, so that every task of a mixture is scored.
    eval_examples = [e for n in eval_tables for e in _encode(task, eval_tables[n], n)[:recipe.eval_limit]]
    set_examples = {name: _encode(task, table, "")[:recipe.eval_limit] for name, table in set_tables.items()}
    if len(names) > 1:
        rates = mixture_rates(spec, [len(s) for s in train_sets])
        batches = ExampleBatches(train_sets, config.batch_size, seed=config.seed, rates=rates, bucket=recipe.bucket)
    else:
        batches = ExampleBatches(train_sets[0], config.batch_size, seed=config.seed, bucket=recipe.bucket)
    config = _fit_steps(config, len(batches), epochs, warmup_ratio)
    task_model = build_task_model(body, spec)
    set_label_smoothing(task_model, config.label_smoothing)
    if spec.input_transform != "plain":
        grow_token_embeddings(task_model.body, tok.vocab_size)
    base, report = None, None
    if peft is not None:
        base = peft_base(source, random_init, task_model.body, out, tok)  # before QLoRA quantises it
        apply_task_peft(task_model, peft, tokenizer=tok)
        record_peft_run(out, peft, task_model.body, base, config.resume)
        report = parameter_report(task_model)  # before a recipe's unfreezing schedule hides some of it
    if wrap is not None:
        task_model = wrap(task_model)
    if log is not None:
        trainable = "head only" if recipe.freeze_body else "all layers"
        total = report.total if report else sum(p.numel() for p in task_model.parameters())
        if peft is not None:
            options = ", ".join(f"{k}={v}" for k, v in peft.options().items() if k != "method")
            trainable = f"peft {peft.method}{f' ({options})' if options else ''}: {report}"
        log(f"{cfg.name} ({cfg.arch}, {total / 1e6:.2f}M parameters"
            f"{', random init' if random_init else ''}) | task {spec.task}"
            + (f" ({len(spec.labels)} labels)" if spec.labels else "")
            + f" | {sum(len(s) for s in train_sets)} train / {len(eval_examples)} eval examples"
            + "".join(f" / {len(v)} {name}" for name, v in set_examples.items()) + " | "
            f"{config.max_steps} steps x {config.batch_size} | lr {config.lr:g} {config.schedule} | {trainable}")
    trainer = FinetuneTrainer(task_model, task, batches, config, recipe, out=out, eval_examples=eval_examples or None,
                              tokenizer=tok, peft_base=base, on_start=on_start, lock=lock, loss=loss,
                              eval_sets=set_examples)
    params = {"trainable": report.trainable, "total": report.total} if report else trainer.parameter_counts()
    result = trainer.fit()
    counts = {"train": sum(len(s) for s in train_sets), "eval": len(eval_examples),
              **{f"eval_{name}": len(v) for name, v in set_examples.items()}}
    return FinetuneResult(result, trainer.model, task, trainer.best, out, counts, params, trainer.set_scores)


# ------------------------------------------------------------------------------------------- helpers
def _fit_steps(config: TrainConfig, batches_per_epoch: int, epochs: float | None,
               warmup_ratio: float | None) -> TrainConfig:
    changes: dict[str, Any] = {}
    if epochs is not None:
        if epochs <= 0:
            raise ConfigError(f"epochs={epochs} must be > 0")
        changes["max_steps"] = max(1, math.ceil(epochs * batches_per_epoch / config.grad_accum))
    if warmup_ratio is not None:
        if not 0.0 <= warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio={warmup_ratio} must be in [0, 1)")
        changes["warmup"] = int(warmup_ratio * changes.get("max_steps", config.max_steps))
    return config.updated(changes, source="finetune") if changes else config


def _encode(task, table: Table, name: str) -> list[dict[str, Any]]:
    return task.encode(table, True, name) if task.spec.task == "text2text" else task.encode(table, True)
