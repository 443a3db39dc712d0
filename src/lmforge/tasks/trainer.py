"""FinetuneTrainer: the pre-training Trainer with the fine-tuning recipe's optimizer, unfreezing, task evaluation
and best-checkpoint selection.

Everything else is the Trainer's: checkpoints with exact resume, signals, metrics.jsonl/TensorBoard logs. A PEFT
run checkpoints only its trainable tensors (:class:`~lmforge.tasks.peft.TrainableState`) and writes PEFT task
folders; ``OUT/best`` is the task folder of the best evaluation, its ``task.json`` recording metric, value and step.
Further evaluation sets (``eval_sets``, e.g. out-of-domain data) are scored beside the evaluation examples and
logged as ``eval_<NAME>_<metric>``; they never pick ``OUT/best``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.tasks.metrics import better
from lmforge.tasks.model import examples_with_targets, read_task_meta, save_task_model
from lmforge.tasks.optim import build_finetune_optimizer, layer_groups
from lmforge.tasks.peft import TrainableState, is_peft_task_model, save_peft_task_model
from lmforge.tasks.recipe import Recipe, trainable_from
from lmforge.training.config import TrainConfig
from lmforge.training.precision import autocast
from lmforge.training.trainer import MODEL_DIR, Trainer

BEST_DIR = "best"


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
        on_start: the Trainer's ``on_start`` (the run's own files, written once the run folder is checked and
            locked). lock: the Trainer's ``lock`` (the folder's lock, taken by a caller that writes first).
        loss: the Trainer's ``loss`` (e.g. task distillation, :mod:`lmforge.distillation.task`); evaluation
            still scores the task model alone.
        eval_sets: {NAME: encoded examples} scored at each evaluation too, as ``eval_<NAME>_<metric>``; the last
            scores, with their step, are kept in ``set_scores``.
    """

    def __init__(self, model: nn.Module, task, train_data, config: TrainConfig, recipe: Recipe, *,
                 out: str | Path, eval_examples: list | None = None, tokenizer=None,
                 peft_base: str | Path | None = None, on_start=None, lock=None, loss=None,
                 eval_sets: dict[str, list] | None = None) -> None:
        super().__init__(model, task.collate, train_data, config, out=out, eval_data=None,
                         eval_objective=task.collate, tokenizer=tokenizer, on_start=on_start, lock=lock, loss=loss,
                         job="finetune")
        self.task, self.recipe = task, recipe
        self.eval_examples = eval_examples
        self.eval_sets = {name: examples for name, examples in (eval_sets or {}).items() if examples}
        self.set_scores: dict[str, dict[str, Any]] = {}
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
        return TrainableState(self.model, self._trainable)

    def save_task_folder(self, path: Path, extra: dict | None = None) -> Path:
        """Write a task folder of the model as it is: the whole model, or for PEFT the adapter and head."""
        if self.peft:
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
        """Task metrics on the evaluation examples (``eval_`` + name) and on each further set (``eval_<NAME>_`` +
        name); saves ``OUT/best`` when the evaluation examples' metric improves."""
        record: dict[str, float | None] = {}
        if self.eval_examples:
            scores = self._scores(self.eval_examples)
            value = scores.get(self.metric)
            if better(self.metric, value, self.best["value"] if self.best else None):
                self.best = {"metric": self.metric, "value": value, "step": self.step}
                self.save_task_folder(self.out / BEST_DIR, extra={"best": self.best})
            record.update({f"eval_{k}": v for k, v in scores.items()})
        for name, examples in self.eval_sets.items():
            scores = self._scores(examples)
            self.set_scores[name] = {**scores, "step": self.step}
            record.update({f"eval_{name}_{k}": v for k, v in scores.items()})
        return record

    def _scores(self, examples: list) -> dict[str, float | None]:
        batch_size = self.recipe.eval_batch_size or self.config.batch_size
        with autocast(self.device, self.autocast_dtype):
            _, scores = self.task.evaluate(self.model, examples, batch_size, device=self.device)
        return {k: (v if isinstance(v, float) and math.isfinite(v) else None) for k, v in scores.items()}

    def save_model(self) -> Path:
        return self.save_task_folder(self.out / MODEL_DIR)

    def parameter_counts(self) -> dict[str, int]:
        """Trainable and total parameters of full fine-tuning (tied weights once): all, or the head's if frozen."""
        named = dict(self.model.named_parameters())  # tied weights appear once
        lowest = trainable_from(1, self._top, self.recipe) if self.recipe.freeze_body else 0
        return {"trainable": sum(p.numel() for n, p in named.items() if self._depth[n] >= lowest),
                "total": sum(p.numel() for p in named.values())}
