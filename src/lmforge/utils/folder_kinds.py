"""What a folder is, from its marker files, and a one-line refusal for a command that does not take it.

Every folder lmforge writes is recognisable by the files in it:

    kind        marker files                                          written by
    model       config.json + model.safetensors                       pretrain (RUN/model), checkpoint consolidate, save
    hf          config.json naming a ``model_type``                   Hugging Face, convert to-hf
    quantized   a model folder + quantization.json                    quantize
    bilm        config.json with ``arch: bilstm``                     pretrain --objective bilm (RUN/model)
    task        task.json + config.json (+ task_head.safetensors)     finetune (RUN/model, RUN/best)
    baseline    task.json + baseline.safetensors                      finetune --baseline (RUN/model)
    adapter     adapter_config.json                                   finetune --peft, peft export-hf
    index       index.json + embeddings.npy                           index build
    checkpoint  trainer_state.json, or a checkpoints/ folder          a training run's RUN/checkpoints/step-N
    experiment  experiment.json                                       experiment run
    quickstart  settings.json + stages/                               quickstart
    shards      manifest.json + train/                                data prepare
    tokenizer   tokenizer.json (or vocab.txt, vocab.json ...) alone   tokenizer train
    run         checkpoints/, or a model/ or best/ subfolder          pretrain, finetune, distill, align

:func:`folder_kind` names the kind of a path; :func:`require_kind` refuses a folder a command does not take in one
line that says what the folder is and which commands take it. The markers are the file names the writers use
(``tests/test_folder_kinds.py`` checks that they agree); this module reads names only, so every layer can ask.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text('{"arch": "bilstm"}')
    >>> folder_kind(folder)
    'bilm'
    >>> try:
    ...     require_kind(folder, ("model", "task"), "generate")
    ... except WrongFolderKind as exc:
    ...     print(str(exc).split(" is ")[1].split(";")[0])
    an ELMo biLM folder, which `lmforge generate` does not take
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from lmforge.errors import UserInputError

# The writers' file names (lmforge.model_folder, tasks.model, peft.io, models.quantize, evaluation.baselines,
# embeddings.index, training.state, experiments.report, quickstart.folder), spelled here so that any layer can
# classify a folder without importing the layers that write it.
CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
TASK, TASK_HEAD = "task.json", "task_head.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
QUANTIZATION = "quantization.json"
BASELINE_WEIGHTS, BASELINE_RUN = "baseline.safetensors", "baseline.json"
INDEX_META, INDEX_EMBEDDINGS = "index.json", "embeddings.npy"
TRAINER_STATE, CHECKPOINTS, LATEST = "trainer_state.json", "checkpoints", "latest"
EXPERIMENT = "experiment.json"
QUICKSTART_SETTINGS, QUICKSTART_STAGES = "settings.json", "stages"
MANIFEST = "manifest.json"
RUN_MODEL_DIRS = ("best", "model")
# Any of these makes a folder a tokenizer (Tokenizer.load reads each of them).
TOKENIZER_FILES = (TOKENIZER, "lmforge_tokenizer.json", "vocab.txt", "vocab.json", "encoder.json", "spiece.model")
BILM_ARCH = "bilstm"


@dataclass(frozen=True)
class Kind:
    """One folder kind: how a message names it, and the commands that take it."""

    label: str
    use: str


KINDS: dict[str, Kind] = {
    "model": Kind("a model folder", "`lmforge generate`, `embed`, `finetune --model`, `quantize`, `convert to-hf` "
                                    "or `serve`"),
    "hf": Kind("a Hugging Face model folder", "`lmforge convert from-hf`, or any command's --model"),
    "quantized": Kind("a quantised model folder (inference only)", "`lmforge generate`, `embed`, `serve`, `attention` "
                                                                   "or `fill-mask`; train from the full-precision folder"),
    "bilm": Kind("an ELMo biLM folder", "`lmforge probe`, `embed`, `neighbors`, `index build` or `finetune "
                                        "--baseline bilstm --features elmo=DIR`"),
    "task": Kind("a fine-tuned task folder", "`lmforge evaluate`, `predict` or `serve`"),
    "baseline": Kind("a baseline classifier folder (finetune --baseline)", "`lmforge evaluate` or `predict`"),
    "adapter": Kind("a PEFT adapter folder", "`lmforge peft info|merge|export-hf --adapter`"),
    "index": Kind("a retrieval index folder", "`lmforge index search` or `serve`"),
    "checkpoint": Kind("a training checkpoint", "`lmforge checkpoint consolidate` (to a model folder) or "
                                                "`checkpoint average`"),
    "experiment": Kind("an experiment folder", "`lmforge experiment report` or `cost`; its runs are in "
                                               "cells/CELL/seed-N/"),
    "quickstart": Kind("a quickstart folder", "`lmforge quickstart --out` (to resume it) or `cost`; its models are in "
                                              "runs/STAGE/model"),
    "shards": Kind("a folder of prepared data shards", "`lmforge pretrain --data` or `distill --data`; its tokenizer "
                                                       "is tokenizer/"),
    "tokenizer": Kind("a tokenizer folder", "`lmforge tokenizer encode`, `data prepare --tokenizer` or a training "
                                            "command's --tokenizer"),
    "run": Kind("a training run folder", "`lmforge pretrain|finetune --resume --out`, `cost` or `checkpoint "
                                         "consolidate`; its model is RUN/model once the run ends"),
}
# Kinds that are not what a command is meant to check: they pass through to the command's own error.
UNCHECKED = ("missing", "file", "unknown")

# The folder kinds of the models: what a command that reads a model accepts unless it says otherwise.
MODELS = ("model", "hf", "quantized", "task")
TRAINABLE = ("model", "hf", "task")  # a quantised folder is for inference only; a biLM is no Transformer


def adapter_kinds(path: str | Path) -> tuple[str, ...]:
    """What the PEFT commands take as ``--adapter``: an adapter folder, or a task model with an adapter in it."""
    return ("adapter", "task") if _has(Path(path), ADAPTER_CONFIG) else ("adapter",)


class WrongFolderKind(UserInputError):
    """A command was given a folder of a kind it does not take; the message says which kind and where it goes."""


def _config_of(path: Path) -> dict | None:
    try:
        data = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _has(path: Path, *names: str) -> bool:
    return any((path / name).exists() for name in names)


def folder_kind(path: str | Path) -> str:
    """The kind of ``path``: one of :data:`KINDS`, or ``missing`` (no such path), ``file`` or ``unknown``.

    Example:
        >>> folder_kind("no/such/folder")
        'missing'
    """
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "file"
    if _has(path, ADAPTER_CONFIG) and not _has(path, TASK):
        return "adapter"
    if _has(path, TASK):
        if _has(path, BASELINE_WEIGHTS):
            return "baseline"
        if _has(path, CONFIG, TASK_HEAD) or _has(path, ADAPTER_CONFIG):  # the latter: `finetune --peft` wrote it
            return "task"
    if _has(path, INDEX_META) and _has(path, INDEX_EMBEDDINGS):
        return "index"
    if _has(path, CONFIG) and (_has(path, WEIGHTS) or not _has(path, TRAINER_STATE)):
        config = _config_of(path) or {}
        if config.get("arch") == BILM_ARCH:
            return "bilm"
        if "model_type" in config:
            return "hf"
        return "quantized" if _has(path, QUANTIZATION) else "model"
    if _has(path, TRAINER_STATE) or _has(path, LATEST) or any(p.name.startswith("step-") for p in path.iterdir()):
        return "checkpoint"
    if _has(path, EXPERIMENT):
        return "experiment"
    if _has(path, QUICKSTART_SETTINGS) and (path / QUICKSTART_STAGES).is_dir():
        return "quickstart"
    if (path / CHECKPOINTS).is_dir() or any(folder_kind(path / name) not in UNCHECKED for name in RUN_MODEL_DIRS):
        return "run"
    if _has(path, MANIFEST) and (path / "train").is_dir():
        return "shards"
    if _has(path, *TOKENIZER_FILES):
        return "tokenizer"
    return "unknown"


def describe(path: str | Path, kind: str | None = None) -> str:
    """``"PATH is LABEL"``, e.g. ``runs/elmo/model is an ELMo biLM folder``."""
    kind = kind or folder_kind(path)
    return f"{path} is {KINDS[kind].label}" if kind in KINDS else f"{path}: {kind}"


def require_kind(path: str | Path, accepted: Iterable[str], command: str | None = None, flag: str | None = None) -> str:
    """The kind of ``path`` when ``command`` takes it, else :class:`WrongFolderKind` (one line, exit 2).

    A path that does not exist, a file and a folder of no known kind pass (the command's own check names what
    is missing), as do preset names.

    Args:
        accepted: the kinds of :data:`KINDS` the command takes.
        command: the command, as the message names it (``generate``, ``probe cloze``); None for a library call.
        flag: the argument that named the folder (``--model``), put before the path in the message.

    Raises:
        WrongFolderKind: e.g. ``runs/bilm/model is an ELMo biLM folder, which `lmforge generate` does not take; use
            it with `lmforge probe`, `embed`, `neighbors`, `index build` or ...``.
    """
    kind = folder_kind(path)
    accepted = tuple(accepted)
    unknown = [k for k in accepted if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown folder kind(s) {unknown}; known: {', '.join(KINDS)}")
    if kind in UNCHECKED or kind in accepted:
        return kind
    where = f"{flag} {path}" if flag else str(path)
    taken = f", which `lmforge {command}` does not take" if command else ""
    if kind == "run" and any(k in accepted for k in MODELS):
        model = next((Path(path) / name for name in RUN_MODEL_DIRS if folder_kind(Path(path) / name) in KINDS), None)
        if model is not None:
            raise WrongFolderKind(f"{where} is {KINDS[kind].label}{taken}; pass its model, {model}")
    raise WrongFolderKind(f"{where} is {KINDS[kind].label}{taken}; use it with {KINDS[kind].use}")
