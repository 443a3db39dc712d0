"""The STS evaluation sets of Sentence-BERT's Table 1 (Reimers & Gurevych 2019), read in their official layouts.

    set        files (under the STS folder)                           pairs kept
    STS12-16   STS1X-en-test/STS.input.NAME.txt + STS.gs.NAME.txt       every pair with a gold score
    STS-B      stsbenchmark/sts-{train,dev,test}.csv                  all (tab-separated, no quoting)
    SICK-R     SICK/SICK_{train,trial,test_annotated}.txt, or SICK/SICK.txt (its SemEval_set column picks the split)

``STS.input.NAME.txt`` holds ``sentence1<TAB>sentence2`` per line (STS16's add two source columns), and
``STS.gs.NAME.txt`` the gold score of the same line; a blank gold line (STS16 left some pairs unscored) drops its
pair, as SentEval does. The year folders are named as SentEval's ``get_transfer_data.bash`` unpacks them. STS-B's
``.csv`` files are tab-separated: genre, file, year, id, score, sentence1, sentence2 (a few lines carry extra
source columns after those seven). Every row comes back as ``{sentence1, sentence2, score}`` with a float score.

Example:
    >>> gold_file(Path("STS12-en-test/STS.input.MSRpar.txt")).as_posix()
    'STS12-en-test/STS.gs.MSRpar.txt'
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from lmforge.data.sources import DataError
from lmforge.errors import InputFileNotFound

SICK_SETS = {"train": "TRAIN", "trial": "TRIAL", "test": "TEST"}  # SICK.txt's SemEval_set values
# Each year's subsets, as SentEval reads them (STS13's licensed SMT subset is not distributed).
YEARS = {
    "sts12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "sts13": ("FNWN", "headlines", "OnWN"),
    "sts14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "sts15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "sts16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}


def year_files(year: str) -> dict[str, str]:
    """``{subset: STS1X-en-test/STS.input.SUBSET.txt}`` of one year (``sts12`` ... ``sts16``)."""
    return {name: f"STS{year[-2:]}-en-test/STS.input.{name}.txt" for name in YEARS[year]}


def gold_file(file: Path) -> Path:
    """The ``STS.gs.NAME.txt`` beside an ``STS.input.NAME.txt``."""
    return file.with_name(file.name.replace("STS.input.", "STS.gs.", 1))


def _row(file: Path, number: int, a: str, b: str, score: str) -> dict[str, Any]:
    try:
        value = float(score)
    except ValueError:
        raise DataError(f"{file}: line {number}: the score {score!r} is not a number") from None
    return {"sentence1": a, "sentence2": b, "score": value}


def read_year(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """One STS12-16 subset: the input file's pairs with the gold file's scores (unscored pairs dropped)."""
    gold = gold_file(file)
    if not gold.is_file():
        raise InputFileNotFound(f"{gold}: not found; the STS input file {file.name} needs its gold scores beside it")
    pairs = file.read_text(encoding="utf-8", errors="replace").splitlines()
    scores = gold.read_text(encoding="utf-8").splitlines()
    if len(pairs) != len(scores):
        raise DataError(f"{gold}: {len(scores)} lines, but {file.name} has {len(pairs)} (one score per pair)")
    rows, lines = [], []
    for number, (pair, score) in enumerate(zip(pairs, scores), 1):
        if not score.strip():
            continue
        parts = pair.split("\t")
        if len(parts) < 2:
            raise DataError(f"{file}: line {number}: expected 'sentence1<TAB>sentence2'")
        rows.append(_row(file, number, parts[0], parts[1], score.strip()))
        lines.append(number)
    return rows, lines


def read_stsb(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """One STS-B split: score in column 5, the sentences in columns 6 and 7."""
    records = csv.reader(io.StringIO(file.read_text(encoding="utf-8")), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows, lines = [], []
    for number, values in enumerate(records, 1):
        if not values:
            continue
        if len(values) < 7:
            raise DataError(f"{file}: line {number}: {len(values)} fields; expected genre, file, year, id, score, "
                            "sentence1, sentence2")
        rows.append(_row(file, number, values[5], values[6], values[4]))
        lines.append(number)
    return rows, lines


def read_sick(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """One SICK split with its relatedness score (1-5); from ``SICK.txt``, the rows of that split only."""
    reader = csv.DictReader(io.StringIO(file.read_text(encoding="utf-8")), delimiter="\t", quoting=csv.QUOTE_NONE)
    need = ["sentence_A", "sentence_B", "relatedness_score"] + (["SemEval_set"] if file.name == "SICK.txt" else [])
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{file}: no column {', '.join(missing)} (SICK's header: pair_ID, sentence_A, sentence_B, "
                        "relatedness_score, ...)")
    rows, lines = [], []
    for row in reader:
        if file.name == "SICK.txt" and row["SemEval_set"] != SICK_SETS[split]:
            continue
        rows.append(_row(file, reader.line_num, row["sentence_A"], row["sentence_B"], row["relatedness_score"]))
        lines.append(reader.line_num)
    return rows, lines
