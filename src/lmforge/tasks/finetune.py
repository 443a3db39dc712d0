"""The fine-tuning recipe: the pre-training Trainer, plus the practice of ULMFiT and BERT.

    practice                                   setting                  how
    small LR with warmup (BERT: 2e-5 .. 5e-5)  TrainConfig lr, warmup   the Trainer's schedules
    slanted triangular LR (ULMFiT eq. 3)       schedule=slanted-triangular
    discriminative fine-tuning (ULMFiT 3.2)    Recipe.layer_decay       group l's LR = lr * decay^(top - l)
    gradual unfreezing (ULMFiT 3.3)            Recipe.unfreeze_every    top group first, one more every N steps
    feature extraction / linear probe          Recipe.freeze_body       only the head trains; body in eval mode
    best checkpoint by a metric                Recipe.metric            OUT/best is rewritten when it improves

Layer groups, bottom to top (:func:`layer_groups`): 0 = embeddings (token, position, segment tables, relative
biases), 1..L = the encoder's then the decoder's layers (a stack's final norm joins its last layer), L+1 = the
task head, the pooler and any LM head. ULMFiT's decay is 1/2.6 per layer; ELECTRA-style fine-tuning uses ~0.8.

Everything else is the Trainer's: checkpoints with exact resume, signals, metrics.jsonl/TensorBoard logs.
Unfreezing is a pure function of the step, so a resumed run unfreezes at the same steps. Per-group LR scales
live in the optimizer's param groups (``lr_scale``), which checkpoints store, and :class:`ScaledAdamW`
applies them at each step on top of the LR the Trainer's schedule sets.

Run folder: the Trainer's ``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``, ``loss.png``; ``best/`` (the
task folder of the best evaluation; its ``task.json`` records metric, value and step) and ``model/`` (the
final task folder).

Parameter-efficient fine-tuning (``peft=PeftConfig(...)``): the body gets a PEFT adapter and freezes, the head
trains in full (:mod:`lmforge.peft.task`). ``best/`` and ``model/`` are then PEFT task folders: adapter, head
and the path of the base model's folder (a base that lives in no folder, e.g. a preset or random weights, is
saved once to ``OUT/base``). Checkpoints hold only the trainable tensors and their optimizer state; resume
rebuilds the frozen base from its source, after checking it is the one ``OUT/peft.json`` recorded.

Example:
    >>> import lmforge
    >>> body = lmforge.build_model("bert-tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> sorted(set(layer_groups(body).values()))
    [0, 1, 2, 3]
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from lmforge.checkpoint import load_body
from lmforge.config import ConfigError
from lmforge.peft.config import PeftConfig
from lmforge.tasks import metrics as task_metrics
from lmforge.tasks.data import ExampleBatches, Table, read_table
from lmforge.tasks.model import build_task_model, examples_with_targets, read_task_meta, save_task_model
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.training.optim import parameter_kind
from lmforge.training.state import seed_all
from lmforge.training.precision import autocast
from lmforge.training.trainer import MODEL_DIR, Trainer, TrainResult

BEST_DIR = "best"
PEFT_BASE_DIR = "base"  # PEFT runs: a snapshot of a base model that lives in no folder
PEFT_FILE = "peft.json"  # PEFT runs: the method and the base's identity, checked on resume
_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.layers\.(\d+)\.")
_TOP = re.compile(r"(?:^|\.)(head|pooler|lm_head|mlm_head)\.|^head\.")
_FINAL_NORM = re.compile(r"(?:^|\.)(encoder|decoder)\.final_norm\.")


@dataclass
class Recipe:
    """Fine-tuning settings beyond the Trainer's (see the module docstring).

    Args:
        layer_decay: LR multiplier per layer group below the top (1.0 = the same LR everywhere).
        unfreeze_every: gradual unfreezing period in steps (0 = everything trains from the start).
        freeze_body: train the head only (feature extraction; a linear probe with a linear head).
        metric: metric that picks the best checkpoint (default: the task's, e.g. accuracy, f1, bleu).
        eval_limit: evaluate on the first N evaluation examples (of each task) during training (None = all).
        eval_batch_size: batch size of evaluation (None = the training batch size).
        bucket: batch examples of similar length, from windows of this many batches (0 = plain shuffling);
            see :class:`~lmforge.tasks.data.ExampleBatches`.
    """

    layer_decay: float = 1.0
    unfreeze_every: int = 0
    freeze_body: bool = False
    metric: str | None = None
    eval_limit: int | None = None
    eval_batch_size: int | None = None
    bucket: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.layer_decay <= 1.0:
            raise ConfigError(f"Recipe.layer_decay={self.layer_decay} must be in (0, 1]")
        if self.unfreeze_every < 0:
            raise ConfigError(f"Recipe.unfreeze_every={self.unfreeze_every} must be >= 0")
        if self.freeze_body and self.unfreeze_every:
            raise ConfigError("Recipe.freeze_body and unfreeze_every exclude each other (a frozen body never thaws)")
        if self.bucket < 0:
            raise ConfigError(f"Recipe.bucket={self.bucket} must be >= 0")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ConfigError(f"Recipe.eval_limit={self.eval_limit} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------- layer groups
def layer_groups(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer group (0 = embeddings .. top = head), for a Transformer or a TaskModel."""
    body = getattr(model, "body", model)  # a TaskModel, a wrapper exposing .body (PEFT), or a Transformer
    cfg = body.config
    n_enc = cfg.n_layers if cfg.arch != "decoder" else 0
    n_dec = cfg.decoder_layers if cfg.arch == "encoder-decoder" else (cfg.n_layers if cfg.arch == "decoder" else 0)
    top = n_enc + n_dec + 1
    groups = {}
    for name, _ in model.named_parameters():
        if (m := _LAYER.search(name)) is not None:
            i = int(m.group(2))
            groups[name] = 1 + i + (n_enc if m.group(1) == "decoder" else 0)
        elif (m := _FINAL_NORM.search(name)) is not None:
            groups[name] = n_enc if m.group(1) == "encoder" else top - 1
        elif _TOP.search(name) or name.startswith("head."):
            groups[name] = top
        else:
            groups[name] = 0
    return groups


class ScaledAdamW(torch.optim.AdamW):
    """AdamW whose param groups may carry ``lr_scale``: each step uses ``lr * lr_scale`` for the group.

    The Trainer sets every group's ``lr`` from the schedule before each step; the scale is applied on top
    and undone afterwards, so ``lr`` always reads as the schedule's value.
    """

    @torch.no_grad()
    def step(self, closure=None):
        base = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = g["lr"] * g.get("lr_scale", 1.0)
        try:
            return super().step(closure)
        finally:
            for g, lr in zip(self.param_groups, base):
                g["lr"] = lr


def build_finetune_optimizer(model: nn.Module, config: TrainConfig, layer_decay: float = 1.0,
                             names: set[str] | None = None) -> ScaledAdamW:
    """AdamW groups by (layer group, decay or not), each with ``lr_scale = layer_decay ** (top - group)``.

    Every parameter in ``names`` (default: all) is included, frozen or not, so that unfrozen layers join the
    same optimizer (AdamW skips parameters whose gradient is None); a PEFT run leaves its frozen base out.
    Weight decay follows :mod:`lmforge.training.optim`.
    """
    depth = layer_groups(model)
    top = max(depth.values())
    skip = set(config.no_decay)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            if names is not None and full not in names:
                continue
            d, decays = depth[full], parameter_kind(module, name) not in skip
            group = groups.setdefault((d, decays), {"params": [], "names": [], "layer_group": d,
                                                    "weight_decay": config.weight_decay if decays else 0.0,
                                                    "lr_scale": layer_decay ** (top - d)})
            group["params"].append(param)
            group["names"].append(full)
    ordered = [groups[k] for k in sorted(groups, key=lambda k: (k[0], not k[1]))]
    return ScaledAdamW(ordered, lr=config.lr, betas=tuple(config.betas), eps=config.eps, foreach=True)


def trainable_from(step: int, top: int, recipe: Recipe) -> int:
    """Lowest layer group that trains at ``step`` (1-based): ``top`` for a frozen body, else by unfreezing."""
    if recipe.freeze_body:
        return top
    if not recipe.unfreeze_every:
        return 0
    return max(top - (step - 1) // recipe.unfreeze_every, 0)


# ------------------------------------------------------------------------------------------- the trainer
class FinetuneTrainer(Trainer):
    """The pre-training :class:`~lmforge.training.Trainer` with the recipe's optimizer, unfreezing, task
    evaluation and best-checkpoint selection.

    Args:
        model: a :class:`TaskModel` (or a wrapper around one exposing ``body``/``spec``, e.g. PEFT).
        task: the :class:`~lmforge.tasks.base.Task` (its ``collate`` is the Trainer's batch transform).
        train_data: :class:`ExampleBatches` of encoded training examples.
        config: TrainConfig.
        recipe: :class:`Recipe`.
        out: run folder.
        eval_examples: encoded evaluation examples, all of them scored at each evaluation (None: no evaluation,
            no best checkpoint).
        tokenizer: saved into ``best/`` and ``model/``.
        peft_base: for a model with a PEFT body, the folder of its base model, recorded in ``best/`` and
            ``model/`` (which hold the adapter and head only).
    """

    def __init__(self, model: nn.Module, task, train_data, config: TrainConfig, recipe: Recipe, *,
                 out: str | Path, eval_examples: list | None = None, tokenizer=None,
                 peft_base: str | Path | None = None) -> None:
        from lmforge.peft.task import is_peft_task_model

        super().__init__(model, task.collate, train_data, config, out=out, eval_data=None,
                         eval_objective=task.collate, tokenizer=tokenizer)
        self.task, self.recipe = task, recipe
        self.eval_examples = eval_examples
        self.metric = recipe.metric or task.default_metric
        self.peft = is_peft_task_model(self.model)
        if self.peft and peft_base is None:
            raise ValueError("a PEFT task model needs peft_base= (the folder of its base model)")
        if self.peft and self.dist.strategy == "fsdp":  # sharded checkpoints hold whole models, not adapters
            raise ConfigError("PEFT fine-tuning runs on one process or with DDP, not with FSDP")
        self.peft_base = peft_base
        # What may ever train: everything, or for PEFT what apply_peft left trainable (adapter and head);
        # the recipe's freezing then works within it.
        self._trainable = {n for n, p in self.model.named_parameters() if p.requires_grad or not self.peft}
        self.optimizer = build_finetune_optimizer(self.model, config, recipe.layer_decay,
                                                  self._trainable if self.peft else None)
        self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self._depth = layer_groups(self.model)
        self._top = max(self._depth.values())
        self.best: dict[str, Any] | None = None
        self._apply_freezing(1)
        if self.eval_examples:
            # Fail now, not after the first stretch of training, when the metric does not exist for this task.
            # One example of each task of a mixture, so that every "task/metric" name shows up.
            firsts: dict[str, Any] = {}
            for e in self.eval_examples:
                firsts.setdefault(e.get("task", ""), e)
            sample = list(firsts.values()) if len(firsts) > 1 else self.eval_examples[:2]
            _, probe = task.evaluate(self.model, sample, len(sample), device=self.device)
            if self.metric not in probe:
                raise ConfigError(f"metric {self.metric!r} is not computed for task {task.spec.task!r}; "
                                  f"choose one of {', '.join(probe)}")

    def _apply_freezing(self, step: int) -> None:
        lowest = trainable_from(step, self._top, self.recipe)
        for name, param in self.model.named_parameters():
            param.requires_grad_(name in self._trainable and self._depth[name] >= lowest)

    def checkpoint_module(self):
        """PEFT runs checkpoint the trainable tensors only; the frozen base is rebuilt from its source."""
        if not self.peft:
            return self.model
        from lmforge.peft.task import TrainableState

        return TrainableState(self.model, self._trainable)

    def save_task_folder(self, path: Path, extra: dict | None = None) -> Path:
        """Write a task folder of the model as it is: the whole model, or for PEFT the adapter and head."""
        if self.peft:
            from lmforge.peft.task import save_peft_task_model

            return save_peft_task_model(self.model, path, self.peft_base, self.tokenizer, extra)
        return save_task_model(self.model, path, self.tokenizer, extra=extra)

    def train_step(self) -> dict[str, Any]:
        self._apply_freezing(self.step + 1)
        if self.recipe.freeze_body:
            getattr(self.model, "body", self.model).eval()  # frozen features: no dropout, as if extracted once
        return super().train_step()

    def resume(self) -> bool:
        resumed = super().resume()
        meta = read_task_meta(self.out / BEST_DIR) if (self.out / BEST_DIR).is_dir() else None
        self.best = meta.get("best") if meta else None
        return resumed

    def count_targets(self, batch: dict[str, Any]) -> int:
        """``loss_average="example"``: the loss is a mean over examples with a target, so count those."""
        if self.task.spec.loss_average == "example":
            return examples_with_targets(batch["labels"])
        return super().count_targets(batch)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Task metrics on the evaluation examples (``eval_`` + name); saves ``OUT/best`` when the metric improves."""
        if not self.eval_examples:
            return {}
        batch_size = self.recipe.eval_batch_size or self.config.batch_size
        with autocast(self.device, self.autocast_dtype):
            _, scores = self.task.evaluate(self.model, self.eval_examples, batch_size, device=self.device)
        value = scores.get(self.metric)
        if task_metrics.better(self.metric, value, self.best["value"] if self.best else None):
            self.best = {"metric": self.metric, "value": value, "step": self.step}
            self.save_task_folder(self.out / BEST_DIR, extra={"best": self.best})
        return {f"eval_{k}": (v if isinstance(v, float) and math.isfinite(v) else None) for k, v in scores.items()}

    def save_model(self) -> Path:
        return self.save_task_folder(self.out / MODEL_DIR)


# ------------------------------------------------------------------------------------------- entry point
@dataclass
class FinetuneResult:
    """What :func:`finetune` did: the Trainer's result, the task model, and the best evaluation.

    ``counts``: training and evaluation examples; ``params``: ``trainable`` and ``total`` parameters.
    """

    train: TrainResult
    model: nn.Module
    task: Any
    best: dict[str, Any] | None = None
    out: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)

    @property
    def best_value(self) -> float | None:
        return self.best["value"] if self.best else None


def _as_table(source) -> Table:
    return source if isinstance(source, Table) else read_table(source)


def finetune(model, spec: TaskSpec, train, eval=None, *, config: TrainConfig, recipe: Recipe | None = None,
             out: str | Path, tokenizer=None, random_init: bool = False, epochs: float | None = None,
             warmup_ratio: float | None = None, peft: PeftConfig | None = None,
             wrap: Callable[[nn.Module], nn.Module] | None = None,
             log: Callable[[str], None] | None = None) -> FinetuneResult:
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
    """
    from lmforge.tasks.registry import build_task

    # Everything initialised here (a from-scratch body, the new head, PEFT weights) draws from the global
    # generators: seed them, or the same command gives a different model in every process.
    seed_all(config.seed)
    recipe = recipe or Recipe()
    out = Path(out)
    source = model
    if peft is not None:
        if recipe.freeze_body:
            raise ConfigError("Recipe.freeze_body trains the head only; it cannot be combined with a PEFT adapter")
        _check_fresh(out, config)  # before OUT/base or OUT/peft.json of an existing run can be touched
        if config.resume and (out / PEFT_BASE_DIR / "config.json").is_file():
            source, random_init = out / PEFT_BASE_DIR, False  # the snapshot this run's base was saved to
    body, tok = load_body(source, tokenizer, random_init)
    cfg = body.config
    train_tables, eval_tables = _tables(spec, train, eval)
    if spec.task in ("classify", "multilabel", "tag") and not spec.labels:
        spec = spec.replace(labels=build_task(spec, tok, cfg).label_set(train_tables[""]))
    task = build_task(spec, tok, cfg)
    names = list(train_tables)
    train_sets = [_encode(task, train_tables[n], n) for n in names]
    train_sets = [[e for e in s if not e.get("answer_cut")] for s in train_sets]
    # The limit applies per task, so that every task of a mixture is scored.
    eval_examples = [e for n in eval_tables for e in _encode(task, eval_tables[n], n)[:recipe.eval_limit]]
    if len(names) > 1:
        rates = _mixing_rates(spec, [len(s) for s in train_sets])
        batches = ExampleBatches(train_sets, config.batch_size, seed=config.seed, rates=rates, bucket=recipe.bucket)
    else:
        batches = ExampleBatches(train_sets[0], config.batch_size, seed=config.seed, bucket=recipe.bucket)
    config = _fit_steps(config, len(batches), epochs, warmup_ratio)
    task_model = build_task_model(body, spec)
    peft_base, report = None, None
    if peft is not None:
        from lmforge.peft.task import apply_task_peft, parameter_report

        peft_base = _peft_base(source, random_init, task_model.body, out, tok)  # before QLoRA quantises it
        apply_task_peft(task_model, peft, tokenizer=tok)
        _record_peft_run(out, peft, task_model.body, peft_base, config.resume)
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
            + f" | {sum(len(s) for s in train_sets)} train / {len(eval_examples)} eval examples | "
            f"{config.max_steps} steps x {config.batch_size} | lr {config.lr:g} {config.schedule} | {trainable}")
    trainer = FinetuneTrainer(task_model, task, batches, config, recipe, out=out, eval_examples=eval_examples or None,
                              tokenizer=tok, peft_base=peft_base)
    params = {"trainable": report.trainable, "total": report.total} if report else _parameter_counts(trainer)
    result = trainer.fit()
    counts = {"train": sum(len(s) for s in train_sets), "eval": len(eval_examples)}
    return FinetuneResult(result, trainer.model, task, trainer.best, out, counts, params)


def _parameter_counts(trainer: FinetuneTrainer) -> dict[str, int]:
    """Trainable and total parameters of full fine-tuning (tied weights once): all, or the head's if frozen."""
    named = dict(trainer.model.named_parameters())  # tied weights appear once
    lowest = trainable_from(1, trainer._top, trainer.recipe) if trainer.recipe.freeze_body else 0
    return {"trainable": sum(p.numel() for n, p in named.items() if trainer._depth[n] >= lowest),
            "total": sum(p.numel() for p in named.values())}


# ------------------------------------------------------------------------------------------- PEFT runs
def _check_fresh(out: Path, config: TrainConfig) -> None:
    from lmforge.training.state import CheckpointManager
    from lmforge.training.trainer import RunExistsError

    steps = CheckpointManager(out / "checkpoints").steps()
    if steps and not config.resume:
        raise RunExistsError(f"{out} already holds a run (checkpoints up to step {steps[-1]}): resume it with "
                             "--resume (resume=True) or choose another output folder")


def _peft_base(source, random_init: bool, body: nn.Module, out: Path, tokenizer) -> Path:
    """The folder holding a PEFT run's base: ``source`` when it is a folder used as it is, else a snapshot of
    ``body`` written to ``OUT/base`` (a preset's or a random initialisation's weights exist nowhere else)."""
    from lmforge import checkpoint

    if isinstance(source, (str, Path)) and Path(source).is_dir() and not random_init:
        return Path(source).resolve()
    return checkpoint.save(body, out / PEFT_BASE_DIR, tokenizer=tokenizer).resolve()


def _record_peft_run(out: Path, cfg: PeftConfig, peft_body, base: Path, resume: bool) -> None:
    """Write ``OUT/peft.json`` (method, base folder and identity); on resume, check the run is the same.

    A resumed PEFT run rebuilds its frozen base from the source, so a base folder that changed in between
    would silently change the result: the identity recorded at the start catches that.
    """
    from lmforge.peft.io import verify_base
    from lmforge.utils.io import atomic_write_text

    file = out / PEFT_FILE
    if resume and file.is_file():
        saved = json.loads(file.read_text(encoding="utf-8"))
        if saved.get("peft") != cfg.to_dict():
            raise ConfigError(f"{file}: this run trains {PeftConfig.from_dict(saved.get('peft')).options()}, "
                              f"not {cfg.options()}; resume it with the same PEFT settings")
        verify_base(saved.get("base_identity", {}), peft_body.base_identity, f"{out} (resume)")
        return
    record = {"peft": cfg.to_dict(), "base": str(base), "base_identity": peft_body.base_identity}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(file, json.dumps(record, indent=2) + "\n")


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


def _tables(spec: TaskSpec, train, eval) -> tuple[dict[str, Table], dict[str, Table]]:
    """name -> Table for training and evaluation ("" for a single task)."""
    if not spec.mixture:
        if train is None:
            raise ConfigError("no training data: pass a data file (--train)")
        return {"": _as_table(train)}, ({"": _as_table(eval)} if eval is not None else {})
    if train is not None or eval is not None:
        raise ConfigError("a mixture names its own files (train/eval per entry); do not pass --train/--eval too")
    trains, evals = {}, {}
    for entry in spec.mixture:
        if not entry.get("train"):
            raise ConfigError(f"mixture task {entry['name']!r} has no 'train' file")
        trains[entry["name"]] = _as_table(entry["train"])
        if entry.get("eval"):
            evals[entry["name"]] = _as_table(entry["eval"])
    return trains, evals


def _encode(task, table: Table, name: str) -> list[dict[str, Any]]:
    return task.encode(table, True, name) if task.spec.task == "text2text" else task.encode(table, True)


def _mixing_rates(spec: TaskSpec, sizes: list[int]) -> list[float]:
    from lmforge.tasks.text2text import mixing_rates

    return mixing_rates(sizes, spec.mixing_cap, spec.mixing_temperature)
