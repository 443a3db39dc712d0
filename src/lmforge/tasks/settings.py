"""The settings of a fine-tuning run: flags merged over a resumed run's ``OUT/finetune.yaml`` and the defaults.

A run's settings are plain data in five groups, the shape ``OUT/finetune.yaml`` holds::

    model, tokenizer, random_init, train, eval, out    what to fine-tune on what, and where
    eval_sets   further evaluation sets {NAME: FILE} (out-of-domain), reported as eval_<NAME>_<metric>
    task      TaskSpec fields (task, columns, prefixes, label_map, mixture ...)
    recipe    Recipe fields, plus epochs and warmup_ratio (they set max_steps and warmup)
    trainer   TrainConfig fields (fine-tuning changes some defaults: FINETUNE_DEFAULTS)
    peft      PeftConfig fields, or None for full fine-tuning;  merge: fold the adapter in afterwards

:func:`finetune_settings` builds them from the flags (a dict of the parsed flags, absent ones left out), so
``lmforge finetune --out runs/x --resume`` continues a run with what it was started with.

Example:
    >>> settings = finetune_settings({"model": "gpt-tiny", "task": "classify", "train": "rt-sentiment:train",
    ...                               "out": "runs/rt", "lr": 1e-4, "epochs": 0.5})
    >>> settings["trainer"]["lr"], settings["trainer"]["batch_size"], settings["recipe"]
    (0.0001, 16, {'epochs': 0.5})
    >>> parse_label_map("0=negative,1=positive")
    {'0': 'negative', '1': 'positive'}
    >>> parse_eval_sets(["reviews=rt-sentiment:test", "news=news.tsv"], check_files=False)
    {'reviews': 'rt-sentiment:test', 'news': 'news.tsv'}
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from lmforge.config import ConfigError
from lmforge.datasets import benchmarks
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.peft.config import MERGEABLE, PeftConfig
from lmforge.tasks import columnar
from lmforge.training.config import TrainConfig
from lmforge.training.resume_settings import record_resume, refuse_trajectory_changes
from lmforge.utils.flags import split_key_value
from lmforge.utils.io import atomic_write_text, read_mapping_file

SETTINGS_FILE = "finetune.yaml"
# Trainer flags shared with `lmforge pretrain`; fine-tuning changes some defaults.
TRAINER_KEYS = ("max_steps", "batch_size", "grad_accum", "lr", "warmup", "schedule", "min_lr_ratio", "weight_decay",
                "grad_clip", "label_smoothing", "cut_frac", "stlr_ratio", "eval_every", "save_every",
                "keep_checkpoints", "final_checkpoint", "precision", "compile", "activation_checkpointing", "device",
                "seed", "resume", "progress", "tensorboard")
FINETUNE_DEFAULTS = {"lr": 5e-5, "schedule": "linear", "max_steps": 1000, "batch_size": 16, "eval_every": 100,
                     "save_every": 500, "weight_decay": 0.01}
# TaskSpec fields that are flags of their own (label_map and mixture are parsed from text or a file).
TASK_KEYS = ("text_column", "text_pair_column", "label_column", "target_column", "task_prefix", "pair_prefix",
             "label_separator", "pooling", "classifier_dropout", "head_bilstm", "head_bilstm_hidden", "max_length",
             "max_target_length", "max_answer_length", "null_threshold", "mixing_cap", "mixing_temperature", "loss_average",
             "input_transform")
RECIPE_KEYS = ("layer_decay", "unfreeze_every", "freeze_body", "metric", "eval_limit", "eval_batch_size", "epochs",
               "warmup_ratio", "bucket")
PEFT_FLAGS = ("peft", "peft_option", "peft_config")
EVAL_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")  # no "_": eval_<NAME>_<metric> stays readable
TASK_NAMES = ("classify, regress, multilabel, tag, qa, multiple-choice, seq2seq, text2text, reward, instruct "
              "or embedding")


def parse_label_map(value: str | None) -> dict[str, str]:
    """``"0=negative,1=positive"``, a JSON object, or a .json/.yaml file -> {label: word}."""
    if not value:
        return {}
    path = Path(value)
    if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
        data = read_mapping_file(path, "label map", yaml_always=True)
    elif value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"--label-map {value!r}: not valid JSON ({exc})") from exc
    else:
        data = {}
        for pair in value.split(","):
            try:
                label, word = split_key_value(pair, "--label-map", "0=negative,1=positive")
            except UserInputError:
                label = word = ""
            if not label or not word:
                raise UserInputError(f"--label-map {value!r}: expected LABEL=WORD pairs, e.g. 0=negative,1=positive")
            data[label] = word
    if not isinstance(data, dict):
        raise UserInputError(f"--label-map {value!r}: expected a mapping of label to word")
    return {str(k): str(v) for k, v in data.items()}


def parse_eval_sets(value, check_files: bool = True) -> dict[str, str]:
    """Further evaluation sets: ``["NAME=FILE", ...]`` (``--eval-set``, repeatable) or a mapping {NAME: FILE}
    -> {NAME: FILE}. A name is letters, digits, ``.`` and ``-``; a file is a data file or ``NAME:SPLIT``.

    Raises:
        UserInputError: a malformed entry, a bad or repeated name; InputFileNotFound: a file that does not exist.
    """
    if not value:
        return {}
    if isinstance(value, dict):
        entries = [(str(k), "" if v is None else str(v), f"{k}={v}") for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        entries = []
        for text in value:
            name, sep, file = str(text).partition("=")
            entries.append((name.strip(), file.strip() if sep else "", str(text)))
    else:
        raise UserInputError(f"--eval-set {value!r}: expected NAME=FILE entries (or a mapping of name to file)")
    sets: dict[str, str] = {}
    for name, file, text in entries:
        if not name or not file:
            raise UserInputError(f"--eval-set {text!r}: expected NAME=FILE, e.g. --eval-set news=news_dev.tsv")
        if not EVAL_SET_NAME.match(name):
            raise UserInputError(f"--eval-set {text!r}: the name {name!r} may hold letters, digits, '.' and '-' "
                                 "(it becomes part of the metric names eval_<NAME>_<metric>)")
        if name in sets:
            raise UserInputError(f"--eval-set {text!r}: the name {name!r} is given twice; give each set its own name")
        path = Path(file)
        dataset = not path.exists() and ":" in file and ("/" not in file and "\\" not in file  # NAME:SPLIT
                                                         or file.partition(":")[0] in benchmarks.LAYOUTS)
        if check_files and not dataset and not path.is_file() and columnar.parse(file) is None:
            raise InputFileNotFound(f"--eval-set {text}: {file}: no such data file")
        sets[name] = file
    return sets


def read_mixture(path: str | None) -> list[dict]:
    """The task entries of a text2text mixture file; relative data files are taken relative to it."""
    if not path:
        return []
    file = Path(path)
    if not file.is_file():
        raise InputFileNotFound(f"{file}: no such mixture file")
    data = read_mapping_file(file, "mixture", yaml_always=True)
    entries = data.get("tasks") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise UserInputError(f"{file}: expected a list of tasks (each with name, train, columns, task_prefix ...)")
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("label_map") or {}, dict) \
                or not all(isinstance(entry.get(key) or "", str) for key in ("train", "eval")):
            raise UserInputError(f"{file}: task {i}: expected a mapping with file names as train/eval and a mapping "
                                 "as label_map")
        if "label_map" in entry:
            entry["label_map"] = {str(k): str(v) for k, v in (entry["label_map"] or {}).items()}
        for key in ("train", "eval"):
            if isinstance(entry, dict) and entry.get(key) and not Path(entry[key]).is_absolute() \
                    and (file.parent / entry[key]).exists():
                entry[key] = str(file.parent / entry[key])
    return entries


def peft_option(text: str) -> tuple[str, object]:
    """``"r=16"`` -> ("r", 16): the value converted to the PeftConfig field's type (targets: comma-separated)."""
    key, raw = split_key_value(text, "--peft-option", "r=16 or targets=q,v")
    key = key.replace("-", "_")
    defaults = {f.name: f.default for f in dataclasses.fields(PeftConfig)}
    if key == "method":
        raise UserInputError("--peft-option method: name the method with --peft METHOD")
    if key not in defaults:
        raise UserInputError(f"--peft-option {key}: not a PEFT option (options: "
                             f"{', '.join(k for k in defaults if k != 'method')})")
    default = defaults[key]
    try:
        if key == "targets":
            return key, [t.strip() for t in raw.split(",") if t.strip()]
        if isinstance(default, bool):
            return key, {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}[raw.lower()]
        if isinstance(default, (int, float)):
            return key, type(default)(raw)
    except (KeyError, ValueError):
        kind = ("true or false" if isinstance(default, bool) else "an integer" if isinstance(default, int)
                else "a number")
        raise UserInputError(f"--peft-option {text!r}: {key} must be {kind}") from None
    return key, raw


