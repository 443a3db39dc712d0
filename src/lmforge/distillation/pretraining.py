"""Pre-training distillation, DistilBERT-style (Sanh et al. 2019): a smaller student learns, on the teacher's
own pre-training data and objective, to match the teacher's output distribution and hidden states.

    batch = objective(raw)                   the MLM (or causal LM) batch of ``lmforge pretrain``, unchanged
    s = student(batch), t = teacher(batch)   teacher: frozen, eval mode, no gradient
    L = alpha_ce  * T^2 KL(softmax(t/T) || softmax(s/T))    at every real token
      + alpha_mlm * CE(s, labels)                            at the objective's targets (masked tokens)
      + alpha_cos * (1 - cos(h_s, h_t))                      last hidden states, at every real token

(:mod:`lmforge.distillation.losses`; DistilBERT's weights 5, 2, 1 and T = 2 are the defaults.) The student is
initialised from every other teacher layer (:mod:`lmforge.distillation.student`).

It is :func:`lmforge.training.pretrain.build_pretraining` with a Trainer ``loss``: the same tokenizer checks,
shards, objective, checkpoints with exact resume, bf16 autocast, DDP under torchrun, ``metrics.jsonl``; the
run folder gains ``distill.yaml`` (these settings, for ``--resume``), and ``OUT/model`` is an ordinary model
folder (``lmforge.load``, ``lmforge finetune --model``). The logged ``loss`` is L above, a mean over real
tokens; evaluation scores the student alone, so ``eval_loss``/``eval_ppl``/``eval_accuracy`` are its own MLM
numbers, comparable with the teacher's and with a ``lmforge pretrain`` run.

Example (a sketch: it trains)::

    cfg = TrainConfig(objective="mlm", data="data/corpus", out="runs/distil", max_steps=1000)
    distill_pretraining(cfg, DistillConfig(teacher="runs/bert/model"))   # student: half the teacher's layers
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from lmforge import checkpoint
from lmforge.config import ConfigError, ModelConfig
from lmforge.distillation.config import SETTINGS_FILE, DistillConfig
from lmforge.distillation.losses import cosine_embedding_loss, soft_target_kl, weighted_sum
from lmforge.distillation.student import (
    check_pairing,
    check_vocabularies,
    init_from_teacher,
    is_folder,
    student_overrides,
    teacher_folder,
)
from lmforge.errors import UserInputError
from lmforge.nn.loss import cross_entropy
from lmforge.objectives import check_architecture
from lmforge.objectives.base import IGNORE_INDEX
from lmforge.tasks.model import read_task_meta
from lmforge.training import distributed
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import PretrainRun, build_pretraining, load_tokenizer, model_config_for
from lmforge.training.trainer import TrainResult

OBJECTIVES = ("mlm", "clm")  # one model, logits at every position: encoder MLM or decoder next-token


@dataclass
class DistillOutput:
    """What :class:`PretrainingDistillation` returns to the Trainer: the loss (a mean over ``n_targets``),
    the student's logits at the labelled positions (for evaluation's accuracy), and each term, detached."""

    loss: torch.Tensor
    n_targets: int
    logits: torch.Tensor | None = None
    terms: dict[str, float] | None = None


class PretrainingDistillation:
    """The Trainer's ``loss`` for pre-training distillation (see the module docstring).

    Args:
        teacher: the frozen teacher (put in eval mode, its parameters stop requiring gradients), on the
            training device.
        weights: ``{"ce": alpha_ce, "mlm": alpha_mlm, "cos": alpha_cos}``.
        temperature: T of the soft targets.
    """

    def __init__(self, teacher: torch.nn.Module, weights: dict[str, float], temperature: float) -> None:
        self.teacher = teacher.eval().requires_grad_(False)
        self.weights, self.temperature = dict(weights), temperature

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> DistillOutput:
        labels = batch["labels"]
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        s = model(**inputs)  # logits (B, T, V), last_hidden_state (B, T, D)
        targets = labels != IGNORE_INDEX  # (B, T)
        s_at_labels = s.logits[targets]  # (N, V)
        own = cross_entropy(s_at_labels, labels[targets])
        if not model.training:  # evaluation scores the student alone (its own objective)
            return DistillOutput(own, int(targets.sum()), s_at_labels)
        real = self._real(batch)  # (B, T)
        terms = {"mlm": own}
        if self.weights["ce"] or self.weights["cos"]:
            with torch.no_grad():
                t = self.teacher(**inputs)
            if self.weights["ce"]:
                terms["ce"] = soft_target_kl(s.logits[real], t.logits[real], self.temperature)
            if self.weights["cos"]:
                terms["cos"] = cosine_embedding_loss(s.last_hidden_state[real], t.last_hidden_state[real])
        loss = weighted_sum(terms, self.weights)
        return DistillOutput(loss, int(real.sum()), s_at_labels, {k: float(v.detach()) for k, v in terms.items()})

    @staticmethod
    def _real(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = batch.get("attention_mask")
        return mask.bool() if mask is not None else torch.ones_like(batch["input_ids"], dtype=torch.bool)

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        """The loss is a mean over real tokens (the KL and cosine terms' positions): count those, so that
        accumulated micro-batches weigh by their share of them."""
        return int(self._real(batch).sum())


def _teacher_for_pretraining(folder: Path):
    if read_task_meta(folder) is not None:
        raise UserInputError(f"--teacher {folder}: a fine-tuned task folder; pre-training distillation (--data) "
                             "needs a pre-trained model folder, task distillation takes --train")
    teacher = checkpoint.load(folder)
    if getattr(teacher.config, "head", "none") == "none":
        raise UserInputError(f"--teacher {folder}: the model has no LM/MLM head, so it has no output "
                             "distribution to distil; give a pre-trained model folder")
    return teacher


def pretraining_pair(config: TrainConfig, distill: DistillConfig,
                     ) -> tuple[TrainConfig, Path, torch.nn.Module, ModelConfig]:
    """The teacher and the student's config of a distillation on pre-training shards, checked against each
    other and the data: ``(config, teacher folder, teacher, student config)``, the config now naming the
    student as its model and the objective (default: the teacher's, ``clm`` for a decoder, else ``mlm``)."""
    if not distill.teacher:
        raise ConfigError("missing the teacher: pass --teacher DIR")
    folder = teacher_folder(distill.teacher)
    config.require("data", "out")
    teacher = _teacher_for_pretraining(folder)
    objective = config.objective or ("clm" if teacher.config.arch == "decoder" else "mlm")
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective={objective!r}: distillation takes {' or '.join(OBJECTIVES)}")
    check_architecture(objective, teacher.config.arch)
    tokenizer = load_tokenizer(config)
    checkpoint.check_tokenizer(folder, tokenizer, f"the tokenizer of {config.data}")
    student = distill.student or str(folder / checkpoint.CONFIG_FILE)  # the teacher's config, resized
    overrides = student_overrides(distill.student, teacher.config, config.overrides)
    if not is_folder(student):
        config = config.updated({"overrides": overrides}, source="distillation")
    student_config = model_config_for(student, tokenizer, config.overrides)
    check_vocabularies(teacher.config.vocab_size, student_config.vocab_size)
    config = config.updated({"model": student, "objective": objective}, source="distillation")
    return config, folder, teacher, student_config


def build_distillation(config: TrainConfig, distill: DistillConfig) -> tuple[PretrainRun, list[int] | None]:
    """Check everything and assemble the run (nothing is trained, nothing written yet).

    ``distill.student`` is the student (None: the teacher's own config, see
    :mod:`lmforge.distillation.student`); ``config.objective`` defaults to the teacher's: ``clm`` for a
    decoder, else ``mlm``.

    Returns:
        ``(run, layers)``: the assembled :class:`~lmforge.training.pretrain.PretrainRun` and the teacher
        layers the student was initialised from (None: not initialised from the teacher).

    Raises:
        UserInputError: the teacher is no model folder, or teacher and student do not pair (vocabulary sizes,
            architecture, width for the cosine loss), or the data's tokenizer is not the teacher's.
    """
    config, folder, teacher, student_config = pretraining_pair(config, distill)
    check_pairing(teacher.config, student_config, distill.alpha_cos)

    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)
    loss = PretrainingDistillation(teacher.to(ctx.device), distill.loss_weights(), distill.temperature)
    layers: list[list[int] | None] = [None]

    def init(model) -> None:
        layers[0] = init_from_teacher(model, teacher)

    saved = {"distill": distill.absolute(folder).to_dict()}
    run = build_pretraining(config, loss=loss, init=init,
                            run_files={SETTINGS_FILE: yaml.safe_dump(saved, sort_keys=False)})
    return run, layers[0]


def distill_pretraining(config: TrainConfig, distill: DistillConfig) -> TrainResult:
    """Build the run (:func:`build_distillation`) and train it; under torchrun inside a
    :func:`~lmforge.training.distributed.session`."""
    with distributed.session(config.strategy, config.device, config.dist_timeout):
        return build_distillation(config, distill)[0].trainer.fit()

