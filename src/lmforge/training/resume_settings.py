"""Resume is exact or refused: a resumed run's settings are compared with the ones its folder saved.

A run folder records the settings its steps were trained with (``config.yaml`` of ``lmforge pretrain``,
``finetune.yaml`` of ``lmforge finetune``). ``--resume`` may change only the settings in :data:`RESUMABLE`:
they extend the run (``max_steps``), or change what is logged, evaluated, saved or where it runs, never the
update of one step. Any other difference (LR, schedule, batch, model, data, objective, seed, PEFT, lengths,
precision, ...) would make the folder's record describe steps it did not train, so it is refused in one line
that names each flag, before anything is written (:func:`refuse_trajectory_changes`). Each allowed change is
appended to ``OUT/history.jsonl`` (:func:`record_resume`), one JSON line per resume, so the saved settings
always say what the newest steps ran with and the history says what earlier ones did.

Settings are plain nested dicts; one level of nesting is compared key by key (``trainer.lr``,
``overrides.n_layers``), deeper values as a whole.

Example:
    >>> changes = setting_changes({"trainer": {"lr": 3e-05, "max_steps": 10}},
    ...                           {"trainer": {"lr": 1e-04, "max_steps": 20}})
    >>> changes
    {'trainer.lr': (3e-05, 0.0001), 'trainer.max_steps': (10, 20)}
    >>> trajectory_changes(changes)
    {'trainer.lr': (3e-05, 0.0001)}
    >>> describe(trajectory_changes(changes))
    '--lr: 3e-05 in the run, 0.0001 given'
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lmforge.errors import UserInputError
from lmforge.utils.io import atomic_write_text

HISTORY_FILE = "history.jsonl"
# Settings that leave every optimizer step's update as it was: how far the run goes, what it logs, evaluates
# and saves, where and how fast it runs, how its price is reckoned.
RESUMABLE = frozenset({
    "max_steps", "resume", "progress", "tensorboard", "eval_every", "eval_batches", "eval_limit", "eval_batch_size",
    "save_every", "keep_checkpoints", "final_checkpoint", "num_workers", "device", "dist_timeout",
    "max_nonfinite_steps", "region", "grid_intensity", "power_watts", "price_per_hour", "merge",
    "out",  # the folder resumed is the run, wherever it was copied or moved to
})
RESUMABLE_FLAGS = ("--max-steps (to extend the run), --eval-every, --eval-batches, --eval-limit, --eval-batch-size, "
                   "--save-every, --keep-checkpoints, --final-checkpoint, --progress, --tensorboard, --num-workers, "
                   "--device and the price settings")
PATH_KEYS = frozenset({"model", "tokenizer", "train", "eval", "data", "out"})
# Settings whose flag is not "--" + their name.
FLAGS = {"task.task": "--task", "peft": "--peft/--peft-option/--peft-config", "eval_sets": "--eval-set",
         "task.label_map": "--label-map", "task.mixture": "--mixture", "task.labels": "--task"}
NESTED_FLAGS = {"overrides": "--override", "objective_options": "--objective-option", "peft": "--peft-option"}
UNSET = object()


def _same(key: str, a: Any, b: Any) -> bool:
    if a == b:
        return True
    # A folder given relative to another working directory is the same folder.
    if key.rpartition(".")[2] in PATH_KEYS and isinstance(a, str) and isinstance(b, str):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return False


def setting_changes(saved: dict[str, Any], given: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, given value)}`` for every setting that differs; a key one side lacks has the
    value :data:`UNSET` there, and nested keys are dotted (``trainer.lr``)."""
    changes: dict[str, tuple[Any, Any]] = {}
    for key in dict.fromkeys([*saved, *given]):
        a, b = saved.get(key, UNSET), given.get(key, UNSET)
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in dict.fromkeys([*a, *b]):
                x, y = a.get(sub, UNSET), b.get(sub, UNSET)
                if not _same(sub, x, y):
                    changes[f"{key}.{sub}"] = (x, y)
        elif not _same(key, a, b):
            changes[key] = (a, b)
    return changes


def trajectory_changes(changes: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The part of ``changes`` that would change the run's trajectory (everything not in :data:`RESUMABLE`)."""
    return {k: v for k, v in changes.items() if k.rpartition(".")[2] not in RESUMABLE or k.partition(".")[0]
            in NESTED_FLAGS}


def flag_of(key: str) -> str:
    """The command-line flag of a (dotted) setting: ``trainer.lr`` -> ``--lr``, ``overrides.n_layers`` ->
    ``--override n_layers``."""
    if key in FLAGS:
        return FLAGS[key]
    head, _, leaf = key.partition(".")
    if leaf and head in NESTED_FLAGS:
        return f"{NESTED_FLAGS[head]} {leaf}"
    return "--" + (leaf or head).replace("_", "-")


def _shown(value: Any) -> str:
    if value is UNSET:
        return "the default"
    if value is None:
        return "unset"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """``--lr: 3e-05 in the run, 0.0001 given; ...``: each change on one line."""
    return "; ".join(f"{flag_of(k)}: {_shown(a)} in the run, {_shown(b)} given" for k, (a, b) in changes.items())


def refuse_trajectory_changes(out: str | Path, saved: dict[str, Any], given: dict[str, Any], command: str) -> None:
    """Raise UserInputError (one line, each difference with its flag) when resuming the run in ``out`` with
    ``given`` settings would train differently from the ``saved`` ones; nothing is written either way."""
    changed = trajectory_changes(setting_changes(saved, given))
    if changed:
        raise UserInputError(f"--out {out}: --resume continues the run with the settings it was trained with, and "
                             f"these differ: {describe(changed)}; drop those flags to resume, or start a new run "
                             f"in another --out (`lmforge {command} --help`, --resume: what may change)")


def record_resume(out: str | Path, saved: dict[str, Any], given: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Append the settings that changed from ``saved`` to ``given`` to ``OUT/history.jsonl`` (one JSON line:
    ``time``, ``changes`` {key: {"run": old, "given": new}}); returns them. No change, no line. The ``resume``
    flag itself is no change of the run."""
    changes = {k: v for k, v in setting_changes(saved, given).items() if k.rpartition(".")[2] != "resume"}
    if not changes:
        return changes
    path = Path(out) / HISTORY_FILE
    line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "changes": {k: {"run": None if a is UNSET else a, "given": None if b is UNSET else b}
                                   for k, (a, b) in changes.items()}}, sort_keys=True, default=str)
    before = path.read_text(encoding="utf-8") if path.is_file() else ""
    atomic_write_text(path, before + line + "\n")  # small, and appended whole: a crash keeps the old lines
    return changes