def peft_settings(given: dict, saved: dict | None, resuming: bool) -> dict | None:
    """The PeftConfig of the run as a dict (None: full fine-tuning), from --peft-config, --peft and --peft-option;
    a resumed run keeps its own and refuses different ones."""
    if not any(given.get(k) for k in PEFT_FLAGS):
        return saved
    fields = {}
    if given.get("peft_config"):
        try:
            fields = PeftConfig.load(given["peft_config"]).options()
        except ConfigError as exc:
            raise UserInputError(f"--peft-config: {exc}") from exc
    if given.get("peft"):
        fields["method"] = given["peft"]
    if "method" not in fields:
        raise UserInputError("--peft-option needs --peft METHOD (or a --peft-config file naming the method)")
    fields.update(peft_option(text) for text in given.get("peft_option") or [])
    try:
        cfg = PeftConfig.from_dict(fields).to_dict()
    except ConfigError as exc:
        raise UserInputError(f"--peft {fields['method']}: {str(exc).removeprefix('PeftConfig: ')}") from exc
    if resuming and cfg != saved:
        what = f"PEFT settings {PeftConfig.from_dict(saved).options()}" if saved else "full fine-tuning"
        raise UserInputError(f"--peft: this run was started with {what}; resume it without --peft/--peft-option/"
                             "--peft-config, or with the same settings")
    return cfg


