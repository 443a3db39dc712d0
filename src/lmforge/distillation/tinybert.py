"""TinyBERT (Jiao et al. 2020): two-stage transformer distillation, both stages the one Trainer with a loss.

    stage 1, general   lmforge distill --method tinybert --teacher BERT --data SHARDS --out G
                       on pre-training text (the MLM batches of ``lmforge pretrain``): the intermediate
                       layers only, L = L_embd + sum_m (L_hidn + L_attn)     -> G/model, a model folder
    stage 2, task      lmforge distill --method tinybert --teacher FT --student G/model --train DATA --out T
                       on the task's (optionally augmented) training texts, as in the paper:
                       T/intermediate: the intermediate-layer loss again, the fine-tuned teacher's layers
                       T:              the prediction layer, L_pred = soft cross-entropy of the logits
                                                                             -> T/best, T/model: task folders

The losses and the layer map g(m) are in :mod:`lmforge.distillation.tinybert_losses`; the attention term reads
the scores before the softmax, which the model returns with ``output_attentions="scores"`` (the default SDPA
path is untouched when they are not asked for). The width projections ``W_e``, ``W_h`` (only when d_S != d_T)
train with the student: the Trainer trains a training-only wrapper (:class:`TinyBertStudent`, or
:class:`TinyBertTaskModel` in the task stage) whose checkpoints hold them, so ``--resume`` is exact, while the
folders written at the end hold the student alone. The task stage starts new projections: the general stage's
matched another teacher (the pre-trained one, not the fine-tuned one).

Data augmentation (``augment`` > 0, :mod:`lmforge.distillation.augmentation`) writes ``T/augmented.jsonl``
first (kept on ``--resume``), and both phases of the task stage train on it.

``--resume`` (``lmforge distill --out T --resume``) continues where the run stopped: the intermediate phase
from ``T/intermediate``'s checkpoints, or, once ``T/intermediate/model`` exists, the prediction phase.

Example:
    >>> import lmforge, torch
    >>> teacher = lmforge.build_model("bert-tiny", n_layers=4, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> student = lmforge.build_model("bert-tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=100)
    >>> wrapper = TinyBertStudent(student, WidthProjections(16, 32))
    >>> loss = IntermediateDistillation(teacher, uniform_layer_map(4, 2))
    >>> batch = {"input_ids": torch.randint(5, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    >>> out = loss(wrapper, batch)
    >>> sorted(out.metrics), out.n_targets
    (['attn', 'embd', 'hidn'], 14)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch import nn

from lmforge import checkpoint
from lmforge.config import ConfigError
from lmforge.distillation.augmentation import TinyBertCandidates, augment_table
from lmforge.distillation.config import SETTINGS_FILE, DistillConfig
from lmforge.distillation.pretraining import pretraining_pair
from lmforge.distillation.student import (
    check_pairing,
    init_from_teacher,
    teacher_folder,
)
from lmforge.distillation.task import task_pair
from lmforge.distillation.tinybert_losses import (
    WidthProjections,
    attention_score_mse,
    check_layer_map,
    parse_layer_map,
    soft_cross_entropy,
    state_mse,
    uniform_layer_map,
)
from lmforge.embeddings.static import words
from lmforge.errors import UserInputError
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import FinetuneResult, finetune
from lmforge.tasks.model import TaskModel, load_task_model
from lmforge.training import distributed
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import PretrainRun, build_pretraining
from lmforge.utils.io import atomic_write_text

INTERMEDIATE_DIR = "intermediate"  # the task stage's first phase, a run folder inside the task run's
AUGMENTED_FILE = "augmented.jsonl"
ARCHS = ("encoder", "decoder")  # one stack whose hidden states and attention scores are compared


@dataclass
class TinyBertOutput:
    """What the TinyBERT losses return to the Trainer: the loss (a mean over ``n_targets``), no logits (the
    intermediate loss has none to score), and each term, detached, as ``metrics`` (logged with the step)."""

    loss: torch.Tensor
    n_targets: int
    logits: torch.Tensor | None = None
    metrics: dict[str, float] | None = None


class TinyBertStudent(nn.Module):
    """The student and its width projections, trained together in general distillation; a finished run saves
    the student alone (:attr:`saved_model`)."""

    def __init__(self, model: nn.Module, projections: WidthProjections) -> None:
        super().__init__()
        self.model, self.projections = model, projections

    @property
    def config(self):
        return self.model.config

    @property
    def saved_model(self) -> nn.Module:
        return self.model

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def forward(self, **batch):
        return self.model(**batch)


class TinyBertTaskModel(TaskModel):
    """A :class:`~lmforge.tasks.model.TaskModel` that also holds the width projections of the task stage's
    intermediate phase: checkpoints keep them, the task folders (body and head) do not."""

    def __init__(self, task_model: TaskModel, projections: WidthProjections) -> None:
        super().__init__(task_model.body, task_model.head, task_model.spec)
        self.projections = projections


def layer_map(distill: DistillConfig, n_teacher: int, n_student: int) -> dict[int, int]:
    """``distill.layer_map`` checked against both stacks, or the paper's uniform map."""
    if distill.layer_map:
        return check_layer_map(parse_layer_map(distill.layer_map), n_teacher, n_student)
    return uniform_layer_map(n_teacher, n_student)


