"""The public benchmarks' files, in their official layouts, read from a folder the user provides.

None of GLUE, SuperGLUE, SQuAD or SWAG may be downloaded or redistributed here, so each suite is read from a
folder given as ``data_dir`` (``--data-dir``) or by an environment variable; a missing file is one line
naming the expected path and where the official data comes from. Each layout is the one the official
download unpacks to::

    suite      folder variable         files (under the folder)
    glue       LMFORGE_GLUE_DIR        CoLA/train.tsv (no header), SST-2/..., MNLI/dev_matched.tsv, diagnostic/...
    superglue  LMFORGE_SUPERGLUE_DIR   BoolQ/train.jsonl, CB/val.jsonl, COPA/..., MultiRC/..., WiC/..., WSC/...
    squad      LMFORGE_SQUAD_DIR       train-v1.1.json, dev-v1.1.json, train-v2.0.json, dev-v2.0.json
    swag       LMFORGE_SWAG_DIR        train.csv, val.csv, test.csv (swagaf/data)

GLUE's TSVs are read without quote handling (MNLI and QQP hold stray ``"``), as GLUE's own loaders do. Rows
come back in the shape lmforge's tasks read: SQuAD's nested JSON becomes one row per question
(``question``, ``context``, ``answers``); SWAG and COPA become ``context`` + ``choice0..`` + ``label``;
MultiRC one row per answer (``paragraph``, ``question_answer``, ``label``, ``question_id``).

Example:
    >>> sorted(SUITES)
    ['glue', 'squad', 'superglue', 'swag']
    >>> LAYOUTS["glue/cola"].files["dev"]
    'CoLA/dev.tsv'
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lmforge.data.sources import DataError
from lmforge.errors import InputFileNotFound

SUITES = {
    "glue": ("LMFORGE_GLUE_DIR", "https://gluebenchmark.com/tasks (download_glue_data.py unpacks glue_data/)"),
    "superglue": ("LMFORGE_SUPERGLUE_DIR", "https://super.gluebenchmark.com/tasks (combined.zip)"),
    "squad": ("LMFORGE_SQUAD_DIR", "https://rajpurkar.github.io/SQuAD-explorer/"),
    "swag": ("LMFORGE_SWAG_DIR", "https://github.com/rowanz/swagaf (the data/ folder)"),
}


@dataclass(frozen=True)
class Layout:
    """One benchmark task's files: split -> path under the suite's folder, how to read them, and the header
    of files that have none (``names``, per split; CoLA's train/dev)."""

    name: str
    files: dict[str, str]
    reader: str  # "tsv" | "jsonl" | "squad" | "csv"
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transform: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None

    @property
    def suite(self) -> str:
        return self.name.split("/", 1)[0]


def _glue(folder: str, *splits: str, **names) -> dict[str, str]:
    return {s: f"{folder}/{s}.tsv" for s in splits}


def _copa(row):
    ask = {"cause": "What was the cause?", "effect": "What happened as a result?"}[row["question"]]
    return [{"context": f"{row['premise']} {ask}", "choice0": row["choice1"], "choice1": row["choice2"],
             "label": row.get("label", "")}]


def _swag(row):
    return [{"context": row["sent1"], **{f"choice{k}": f"{row['sent2']} {row[f'ending{k}']}" for k in range(4)},
             "label": row.get("label", "")}]


def _wic(row):
    return [{"sentence1": f"{row['word']}: {row['sentence1']}", "sentence2": row["sentence2"],
             "label": row.get("label", "")}]


def _wsc(row):
    target = row["target"]
    return [{"text": row["text"], "question": f"Does \"{target['span2_text']}\" refer to \"{target['span1_text']}\"?",
             "label": row.get("label", "")}]


def _multirc(row):
    out = []
    for q in row["passage"]["questions"]:
        for a in q["answers"]:
            out.append({"paragraph": row["passage"]["text"], "question_answer": f"{q['question']} {a['text']}",
                        "label": a.get("label", ""), "question_id": f"{row['idx']}-{q['idx']}"})
    return out


def _sg(folder: str) -> dict[str, str]:
    return {s: f"{folder}/{s}.jsonl" for s in ("train", "val", "test")}


COLA_NAMES = ("source", "label", "original_label", "sentence")
LAYOUTS: dict[str, Layout] = {x.name: x for x in (
    Layout("glue/cola", _glue("CoLA", "train", "dev", "test"), "tsv", {"train": COLA_NAMES, "dev": COLA_NAMES}),
    Layout("glue/sst2", _glue("SST-2", "train", "dev", "test"), "tsv"),
    Layout("glue/mrpc", _glue("MRPC", "train", "dev", "test"), "tsv"),
    Layout("glue/qqp", _glue("QQP", "train", "dev", "test"), "tsv"),
    Layout("glue/stsb", _glue("STS-B", "train", "dev", "test"), "tsv"),
    Layout("glue/mnli", _glue("MNLI", "train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"),
           "tsv"),
    Layout("glue/qnli", _glue("QNLI", "train", "dev", "test"), "tsv"),
    Layout("glue/rte", _glue("RTE", "train", "dev", "test"), "tsv"),
    Layout("glue/wnli", _glue("WNLI", "train", "dev", "test"), "tsv"),
    Layout("glue/ax", {"test": "diagnostic/diagnostic.tsv"}, "tsv"),
    Layout("superglue/boolq", _sg("BoolQ"), "jsonl"),
    Layout("superglue/cb", _sg("CB"), "jsonl"),
    Layout("superglue/copa", _sg("COPA"), "jsonl", transform=_copa),
    Layout("superglue/multirc", _sg("MultiRC"), "jsonl", transform=_multirc),
    Layout("superglue/rte", _sg("RTE"), "jsonl"),
    Layout("superglue/wic", _sg("WiC"), "jsonl", transform=_wic),
    Layout("superglue/wsc", _sg("WSC"), "jsonl", transform=_wsc),
    Layout("squad/v1.1", {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}, "squad"),
    Layout("squad/v2.0", {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}, "squad"),
    Layout("swag/swag", {"train": "train.csv", "val": "val.csv", "test": "test.csv"}, "csv", transform=_swag),
)}


def folder(suite: str, data_dir: str | Path | None = None) -> Path | None:
    """The suite's folder: ``data_dir``, else its environment variable, else None."""
    if data_dir is not None:
        return Path(data_dir)
    value = os.environ.get(SUITES[suite][0])
    return Path(value) if value else None


def path(name: str, split: str, data_dir: str | Path | None = None) -> Path:
    """Where ``name``'s ``split`` file is; a missing folder or file is one line naming it and the source."""
    layout = LAYOUTS[name]
    if split not in layout.files:
        raise DataError(f"benchmark task {name!r} has no split {split!r} (splits: {', '.join(layout.files)})")
    env, source = SUITES[layout.suite]
    root = folder(layout.suite, data_dir)
    expected = f"{root if root is not None else '$' + env}/{layout.files[split]}"
    if root is None or not (root / layout.files[split]).is_file():
        how = "" if root is not None else f" (pass --data-dir or set {env})"
        raise InputFileNotFound(f"{expected}: not found{how}; {name} is not shipped with lmforge: get the "
                                f"official data from {source}")
    return root / layout.files[split]


def read(name: str, split: str, data_dir: str | Path | None = None) -> tuple[Path, list[dict[str, Any]], list[int]]:
    """``(file, rows, line of each row)`` of one split, in the shape lmforge's tasks read (module docstring)."""
    layout = LAYOUTS[name]
    file = path(name, split, data_dir)
    text = file.read_text(encoding="utf-8")
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    if layout.reader == "tsv":
        records = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
        header = list(layout.names.get(split, ()))
        start = 1
        if not header:
            header, records, start = records[0], records[1:], 2
        for k, values in enumerate(records):
            if not values:
                continue
            if len(values) != len(header):
                raise DataError(f"{file}: row {len(rows) + 1} (line {k + start}): {len(values)} fields, but the "
                                f"layout has {len(header)} ({', '.join(header)})")
            rows.append(dict(zip(header, values)))
            lines.append(k + start)
    elif layout.reader == "csv":
        reader = csv.DictReader(io.StringIO(text))
        for row in reader:
            rows.append(dict(row))
            lines.append(reader.line_num)
    elif layout.reader == "jsonl":
        for k, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{file}: line {k}: not valid JSON ({exc})") from exc
                lines.append(k)
    else:  # SQuAD: {"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers"}]}]}]}
        for article in json.loads(text)["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                    rows.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"],
                                 "answers": {"text": [a["text"] for a in answers],
                                             "answer_start": [a["answer_start"] for a in answers]}})
                    lines.append(None)
    if layout.transform is not None:
        pairs = [(r, ln) for row, ln in zip(rows, lines) for r in layout.transform(row)]
        rows, lines = [r for r, _ in pairs], [ln for _, ln in pairs]
    for row in rows:  # SuperGLUE writes labels as JSON booleans; lmforge's classes are text
        if isinstance(row.get("label"), bool):
            row["label"] = str(row["label"]).lower()
    return file, rows, lines
