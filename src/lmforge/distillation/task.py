"""Task distillation (Hinton et al. 2015, on a fine-tuned classifier as in DistilBERT's section 4.1 and
TinyBERT's task stage): a fine-tuned teacher's soft labels teach a student the same task.

    batch = task.collate(examples)             the student's task batch (the teacher reads the same ids)
    z_s = student(batch), z_t = teacher(batch) (B, C) class logits; teacher frozen, eval mode, no gradient
    L = alpha * T^2 KL(softmax(z_t/T) || softmax(z_s/T)) + (1 - alpha) * CE(z_s, gold)

The teacher is a task folder written by ``lmforge finetune --task classify``; its logits are computed on the
training texts as they are drawn. The student is a preset (its layers, when the shapes allow, from every
other teacher layer: :mod:`lmforge.distillation.student`) or a model folder, with a fresh task head for the
teacher's labels (in the teacher's order, so that logit k means the same class in both).

Training is :func:`lmforge.tasks.finetune.finetune` with a Trainer ``loss``: the task data pipeline,
``FinetuneTrainer`` (checkpoints with exact resume, bf16, task evaluation on ``eval``, ``OUT/best``), and the
result is an ordinary task folder (``OUT/model``, ``OUT/best``) for ``lmforge evaluate`` and ``predict``.
``OUT/distill.yaml`` records the settings, for ``--resume``.

Example (a sketch: it trains)::

    cfg = TrainConfig(out="runs/distil-rt", max_steps=500, batch_size=16, lr=5e-5)
    distill_task(cfg, DistillConfig(teacher="runs/rt/best", train="rt-sentiment:train", eval="rt-sentiment:dev"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from lmforge import checkpoint
from lmforge.config import ConfigError
from lmforge.distillation.config import SETTINGS_FILE, DistillConfig
from lmforge.distillation.losses import task_distillation_loss
from lmforge.distillation.student import (
    check_pairing,
    check_vocabularies,
    describe_init,
    init_from_teacher,
    is_folder,
    student_overrides,
    teacher_folder,
)
from lmforge.errors import UserInputError
from lmforge.models import Transformer
from lmforge.tasks.finetune import FinetuneResult, finetune
from lmforge.tasks.model import TaskOutput, load_task_model, read_task_meta, strip_lm_head
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import Tokenizer
from lmforge.training import distributed
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import model_config_for
from lmforge.training.state import seed_all
from lmforge.training.trainer import check_fresh_run
from lmforge.utils.io import atomic_write_text

TASKS = ("classify",)  # soft labels over classes


class TaskDistillation:
    """The Trainer's ``loss`` for task distillation: ``alpha * T^2 KL + (1 - alpha) * CE(gold)``.

    Args:
        teacher: the fine-tuned teacher :class:`~lmforge.tasks.model.TaskModel` (put in eval mode, frozen), on
            the training device.
        alpha: weight of the soft-target term; 1 - alpha goes to the gold labels.
        temperature: T of the soft targets.
    """

    def __init__(self, teacher: torch.nn.Module, alpha: float, temperature: float) -> None:
        self.teacher = teacher.eval().requires_grad_(False)
        self.alpha, self.temperature = alpha, temperature

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutput:
        out = model(**batch)  # logits (B, C); loss: CE with the gold labels, a mean over the B examples
        if not self.alpha:
            return out
        with torch.no_grad():
            teacher_logits = self.teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits  # (B, C)
        loss = task_distillation_loss(out.logits, teacher_logits, out.loss, self.alpha, self.temperature)
        return TaskOutput(out.logits, loss, out.n_targets)


def _teacher_task(folder: Path) -> tuple[torch.nn.Module, TaskSpec, Tokenizer]:
    meta = read_task_meta(folder)
    if meta is None:
        raise UserInputError(f"--teacher {folder}: not a fine-tuned task folder (no task.json); task distillation "
                             "needs the folder `lmforge finetune` wrote, pre-training distillation takes --data")
    spec = TaskSpec.from_dict(meta["spec"], source=str(folder / "task.json"))
    if spec.task not in TASKS:
        raise UserInputError(f"--teacher {folder}: a {spec.task!r} model; task distillation takes "
                             f"{', '.join(TASKS)} teachers")
    if not (folder / checkpoint.TOKENIZER_FILE).is_file():
        raise UserInputError(f"--teacher {folder}: no {checkpoint.TOKENIZER_FILE}; the student needs the teacher's "
                             "tokenizer")
    return load_task_model(folder), spec, Tokenizer.load(folder)


def _student(distill: DistillConfig, teacher_config, tokenizer: Tokenizer, overrides: dict[str, Any],
             folder: Path) -> Transformer:
    """The student body, its LM head dropped (a task head replaces it)."""
    if is_folder(distill.student):
        body, tok = checkpoint.load_body(distill.student)
        check_vocabularies(teacher_config.vocab_size, body.config.vocab_size)
        if tok.sha256() != tokenizer.sha256():
            raise UserInputError(f"--student {distill.student}: its tokenizer is not the teacher's; the ids would "
                                 "mean other tokens to the two models")
        return strip_lm_head(body)
    spec = distill.student or str(folder / checkpoint.CONFIG_FILE)  # the teacher's config, resized
    cfg = model_config_for(spec, tokenizer, student_overrides(distill.student, teacher_config, overrides))
    check_vocabularies(teacher_config.vocab_size, cfg.vocab_size)
    return strip_lm_head(Transformer(cfg))


def task_pair(config: TrainConfig, distill: DistillConfig) -> tuple[Path, Path, Any, TaskSpec, Tokenizer,
                                                                          torch.nn.Module]:
    """The checked start of a task distillation: ``(out, teacher folder, teacher, its task spec, tokenizer,
    student body)``; the run folder is checked fresh (or resumable) before anything is built."""
    if not distill.teacher:
        raise ConfigError("missing the teacher: pass --teacher DIR")
    if not distill.train:
        raise ConfigError("task distillation needs training texts: pass --train FILE (or NAME:SPLIT)")
    config.require("out")
    out = Path(config.out)
    check_fresh_run(out, config.resume)
    folder = teacher_folder(distill.teacher)
    teacher, spec, tokenizer = _teacher_task(folder)
    seed_all(config.seed)  # a student built from a preset: the same weights in a run and in its resumption
    body = _student(distill, teacher.body.config, tokenizer, config.overrides, folder)
    return out, folder, teacher, spec, tokenizer, body


def distill_task(config: TrainConfig, distill: DistillConfig, *, log: Callable[[str], None] | None = None,
                 ) -> tuple[FinetuneResult, list[int] | None]:
    """Distil the task folder ``distill.teacher`` into a student on ``distill.train`` (see the module docstring).

    ``config.out`` is the run folder, ``config.overrides`` the student's ModelConfig overrides; the other
    TrainConfig settings drive the Trainer as in ``lmforge finetune``.

    Returns:
        ``(result, layers)``: finetune's result (``result.train.model_dir`` is the student's task folder) and
        the teacher layers the student was initialised from (None: not initialised from the teacher).
    """
    out, folder, teacher, spec, tokenizer, body = task_pair(config, distill)
    check_pairing(teacher.body.config, body.config)
    layers = None if is_folder(distill.student) else init_from_teacher(body, teacher.body)
    if log is not None:
        log(f"teacher {folder} ({teacher.body.config.n_layers} layers) -> student {body.config.n_layers} layers, "
            f"{describe_init(distill.student, layers)} | loss {distill.alpha:g} soft (T={distill.temperature:g}) "
            f"+ {1 - distill.alpha:g} gold")
    # The teacher reads the student's batches: inputs no longer than either model's context.
    spec = spec.replace(max_length=min(spec.max_length, teacher.body.config.max_seq_len))
    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)
    loss = TaskDistillation(teacher.to(ctx.device), distill.alpha, distill.temperature)
    settings = {"distill": distill.absolute(folder).to_dict(),
                "trainer": config.updated({"out": str(out.resolve())}).to_dict()}

    def write_settings() -> None:  # by the Trainer, once the run folder is checked and locked
        atomic_write_text(out / SETTINGS_FILE, yaml.safe_dump(settings, sort_keys=False))

    result = finetune(body, spec, distill.train, distill.eval, config=config, out=out, tokenizer=tokenizer,
                      epochs=distill.epochs, warmup_ratio=distill.warmup_ratio, log=log, on_start=write_settings,
                      loss=loss)
    return result, layers