def check_tinybert_pairing(teacher_config, student_config) -> None:
    """One architecture of :data:`ARCHS`, and equal head counts (the attention loss compares head by head)."""
    check_pairing(teacher_config, student_config)
    if teacher_config.arch not in ARCHS:
        raise UserInputError(f"TinyBERT distils encoders or decoders; the teacher is an {teacher_config.arch} model")
    if teacher_config.n_heads != student_config.n_heads:
        raise UserInputError(f"the attention loss compares the teacher's {teacher_config.n_heads} heads with the "
                             f"student's {student_config.n_heads} one by one: give the student "
                             f"--override n_heads={teacher_config.n_heads}")


def _inputs(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if batch.get(k) is not None}


def _real(batch: dict[str, Any]) -> torch.Tensor:
    mask = batch.get("attention_mask")
    return mask.bool() if mask is not None else torch.ones_like(batch["input_ids"], dtype=torch.bool)


def _layers(body: nn.Module, inputs: dict[str, Any]):
    """Every hidden state (embeddings first) and every layer's attention scores of one forward."""
    return body(**inputs, output_hidden_states=True, output_attentions="scores", logits_to_keep=1)


def intermediate_terms(s, t, mapping: dict[int, int], projections: WidthProjections,
                       real: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``{"embd", "hidn", "attn"}`` of a student and a teacher forward (``_layers`` outputs), summed over the
    mapped layers; ``real`` (B, T) marks the tokens that count."""
    terms: dict[str, torch.Tensor] = {}

    def add(name: str, value: torch.Tensor) -> None:
        terms[name] = terms[name] + value if name in terms else value

    for m, n in mapping.items():
        if m == 0:
            add("embd", state_mse(projections.embedding(s.hidden_states[0]), t.hidden_states[0], real))
            continue
        add("hidn", state_mse(projections.hidden(s.hidden_states[m]), t.hidden_states[n], real))
        add("attn", attention_score_mse(s.attentions[m - 1], t.attentions[n - 1], real))
    return terms


class IntermediateDistillation:
    """The Trainer's ``loss`` of the intermediate layers: ``L_embd + sum_m (L_hidn + L_attn)``.

    Args:
        teacher: the frozen teacher's Transformer (or a TaskModel: its body is read), on the training device.
        mapping: student layer -> teacher layer (0: the embeddings), e.g. :func:`uniform_layer_map`.

    ``model`` is a :class:`TinyBertStudent` or a :class:`TinyBertTaskModel` (the student and its projections).
    Evaluation reports the same loss (``eval_loss``; its ``eval_ppl`` means nothing here).
    """

    def __init__(self, teacher: nn.Module, mapping: dict[int, int]) -> None:
        self.teacher = getattr(teacher, "body", teacher).eval().requires_grad_(False)
        self.mapping = dict(mapping)

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TinyBertOutput:
        body = model.body if isinstance(model, TaskModel) else model.model
        inputs, real = _inputs(batch), _real(batch)
        s = _layers(body, inputs)
        with torch.no_grad():
            t = _layers(self.teacher, inputs)
        terms = intermediate_terms(s, t, self.mapping, model.projections, real)
        loss = torch.stack(list(terms.values())).sum()
        return TinyBertOutput(loss, int(real.sum()), None, {k: float(v.detach()) for k, v in terms.items()})

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        """The terms are means over real tokens: micro-batches weigh by their share of them."""
        return int(_real(batch).sum())


class PredictionDistillation:
    """The Trainer's ``loss`` of the prediction layer: the soft cross-entropy of the student's class logits
    with the teacher's at temperature ``t`` (eq. 5), a mean over the examples; no gold labels, as in the paper.
    """

    def __init__(self, teacher: nn.Module, temperature: float = 1.0) -> None:
        self.teacher = teacher.eval().requires_grad_(False)
        self.temperature = temperature

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TinyBertOutput:
        inputs = _inputs(batch)
        z_s = model(**inputs).logits  # (B, C)
        with torch.no_grad():
            z_t = self.teacher(**inputs).logits  # (B, C)
        loss = soft_cross_entropy(z_s, z_t, self.temperature)
        return TinyBertOutput(loss, z_s.shape[0], z_s)

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["input_ids"].shape[0])


# ---------------------------------------------------------------------------------------- stage 1: general
def build_general_distillation(config: TrainConfig, distill: DistillConfig) -> tuple[PretrainRun, dict[int, int]]:
    """Assemble TinyBERT's general distillation on ``config.data`` (nothing trained or written yet).

    The teacher is a pre-trained model folder; the student (default: the teacher's config, half its layers)
    must have as many heads. Returns the run and the layer map used.
    """
    config, folder, teacher, student_config = pretraining_pair(config, distill)
    check_tinybert_pairing(teacher.config, student_config)
    mapping = layer_map(distill, teacher.config.n_layers, student_config.n_layers)

    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)
    loss = IntermediateDistillation(teacher.to(ctx.device), mapping)

    def wrap(model: nn.Module) -> TinyBertStudent:
        return TinyBertStudent(model, WidthProjections(model.config.d_model, teacher.config.d_model))

    saved = {"distill": distill.absolute(folder).to_dict()}
    run = build_pretraining(config, loss=loss, init=lambda model: init_from_teacher(model, teacher), wrap=wrap,
                            run_files={SETTINGS_FILE: yaml.safe_dump(saved, sort_keys=False)})
    return run, mapping


# ---------------------------------------------------------------------------------------- stage 2: task
def augmented_training_data(distill: DistillConfig, spec, tokenizer, out: Path, seed: int,
                            log: Callable[[str], None] | None = None) -> str:
    """``distill.train`` with ``distill.augment`` copies per example, written once to ``OUT/augmented.jsonl``
    (reused when it exists: a resumed run trains on the same copies). Returns the file to train on."""
    file = out / AUGMENTED_FILE
    if file.is_file():
        return str(file)
    if not distill.augment_model:
        raise ConfigError("augment > 0 needs --augment-model DIR: a pre-trained MLM model folder (the teacher's "
                          "tokenizer) that proposes the replacement words")
    mlm_folder = teacher_folder(distill.augment_model)
    mlm = checkpoint.load(mlm_folder)
    if getattr(mlm.config, "head", "none") not in ("mlm", "lm"):
        raise UserInputError(f"--augment-model {distill.augment_model}: the model has no MLM head to propose words")
    checkpoint.check_tokenizer(mlm_folder, tokenizer, "the teacher's tokenizer")
    table = read_table(distill.train)
    columns = [c for role, c in spec.columns().items() if role in ("text", "text_pair") and c in table.columns]
    sentences = [words(str(row[c])) for row in table.rows for c in columns if row.get(c) is not None]
    propose = TinyBertCandidates(mlm, tokenizer, sentences, k=distill.augment_k)
    augmented = augment_table(table, columns, distill.augment, propose, p=distill.augment_p, seed=seed)
    atomic_write_text(file, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in augmented.rows))
    if log is not None:
        log(f"augmented {len(table)} examples x{distill.augment} -> {len(augmented)} rows in {file}")
    return str(file)


def distill_task_tinybert(config: TrainConfig, distill: DistillConfig, *, log: Callable[[str], None] | None = None,
                          ) -> FinetuneResult:
    """TinyBERT's task distillation of the task folder ``distill.teacher`` (see the module docstring).

    Returns the prediction phase's result (``OUT/best``, ``OUT/model``), or the intermediate phase's when a
    signal stopped it (its ``train.stopped_by``; resume with the same ``OUT``).
    """
    out, folder, teacher, spec, tokenizer, body = task_pair(config, distill)
    check_tinybert_pairing(teacher.body.config, body.config)
    mapping = layer_map(distill, teacher.body.config.n_layers, body.config.n_layers)
    spec = spec.replace(max_length=min(spec.max_length, teacher.body.config.max_seq_len))
    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)
    teacher = teacher.to(ctx.device)
    settings = {"distill": distill.absolute(folder).to_dict(),
                "trainer": config.updated({"out": str(out.resolve())}).to_dict()}

    def write_settings() -> None:  # once a Trainer has checked and locked its run folder
        atomic_write_text(out / SETTINGS_FILE, yaml.safe_dump(settings, sort_keys=False))

    train = distill.train
    if distill.augment:
        out.mkdir(parents=True, exist_ok=True)
        write_settings()
        train = augmented_training_data(distill, spec, tokenizer, out, config.seed, log)
    if log is not None:
        log(f"teacher {folder} ({teacher.body.config.n_layers} layers, d={teacher.body.config.d_model}) -> student "
            f"{body.config.n_layers} layers, d={body.config.d_model} | layer map "
            f"{','.join(f'{m}:{n}' for m, n in mapping.items())} | intermediate layers, then the prediction layer "
            f"(T={distill.temperature:g})")

    first = out / INTERMEDIATE_DIR
    if not (first / "model" / checkpoint.CONFIG_FILE).is_file():
        d_t = teacher.body.config.d_model
        result = finetune(body, spec, train, None, config=config.updated({"out": str(first)}), out=first,
                          tokenizer=tokenizer, epochs=distill.intermediate_epochs or distill.epochs,
                          warmup_ratio=distill.warmup_ratio, log=log, on_start=write_settings,
                          loss=IntermediateDistillation(teacher, mapping),
                          wrap=lambda tm: TinyBertTaskModel(tm, WidthProjections(tm.body.config.d_model, d_t)))
        if result.train.stopped_by in ("SIGINT", "SIGTERM"):
            return result
    body = load_task_model(first / "model").body  # the head of that phase never trained: a fresh one follows
    return finetune(body, spec, train, distill.eval, config=config, out=out, tokenizer=tokenizer,
                    epochs=distill.epochs, warmup_ratio=distill.warmup_ratio, log=log, on_start=write_settings,
                    loss=PredictionDistillation(teacher, distill.temperature))
