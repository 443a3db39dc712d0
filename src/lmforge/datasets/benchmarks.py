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
    snli, scitail, race, sst (SST-5), imdb, trec (TREC-6), and SuperGLUE's ReCoRD/: their layouts are
    listed in :mod:`lmforge.datasets.benchmark_readers`, which reads them
    conll2003  LMFORGE_CONLL2003_DIR   eng.train, eng.testa (dev), eng.testb (test): word POS chunk NER, IOB1 -> IOB2
    sts        LMFORGE_STS_DIR         STS12-en-test/ ... STS16-en-test/, stsbenchmark/, SICK/ (datasets.sts_files)
    cnn_dm     LMFORGE_CNN_DM_DIR      train.csv, validation.csv, test.csv: id, article, highlights
    xsum       LMFORGE_XSUM_DIR        XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json, bbc-summary-data/ID.summary
    wmt14      LMFORGE_WMT14_DIR       train.en/.de, newstest2013.en/.de, newstest2014.en/.de (or the SGML)

GLUE's TSVs are read without quote handling (MNLI and QQP hold stray ``"``), as GLUE's own loaders do. Rows
come back in the shape lmforge's tasks read: SQuAD's nested JSON becomes one row per question
(``question``, ``context``, ``answers``); SWAG and COPA become ``context`` + ``choice0..`` + ``label``;
MultiRC one row per answer (``paragraph``, ``question_answer``, ``label``, ``question_id``).

Example:
    >>> SUITES["glue"][0]
    'LMFORGE_GLUE_DIR'
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
from lmforge.datasets import benchmark_readers as more
from lmforge.datasets import conll2003, sts_files, summarization_files, wmt_files
from lmforge.errors import InputFileNotFound

SUITES = {
    "glue": ("LMFORGE_GLUE_DIR", "https://gluebenchmark.com/tasks (download_glue_data.py unpacks glue_data/)"),
    "superglue": ("LMFORGE_SUPERGLUE_DIR", "https://super.gluebenchmark.com/tasks (combined.zip)"),
    "squad": ("LMFORGE_SQUAD_DIR", "https://rajpurkar.github.io/SQuAD-explorer/"),
    "swag": ("LMFORGE_SWAG_DIR", "https://github.com/rowanz/swagaf (the data/ folder)"),
    **more.SUITES,  # snli, scitail, race, sst, imdb, trec
    # tagging, sentence similarity (no training: SBERT's Table 1), summarization, translation
    "conll2003": ("LMFORGE_CONLL2003_DIR", "https://www.clips.uantwerpen.be/conll2003/ner/ (eng.train, eng.testa, "
                  "eng.testb, built from Reuters RCV1)"),
    "sts": ("LMFORGE_STS_DIR", "SentEval's data/downstream/STS (get_transfer_data.bash: SemEval STS 2012-2016 "
            "test sets, https://github.com/facebookresearch/SentEval), stsbenchmark.tar.gz "
            "(https://ixa2.si.ehu.eus/stswiki) and SICK (https://marcobaroni.org/composes/sick.html) beside them"),
    "cnn_dm": ("LMFORGE_CNN_DM_DIR", "https://github.com/abisee/cnn-dailymail (non-anonymised), as the CSV export "
               "of Hugging Face's cnn_dailymail 3.0.0: the cnn_dailymail/ folder"),
    "xsum": ("LMFORGE_XSUM_DIR", "https://github.com/EdinburghNLP/XSum (its scripts write bbc-summary-data/)"),
    "wmt14": ("LMFORGE_WMT14_DIR", "https://www.statmt.org/wmt14/translation-task.html (test-full.tgz, dev.tgz), "
              "or the plain-text copy at https://nlp.stanford.edu/projects/nmt/"),
}


