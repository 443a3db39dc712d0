"""Evaluate and predict with a task folder (``lmforge evaluate`` / ``lmforge predict``).

The folder's ``task.json`` says what the model does (or, for a folder converted from a Hugging Face sequence
classifier, its ``head.json``); column names (and a text2text model's prefix) may be
overridden for a file laid out differently from the training data. A plain LM folder can be evaluated on a
generative task (``seq2seq``/``text2text``) zero-shot by naming the task.

Predictions files, one entry per input row, in the row's order: every input column as it came (an ``id``,
the gold ``label`` if there is one), then the model's answer as ``prediction`` (the class, score, labels,
tags, answer span or output text) and what else the task reports as ``prediction_<name>``:

    .jsonl  {"id": "a7", "text": ..., "label": "1", "prediction": "1", "prediction_probabilities": {"0": 0.03, ...}}
    .tsv    the input columns, ``prediction``, ``prediction_probability`` (span/output tasks) and one
    .csv    ``prediction_prob_<label>`` column per class

An input column named ``prediction`` or ``prediction_...`` is refused, so that no input value is overwritten.

Example (a sketch: ``runs/rt/best`` is a task folder made by ``lmforge finetune``)::

    scores = evaluate("runs/rt/best", "rt-sentiment:test")
    round(scores["accuracy"], 3)  # 0.874
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from lmforge.tasks.data import Table, TaskDataError, read_table
from lmforge.tasks.model import hf_head, load_task_model, read_task_meta, save_task_model
from lmforge.tasks.registry import build_task
from lmforge.tasks.spec import GENERATIVE_TASKS, TaskSpec
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import atomic_write_text
from lmforge.utils.lock import remove_stale_temporaries
from lmforge.errors import InputFileNotFound, UserInputError

OVERRIDABLE = ("text_column", "text_pair_column", "label_column", "target_column", "task_prefix", "pair_prefix",
               "max_length", "max_target_length", "label_separator", "null_threshold")


def load(model_dir: str | Path, task: str | None = None, overrides: dict[str, Any] | None = None,
         device: str = "cpu"):
    """(model, Task, spec) for a task folder, or for a plain LM folder with a generative ``task``."""
    model_dir = Path(model_dir)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    bad = sorted(set(overrides) - set(OVERRIDABLE))
    if bad:
        raise UserInputError(f"cannot override {', '.join(bad)} at evaluation (only {', '.join(OVERRIDABLE)})")
    meta = read_task_meta(model_dir) if model_dir.is_dir() else None
    if meta is not None and "baseline" in meta:
        raise UserInputError(f"{model_dir}: a {meta['baseline'].get('name')} baseline's folder, not a model's; "
                             "`lmforge evaluate` and `predict` read it (lmforge.evaluation.baselines)")
    converted = hf_head(model_dir) if meta is None and model_dir.is_dir() else None
    if meta is not None or converted is not None:
        spec = TaskSpec.from_dict(meta["spec"], source=str(model_dir / "task.json")) if meta else converted[0]
        if task is not None and task != spec.task:
            raise UserInputError(f"{model_dir} was fine-tuned for task {spec.task!r}, not {task!r}")
    elif task in GENERATIVE_TASKS:
        spec = TaskSpec(task=task)
    elif not model_dir.is_dir():
        raise InputFileNotFound(f"{model_dir}: no such model folder")
    else:
        raise UserInputError(f"{model_dir}: not a fine-tuned task folder (no task.json); a plain model can only be "
                             f"evaluated on a generative task: --task {' or --task '.join(GENERATIVE_TASKS)}")
    if overrides:
        if spec.mixture and any(k.endswith("_column") or k == "task_prefix" for k in overrides):
            raise UserInputError("this model was trained on a mixture: choose the task with --subtask; its columns "
                                 "and prefix come from the mixture entry")
        spec = spec.replace(**overrides)
    model = load_task_model(model_dir, spec, device)
    if not (model_dir / "tokenizer.json").is_file():
        raise InputFileNotFound(f"{model_dir}: no tokenizer.json beside the model")
    tokenizer = Tokenizer.load(model_dir)
    return model, build_task(spec, tokenizer, model.body.config), spec


def _examples(task, table: Table, labelled: bool, subtask: str | None) -> list[dict[str, Any]]:
    if task.spec.task == "text2text":
        names = list(task.subs)
        name = subtask if subtask is not None else (names[0] if len(names) == 1 else None)
        if name is None:
            raise UserInputError(f"this model was trained on a mixture; choose a task with --subtask "
                                 f"({', '.join(names)})")
        return task.encode(table, labelled, name)
    if subtask:
        raise UserInputError("--subtask only applies to text2text mixtures")
    return task.encode(table, labelled)


def evaluate(model_dir: str | Path, data, *, task: str | None = None, overrides: dict[str, Any] | None = None,
             subtask: str | None = None, batch_size: int = 32, device: str = "cpu",
             limit: int | None = None) -> dict[str, float]:
    """Metrics of a task folder on labelled data (a file, ``NAME:SPLIT`` or a Table).

    Returns:
        ``{"loss": ..., <task metrics>..., "examples": N}``.
    """
    model, t, _ = load(model_dir, task, overrides, device)
    table = data if isinstance(data, Table) else read_table(data)
    examples = _examples(t, table, True, subtask)[:limit]
    _, scores = t.evaluate(model, examples, batch_size, device=device)
    return {**scores, "examples": len(examples)}


def tune_null_threshold(model_dir: str | Path, data, *, batch_size: int = 32, device: str = "cpu") -> dict[str, float]:
    """SQuAD 2.0: choose the no-answer threshold that maximises F1 on ``data`` (dev), as BERT did, and store
    it in the task folder (``spec.null_threshold``, rewritten atomically). Returns the scores of the search."""
    meta = read_task_meta(model_dir)
    if meta is None or meta.get("peft") or meta["spec"].get("task") != "qa":
        raise UserInputError(f"{model_dir}: --tune-null-threshold needs a fine-tuned qa task folder (not PEFT)")
    scores = evaluate(model_dir, data, batch_size=batch_size, device=device)
    if "best_f1_thresh" not in scores:
        raise UserInputError(f"{model_dir}: this qa model never answers 'no answer' (it was trained without "
                             "unanswerable rows); set --null-threshold at fine-tuning to use one")
    model = load_task_model(model_dir)
    model.spec = model.spec.replace(null_threshold=scores["best_f1_thresh"])
    extra = {k: v for k, v in meta.items() if k not in ("format", "version", "spec")}
    save_task_model(model, model_dir, Tokenizer.load(model_dir), extra={**extra, "null_threshold_tuned_on": str(data)})
    return scores


def predict(model_dir: str | Path, data, output: str | Path | None = None, *, task: str | None = None,
            overrides: dict[str, Any] | None = None, subtask: str | None = None, batch_size: int = 32,
            device: str = "cpu") -> list[dict[str, Any]]:
    """Predictions (with probabilities) for every row of ``data``; written to ``output`` when given."""
    model, t, _ = load(model_dir, task, overrides, device)
    table = data if isinstance(data, Table) else read_table(data)
    check_prediction_columns(table)  # before the model runs: a clash found after an hour of decoding is cruel
    examples = _examples(t, table, False, subtask)
    predictions, _ = t.evaluate(model, examples, batch_size, labelled=False, device=device)
    rows = [prediction_row(table.rows[ex["row"]], table.columns, pred) for ex, pred in zip(examples, predictions)]
    if output is not None:
        write_predictions(rows, output)
    return rows


# What each task calls its answer; the first present is the row's ``prediction`` (a text2text classifier
# reports both the class, ``label``, and the word it generated, ``output``: the class is the answer).
ANSWER_KEYS = ("label", "score", "labels", "tags", "answer", "output")
PREDICTION = "prediction"


def check_prediction_columns(table: Table) -> None:
    """Refuse input columns that predictions would overwrite (``prediction``, ``prediction_...``).

    >>> check_prediction_columns(Table("in.tsv", [{"id": 1, "prediction": "x"}], ["id", "prediction"]))
    Traceback (most recent call last):
    lmforge.errors.UserInputError: in.tsv: the input already has a column 'prediction', where predictions are written; rename it
    """
    for column in table.columns:
        if column == PREDICTION or column.startswith(PREDICTION + "_"):
            raise UserInputError(f"{table.name}: the input already has a column {column!r}, where predictions are "
                                 "written; rename it")


def prediction_row(source: dict[str, Any], columns: list[str], pred: dict[str, Any]) -> dict[str, Any]:
    """The input row's columns (in file order) then the task's prediction as ``prediction``/``prediction_<key>``.

    >>> prediction_row({"id": "a7", "text": "fine", "label": "1"}, ["id", "text", "label"],
    ...                {"label": "0", "probabilities": {"0": 0.6, "1": 0.4}})
    {'id': 'a7', 'text': 'fine', 'label': '1', 'prediction': '0', 'prediction_probabilities': {'0': 0.6, '1': 0.4}}
    """
    answer = next((k for k in ANSWER_KEYS if k in pred), None)
    out = {name: source.get(name) for name in columns}
    out.update({PREDICTION if key == answer else f"{PREDICTION}_{key}": value for key, value in pred.items()})
    return out


_PER_CLASS = {"prediction_probabilities": "prediction_prob", "prediction_scores": "prediction_score"}


def _cell(value: Any) -> Any:
    """A list of words or numbers (tokens, tags, confidences) as space-joined text, when that reads back
    unambiguously; any other nested value as JSON."""
    if isinstance(value, list) and all(v is None or isinstance(v, (int, float)) or
                                       isinstance(v, str) and v and not any(c.isspace() for c in v) for v in value):
        return " ".join("" if v is None else str(v) for v in value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return value


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """One level of columns: a class's probability (or SVM score) becomes a ``prediction_prob_<label>``
    (``prediction_score_<label>``) column; other nested values become text (:func:`_cell`).

    >>> _flat({"id": 3, "prediction": "b", "prediction_probabilities": {"a": 0.1, "b": 0.9}, "tags": ["O", "B-X"]})
    {'id': 3, 'prediction': 'b', 'prediction_prob_a': 0.1, 'prediction_prob_b': 0.9, 'tags': 'O B-X'}
    """
    out = {}
    for key, value in row.items():
        if key in _PER_CLASS and isinstance(value, dict):
            out.update({f"{_PER_CLASS[key]}_{k}": v for k, v in value.items()})
        else:
            out[key] = _cell(value)
    return out


def write_predictions(rows: list[dict[str, Any]], output: str | Path) -> Path:
    """Write rows as JSONL (default), TSV or CSV, by the file name; atomically."""
    output = Path(output)
    suffix = output.suffix.lower()
    if suffix in (".tsv", ".csv"):
        flat = [_flat(r) for r in rows]
        header = list(dict.fromkeys(k for r in flat for k in r))
        from io import StringIO

        buffer = StringIO()
        writer = csv.DictWriter(buffer, header, delimiter="\t" if suffix == ".tsv" else ",", lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        text = buffer.getvalue()
    elif suffix in (".jsonl", ".json", ""):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        raise TaskDataError(f"{output}: write predictions to a .jsonl, .tsv or .csv file")
    remove_stale_temporaries(output.parent, output.name)  # a killed earlier run's half-written copy
    atomic_write_text(output, text)
    return output


def table_lines(scores: dict[str, Any]) -> list[str]:
    """A two-column text table of metrics, for the terminal."""
    width = max((len(k) for k in scores), default=6)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 10}"]
    for key, value in scores.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<{width}}  {shown}")
    return lines
