"""The student: its architecture, its initialisation from the teacher, and the checks that pair the two.

DistilBERT (Sanh et al. 2019, section 3) keeps BERT's architecture, halves the number of layers, and
initialises the student "by taking one layer out of two" from the teacher, with the embeddings and the
output head copied as they are. Here student layer i takes teacher layer ``i * L_t // L_s``: for half the
layers that is teacher layers 0, 2, 4, ... (DistilBERT's own extraction script picked 0, 2, 4, 7, 9, 11 of
12; the rule here is the plain every-other one). Everything outside the layer stacks (embeddings, norms,
MLM/LM head) is copied under its own name.

That needs every student tensor to have the shape of the teacher tensor it comes from (same d_model,
heads, d_ff, vocabulary); :func:`init_from_teacher` copies nothing otherwise and says so.

    --student            architecture                                  weights
    (omitted)            the teacher's config, half its layers        every other teacher layer
    preset / config      the preset + --override (n_layers: half the  every other teacher layer, when the
                         teacher's unless overridden; vocab_size:      shapes allow; else random
                         the teacher's)
    model folder         the folder's                                  the folder's

Example:
    >>> import lmforge
    >>> teacher = lmforge.build_model("bert-tiny", n_layers=4, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> student = lmforge.build_model("bert-tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> init_from_teacher(student, teacher)
    [0, 2]
    >>> bool((student.encoder.layers[1].attn.q.weight == teacher.encoder.layers[2].attn.q.weight).all())
    True
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge import checkpoint
from lmforge.config import ConfigError
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.utils.folder_kinds import MODELS
from lmforge.utils.runs import model_folder

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def teacher_layers(n_teacher: int, n_student: int) -> list[int]:
    """Which teacher layer each student layer starts from: ``i * n_teacher // n_student`` (0, 2, 4, ... for half).

    Example:
        >>> teacher_layers(12, 6), teacher_layers(4, 2), teacher_layers(3, 3)
        ([0, 2, 4, 6, 8, 10], [0, 2], [0, 1, 2])
    """
    if not 0 < n_student <= n_teacher:
        raise ConfigError(f"the student has {n_student} layers; it must have between 1 and the teacher's "
                          f"{n_teacher}")
    return [i * n_teacher // n_student for i in range(n_student)]


def _stack_depths(names) -> dict[str, int]:
    """Layer count of each stack (``encoder.layers``, ``decoder.layers``, ...) named in ``names``."""
    depths: dict[str, int] = {}
    for name in names:
        m = _LAYER.search(name)
        if m:
            stack = name[:m.start(2)]
            depths[stack] = max(depths.get(stack, 0), int(m.group(2)) + 1)
    return depths


def init_from_teacher(student: nn.Module, teacher: nn.Module) -> list[int] | None:
    """Copy the teacher's weights into ``student`` (in place), layer i of each stack from teacher layer
    :func:`teacher_layers`\\ (L_t, L_s)[i] and every other tensor under its own name.

    Returns the teacher layers used, or None (and nothing is copied) when a student tensor has no teacher
    tensor of its shape to come from.
    """
    theirs = teacher.state_dict()
    mine = student.state_dict()
    t_depth, s_depth = _stack_depths(theirs), _stack_depths(mine)
    if set(t_depth) != set(s_depth) or any(s_depth[k] > t_depth[k] for k in s_depth):
        return None
    picks = {stack: teacher_layers(t_depth[stack], s_depth[stack]) for stack in s_depth}
    source: dict[str, str] = {}
    for name in mine:
        m = _LAYER.search(name)
        if m:
            stack = name[:m.start(2)]
            name_t = f"{stack}{picks[stack][int(m.group(2))]}{name[m.end(2):]}"
        else:
            name_t = name
        if name_t not in theirs or theirs[name_t].shape != mine[name].shape:
            return None
        source[name] = name_t
    with torch.no_grad():
        for name, name_t in source.items():
            mine[name].copy_(theirs[name_t])
    return next(iter(picks.values())) if picks else []


def describe_init(student: str | None, layers: list[int] | None) -> str:
    """How the student ``--student`` started, for a run's first log line: its folder's weights, or
    :func:`init_from_teacher`'s result (``layers``) in words.

    Example:
        >>> describe_init("bert-tiny", [0, 2]), describe_init(None, None)
        ('init from teacher layers 0, 2', "random init (shapes differ from the teacher's)")
    """
    if is_folder(student):
        return f"the weights of {student}"
    return ("random init (shapes differ from the teacher's)" if layers is None else
            f"init from teacher layers {', '.join(map(str, layers))}")


def teacher_folder(path: str | Path) -> Path:
    """The teacher's model or task folder: ``path`` itself, or a run folder's ``best/`` or ``model/``.

    Raises:
        InputFileNotFound: no such folder.
        UserInputError: the folder holds no lmforge model (no config.json and weights).
    """
    path = Path(path)
    if not path.exists():
        raise InputFileNotFound(f"--teacher {path}: no such folder")
    folder, _ = model_folder(path)
    checkpoint.require_kind(folder, MODELS, "distill", "--teacher")
    if not (folder / checkpoint.CONFIG_FILE).is_file() or not (folder / checkpoint.WEIGHTS_FILE).is_file():
        raise UserInputError(f"--teacher {path}: not a model or task folder (no {checkpoint.CONFIG_FILE} and "
                             f"{checkpoint.WEIGHTS_FILE}); give the folder `lmforge pretrain` or `lmforge finetune` "
                             "wrote (RUN/model, RUN/best) or its run folder")
    return folder


def is_folder(spec: str | None) -> bool:
    """Whether a ``--student`` value names a model folder (its weights are kept), not a preset or config file."""
    return spec is not None and (Path(spec) / checkpoint.WEIGHTS_FILE).is_file()


def student_overrides(spec: str | None, teacher_config, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` plus DistilBERT's defaults for a student without weights: half the teacher's layers
    (at least one) and the teacher's vocabulary, unless an override says otherwise. A folder keeps its own."""
    if is_folder(spec):
        return dict(overrides)
    return {"n_layers": max(1, teacher_config.n_layers // 2), "vocab_size": teacher_config.vocab_size,
            **overrides}


def check_vocabularies(teacher_vocab: int, student_vocab: int) -> None:
    """Soft targets compare distributions over the same ids: refuse students of another vocabulary size."""
    if teacher_vocab != student_vocab:
        raise UserInputError(f"the teacher's vocabulary has {teacher_vocab} ids but the student's {student_vocab}: "
                             "distillation compares their distributions id by id, so both need the same "
                             "vocabulary (and tokenizer)")


def check_pairing(teacher_config, student_config, alpha_cos: float = 0.0) -> None:
    """The same family (so that one batch is both models' input) and, for the cosine loss, the same width."""
    if teacher_config.arch != student_config.arch:
        raise UserInputError(f"the teacher is an {teacher_config.arch} model and the student an "
                             f"{student_config.arch} one: both must read the same inputs (one architecture)")
    if alpha_cos and teacher_config.d_model != student_config.d_model:
        raise UserInputError(f"the cosine loss compares hidden states, but the student's d_model "
                             f"({student_config.d_model}) differs from the teacher's ({teacher_config.d_model}): "
                             f"pass --alpha-cos 0, or --override d_model={teacher_config.d_model}")