@dataclass(frozen=True)
class Layout:
    """One benchmark task's files: split -> path under the suite's folder, how to read them, and the header
    of files that have none (``names``, per split; CoLA's train/dev)."""

    name: str
    files: dict[str, str]
    reader: str | Callable  # "tsv" | "jsonl" | "squad" | "csv", or a function (path, split) -> (rows, lines)
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transform: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    # split -> the same split in another official layout, read when the first is absent (WMT's SGML, SICK.txt)
    alternatives: dict[str, tuple[str, ...]] = field(default_factory=dict)

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
    # read by benchmark_readers (folders of files, trees, label lines); IMDb and TREC carve their dev from train
    Layout("superglue/record", _sg("ReCoRD"), more.record),
    Layout("snli/snli", {s: f"snli_1.0/snli_1.0_{s}.jsonl" for s in ("train", "dev", "test")}, "jsonl",
           transform=lambda row: [] if row.get("gold_label") == "-" else [row]),
    Layout("scitail/scitail", {s: f"SciTailV1.1/tsv_format/scitail_1.0_{s}.tsv" for s in ("train", "dev", "test")},
           "tsv", {s: ("premise", "hypothesis", "label") for s in ("train", "dev", "test")}),
    Layout("race/race", {s: f"RACE/{s}" for s in ("train", "dev", "test")}, more.race),
    Layout("sst/sst5", {s: f"trees/{s}.txt" for s in ("train", "dev", "test")}, more.sst_trees),
    Layout("imdb/imdb", {"train": "aclImdb/train", "dev": "aclImdb/train", "test": "aclImdb/test"}, more.imdb),
    Layout("trec/trec6", {"train": "train_5500.label", "dev": "train_5500.label", "test": "TREC_10.label"}, more.trec),
    # CoNLL-2003, STS (SBERT's row), CNN/DM and XSum, WMT14: each read by its own module (datasets.*_files)
    Layout("conll2003", {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}, conll2003.read),
    *(Layout(f"sts/{year}", sts_files.year_files(year), sts_files.read_year) for year in sts_files.YEARS),
    Layout("sts/stsb", {s: f"stsbenchmark/sts-{s}.csv" for s in ("train", "dev", "test")}, sts_files.read_stsb),
    Layout("sts/sickr", {"train": "SICK/SICK_train.txt", "trial": "SICK/SICK_trial.txt",
                         "test": "SICK/SICK_test_annotated.txt"}, sts_files.read_sick,
           alternatives={s: ("SICK/SICK.txt",) for s in ("train", "trial", "test")}),
    Layout("cnn_dm", {s: f"{s}.csv" for s in ("train", "validation", "test")}, summarization_files.read_cnn_dm),
    Layout("xsum", {s: summarization_files.XSUM_SPLITS for s in ("train", "validation", "test")},
           summarization_files.read_xsum),
    Layout("wmt14/en-de", {"train": "train.en", "dev": "newstest2013.en", "test": "newstest2014.en"},
           wmt_files.pair_reader("en", "de"),
           alternatives={"dev": ("newstest2013-src.en.sgm", "dev/newstest2013-src.en.sgm"),
                         "test": ("newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-src.en.sgm")}),
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
    if root is not None and not (root / layout.files[split]).exists():
        for other in layout.alternatives.get(split, ()):  # the same split in another official layout
            if (root / other).exists():
                return root / other
        if layout.alternatives.get(split):
            expected += f" (or {', '.join(layout.alternatives[split])})"
    if root is None or not (root / layout.files[split]).exists():  # a file, or a folder of files (RACE, IMDb)
        how = "" if root is not None else f" (pass --data-dir or set {env})"
        raise InputFileNotFound(f"{expected}: not found{how}; {name} is not shipped with lmforge: get the "
                                f"official data from {source}")
    return root / layout.files[split]


def read(name: str, split: str, data_dir: str | Path | None = None) -> tuple[Path, list[dict[str, Any]], list[int]]:
    """``(file, rows, line of each row)`` of one split, in the shape lmforge's tasks read (module docstring)."""
    layout = LAYOUTS[name]
    file = path(name, split, data_dir)
    text = "" if callable(layout.reader) else file.read_text(encoding="utf-8")
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    if callable(layout.reader):
        rows, lines = layout.reader(file, split)
    elif layout.reader == "tsv":
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