def check_merge(peft: dict | None) -> None:
    """Refuse --merge without a PEFT method whose adapter folds into the weights."""
    if not peft:
        raise UserInputError("--merge folds a PEFT adapter into the model; it needs --peft")
    if peft["method"] not in MERGEABLE:
        raise UserInputError(f"--merge: a {peft['method']} adapter cannot be folded into the weights (only "
                             f"{', '.join(MERGEABLE)} can)")


def read_saved_settings(out: str | Path) -> dict[str, Any]:
    """The settings a run in ``out`` was started with (``{}`` if it holds none)."""
    path = Path(out) / SETTINGS_FILE
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


def save_settings(settings: dict[str, Any]) -> Path:
    """Write ``OUT/finetune.yaml`` (atomically), so that ``--resume`` can continue with the same settings."""
    path = Path(settings["out"]) / SETTINGS_FILE
    if settings["trainer"].get("resume") and path.is_file():  # what this resume changed joins the run's history
        record_resume(settings["out"], read_saved_settings(settings["out"]), dict(settings))
    atomic_write_text(path, yaml.safe_dump(dict(settings), sort_keys=False))
    return path


def finetune_settings(given: dict[str, Any]) -> dict[str, Any]:
    """Every setting of the run as plain data (what OUT/finetune.yaml holds): ``given`` (the flags; None or
    absent = not given) over the resumed run's saved settings over the defaults."""
    saved = read_saved_settings(given["out"]) if given.get("resume") and given.get("out") else {}
    settings = {"model": None, "tokenizer": None, "random_init": False, "train": None, "eval": None,
                "eval_sets": {}, "out": None, "task": {}, "recipe": {}, "trainer": dict(FINETUNE_DEFAULTS),
                "peft": None, "merge": False, **saved}
    for key in ("model", "tokenizer", "train", "eval", "out"):
        if given.get(key) is not None:
            settings[key] = given[key]
    if given.get("eval_sets"):
        settings["eval_sets"] = parse_eval_sets(given["eval_sets"])
    if given.get("random_init"):
        settings["random_init"] = True
    task = dict(settings["task"])
    if given.get("task"):
        task["task"] = given["task"]
    task.update({key: given[key] for key in TASK_KEYS if given.get(key) is not None})
    if given.get("label_map") is not None:
        task["label_map"] = parse_label_map(given["label_map"])
    if given.get("mixture") is not None:
        task["mixture"] = read_mixture(given["mixture"])
    settings["task"] = task
    settings["recipe"] = {**settings["recipe"],
                          **{k: given[k] for k in RECIPE_KEYS if given.get(k) is not None and given[k] is not False}}
    settings["trainer"] = {**settings["trainer"], **{k: given[k] for k in TRAINER_KEYS if k in given}}
    settings["peft"] = peft_settings(given, settings["peft"], bool(saved))
    if given.get("merge"):
        settings["merge"] = True
    if settings["merge"]:
        check_merge(settings["peft"])
    if given.get("resume") and settings["out"] and not saved and not settings["model"]:
        out = Path(settings["out"])
        if not out.exists():
            raise InputFileNotFound(f"--out {out}: no such folder, so there is no run to resume; check the path, "
                                    "or start a run there without --resume")
        raise UserInputError(f"--out {out}: holds no run to resume (no {SETTINGS_FILE}); check the path, or start "
                             "a run there without --resume")
    for key, flag in (("model", "--model"), ("out", "--out")):
        if not settings[key]:
            raise UserInputError(f"missing {flag}")
    if not task.get("task"):
        raise UserInputError(f"missing --task ({TASK_NAMES})")
    if not settings["train"] and not task.get("mixture"):
        raise UserInputError("missing --train FILE (or --mixture FILE for a text2text mixture)")
    if settings["eval_sets"] and task.get("mixture"):
        raise UserInputError("--eval-set: a mixture evaluates each of its tasks on its own eval file; give the "
                             "further sets as mixture tasks instead")
    if saved:
        # A trainer setting the run left at its default is saved without it: compare the values it ran with.
        defaults = {k: v for k, v in TrainConfig().to_dict().items() if k in TRAINER_KEYS}
        refuse_trajectory_changes(settings["out"], {**saved, "trainer": {**defaults, **saved.get("trainer", {})}},
                                  {**settings, "trainer": {**defaults, **settings["trainer"]}}, "finetune")
    return settings
