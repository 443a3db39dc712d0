"""Readers of official benchmark layouts that are not one TSV, JSONL or CSV file: folders of files, trees, label lines.

Each reader takes the split's file (or folder) and returns ``(rows, line of each row)`` in the shape lmforge's
tasks read; :mod:`lmforge.datasets.benchmarks` names the files (its ``LAYOUTS``) and checks that they exist.
The suites below are read from a folder given as ``--data-dir`` or by their variable::

    suite    variable             files (under the folder), as the official download unpacks
    snli     LMFORGE_SNLI_DIR     snli_1.0/snli_1.0_{train,dev,test}.jsonl (gold_label "-": no majority, dropped)
    scitail  LMFORGE_SCITAIL_DIR  SciTailV1.1/tsv_format/scitail_1.0_{train,dev,test}.tsv (premise, hypothesis, label)
    race     LMFORGE_RACE_DIR     RACE/{train,dev,test}/{middle,high}/*.txt (one JSON article per file)
    sst      LMFORGE_SST_DIR      trees/{train,dev,test}.txt (trainDevTestTrees_PTB.zip: SST's PTB trees)
    imdb     LMFORGE_IMDB_DIR     aclImdb/{train,test}/{pos,neg}/ID_RATING.txt (aclImdb_v1.tar.gz)
    trec     LMFORGE_TREC_DIR     train_5500.label, TREC_10.label ("COARSE:fine question" per line)

ReCoRD (SuperGLUE's ``ReCoRD/{train,val,test}.jsonl``) is read here too: one row per query, as SQuAD's
(``question`` holds the query with its ``@placeholder``, ``context`` the passage, ``answers`` SQuAD's
``{"text", "answer_start"}``), plus ``entities``, the passage's candidate entities.

SST-5 is read from the Stanford Sentiment Treebank's own release, the PTB-style trees (Socher et al. 2013);
the ``__label__N text`` files seen elsewhere are conversions of them. A row is a tree's root: its label 0-4
(very negative .. very positive) and its words, the leaves, with PTB's bracket escapes (``-LRB-``) undone.

RACE (Lai et al. 2017) becomes one multiple-choice row per question: ``context`` is the article, and each
choice the question with the option in its blank (``_``), else the question followed by the option, as
RoBERTa's RACE preparation does; ``label`` is the answer's index (A=0 .. D=3) and ``level`` middle or high.

IMDb (Maas et al. 2011) and TREC (Li and Roth 2002) ship no dev split, so one is carved from the training
split, the same on every machine: within each class, the rows whose ``sha256("lmforge-dev-0:" + key)`` is
smallest, 10% of the class (at least one); the key is the review's path under ``train/`` (``pos/123_8.txt``)
or the question's line number in ``train_5500.label``. ``train`` is the rest: IMDb 22,500 / 2,500 reviews, TREC
about 4,910 / 540 of 5,452 questions (Kim 2014 also held out 10% of TREC's training set as dev). The test
splits are the official ones (25,000 reviews; TREC_10's 500 questions).
TREC's label is the coarse class (ABBR, DESC, ENTY, HUM, LOC, NUM: TREC-6); ``fine_label`` keeps the fine one.

Example:
    >>> carve(["a", "b", "c", "d"], ["x", "x", "y", "y"], "dev")   # one of each class held out
    [1, 2]
    >>> choice_text("The author thinks _ .", "so")
    'The author thinks so .'
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from lmforge.data.sources import DataError
from lmforge.errors import InputFileNotFound

SUITES = {
    "snli": ("LMFORGE_SNLI_DIR", "https://nlp.stanford.edu/projects/snli/ (snli_1.0.zip)"),
    "scitail": ("LMFORGE_SCITAIL_DIR", "https://allenai.org/data/scitail (SciTailV1.1.zip)"),
    "race": ("LMFORGE_RACE_DIR", "https://www.cs.cmu.edu/~glai1/data/race/ (RACE.tar.gz)"),
    "sst": ("LMFORGE_SST_DIR", "https://nlp.stanford.edu/sentiment/ (trainDevTestTrees_PTB.zip)"),
    "imdb": ("LMFORGE_IMDB_DIR", "https://ai.stanford.edu/~amaas/data/sentiment/ (aclImdb_v1.tar.gz)"),
    "trec": ("LMFORGE_TREC_DIR", "https://cogcomp.seas.upenn.edu/Data/QA/QC/ (train_5500.label, TREC_10.label)"),
}
TREC_COARSE = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
DEV_SEED, DEV_FRACTION = 0, 10  # the carved dev: seed of the hash, and 1 row in DEV_FRACTION per class
Rows = tuple[list[dict[str, Any]], list[Any]]


def _missing(path: Path, suite: str, what: str) -> InputFileNotFound:
    return InputFileNotFound(f"{path}: not found ({what}); get the official data from {SUITES[suite][1]}")


def carve(keys: list[str], labels: list[Any], split: str) -> list[int]:
    """The indices of the rows in ``split`` (``"dev"``: the held-out tenth of each class; ``"train"``: the rest),
    in their order; see the module docstring for the rule."""
    held: set[int] = set()
    for label in dict.fromkeys(labels):
        members = [k for k, lab in enumerate(labels) if lab == label]
        members.sort(key=lambda k: hashlib.sha256(f"lmforge-dev-{DEV_SEED}:{keys[k]}".encode()).hexdigest())
        n = max(1, len(members) // DEV_FRACTION) if len(members) > 1 else 0
        held.update(members[:n])
    return [k for k in range(len(keys)) if (k in held) == (split == "dev")]


# ---------------------------------------------------------------------------------------------- ReCoRD
def record(file: Path, split: str) -> Rows:
    """SuperGLUE's ReCoRD JSONL: ``{"passage": {"text", "entities": [{start, end}]}, "qas": [{"query",
    "answers": [{start, end, text}], "idx"}], "idx"}``, ``end`` inclusive; one SQuAD-shaped row per query."""
    rows, lines = [], []
    for k, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = row["passage"]["text"]
            entities = list(dict.fromkeys(text[e["start"]:e["end"] + 1] for e in row["passage"].get("entities", [])))
            for qa in row["qas"]:
                answers = qa.get("answers", [])
                for a in answers:
                    if text[a["start"]:a["end"] + 1] != a["text"]:
                        raise ValueError(f"answer {a['text']!r} is not the passage's characters {a['start']}.."
                                         f"{a['end']} ({text[a['start']:a['end'] + 1]!r})")
                rows.append({"id": f"{row['idx']}-{qa['idx']}", "question": qa["query"], "context": text,
                             "answers": {"text": [a["text"] for a in answers],
                                         "answer_start": [a["start"] for a in answers]},
                             "entities": entities})
                lines.append(k)
        except json.JSONDecodeError as exc:
            raise DataError(f"{file}: line {k}: not valid JSON ({exc})") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{file}: line {k}: not a ReCoRD record (passage.text, passage.entities, qas[].query, "
                            f"qas[].answers, idx): {exc}") from exc
    return rows, lines


# ------------------------------------------------------------------------------------------------ RACE
def choice_text(question: str, option: str) -> str:
    """One RACE choice: the option in the question's blank, else after the question."""
    return question.replace("_", option) if "_" in question else f"{question} {option}"


def _number(path: Path):
    return (0, int(path.stem), "") if path.stem.isdigit() else (1, 0, path.name)


def race(folder: Path, split: str) -> Rows:
    """RACE's ``{train,dev,test}/{middle,high}/N.txt``, each ``{"article", "questions", "options", "answers",
    "id"}``: one multiple-choice row per question (module docstring)."""
    rows: list[dict[str, Any]] = []
    for level in ("middle", "high"):
        sub = folder / level
        if not sub.is_dir():
            raise _missing(sub, "race", f"RACE's {split} split is {folder.name}/middle/ and {folder.name}/high/")
        for file in sorted(sub.glob("*.txt"), key=_number):
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
                article, questions, options, answers = (data[key] for key in ("article", "questions", "options",
                                                                               "answers"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{file}: not a RACE article (one JSON object): {exc}") from exc
            except (KeyError, TypeError) as exc:
                raise DataError(f"{file}: not a RACE article: no {exc} (article, questions, options, answers)") from exc
            if not len(questions) == len(options) == len(answers):
                raise DataError(f"{file}: {len(questions)} questions, {len(options)} option lists and "
                                f"{len(answers)} answers; RACE has one of each per question")
            for q, (question, opts, answer) in enumerate(zip(questions, options, answers)):
                if len(opts) != 4 or answer not in ("A", "B", "C", "D"):
                    raise DataError(f"{file}: question {q + 1}: expected 4 options and an answer A-D, got "
                                    f"{len(opts)} options and {answer!r}")
                choices = {f"choice{c}": choice_text(question, option) for c, option in enumerate(opts)}
                rows.append({"id": f"{level}/{file.name}:{q}", "level": level, "context": article,
                             "question": question, **choices, "label": "ABCD".index(answer)})
    if not rows:
        raise DataError(f"{folder}: no articles (*.txt) in middle/ or high/")
    return rows, [None] * len(rows)


# ------------------------------------------------------------------------------------------------ SST-5
_TOKENS = re.compile(r"\(|\)|[^\s()]+")
_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def tree_root(line: str) -> tuple[str, list[str]] | None:
    """``(root label, leaf words)`` of one SST tree ``(3 (2 It) (4 ...))``; None if the line is not one.

    >>> tree_root("(3 (2 It) (4 (2 works) (2 -RRB-)))")
    ('3', ['It', 'works', ')'])
    """
    tokens = _TOKENS.findall(line)
    depth, words, want_label = 0, [], False
    for k, tok in enumerate(tokens):
        if tok == "(":
            depth, want_label = depth + 1, True
        elif tok == ")":
            depth -= 1
            if depth < 0 or (depth == 0 and k != len(tokens) - 1):
                return None  # a second tree, or a stray ")"
        elif want_label:
            if tok not in ("0", "1", "2", "3", "4"):
                return None
            want_label = False
        else:
            words.append(_ESCAPES.get(tok, tok))
    if len(tokens) < 4 or tokens[0] != "(" or depth != 0 or not words:
        return None
    return tokens[1], words


def sst_trees(file: Path, split: str) -> Rows:
    """SST's ``trees/{split}.txt``: one tree per line -> ``{"sentence", "label"}`` (root label, "0".."4")."""
    rows, lines = [], []
    for k, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        root = tree_root(line)
        if root is None:
            raise DataError(f"{file}: line {k}: not a sentiment tree '(LABEL (LABEL word) ...)' with labels 0-4: "
                            f"{line[:60]!r}")
        rows.append({"sentence": " ".join(root[1]), "label": root[0]})
        lines.append(k)
    return rows, lines


# ------------------------------------------------------------------------------------------------ IMDb
def imdb(folder: Path, split: str) -> Rows:
    """aclImdb's ``{train,test}/{neg,pos}/ID_RATING.txt`` -> ``{"id", "text", "label", "rating"}`` (the review's
    raw text, ``<br />`` included); ``train``/``dev``: the carved split of ``train/``."""
    rows: list[dict[str, Any]] = []
    for label in ("neg", "pos"):
        sub = folder / label
        if not sub.is_dir():
            raise _missing(sub, "imdb", f"aclImdb's {folder.name}/ holds neg/ and pos/")
        for file in sorted(sub.glob("*.txt"), key=lambda p: _number(Path(p.stem.partition("_")[0]))):
            rating = file.stem.partition("_")[2]
            if not rating.isdigit():
                raise DataError(f"{file}: not a review file name ID_RATING.txt (aclImdb's layout)")
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{file}: not UTF-8 text ({exc})") from exc
            rows.append({"id": f"{label}/{file.name}", "text": text, "label": label, "rating": int(rating)})
    if not rows:
        raise DataError(f"{folder}: no reviews (*.txt) in neg/ or pos/")
    if split in ("train", "dev"):
        rows = [rows[k] for k in carve([r["id"] for r in rows], [r["label"] for r in rows], split)]
    return rows, [None] * len(rows)


# ------------------------------------------------------------------------------------------------ TREC
def trec(file: Path, split: str) -> Rows:
    """TREC's ``COARSE:fine question`` lines -> ``{"label", "fine_label", "text"}``; ``train``/``dev``: the carved
    split of ``train_5500.label``. A line that is not UTF-8 is read as Latin-1 (train_5500 holds one such byte)."""
    rows, lines = [], []
    for k, raw in enumerate(file.read_bytes().split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            line = raw.decode("latin-1").strip()
        if not line:
            continue
        label, _, text = line.partition(" ")
        coarse, colon, fine = label.partition(":")
        if not colon or coarse not in TREC_COARSE or not fine or not text.strip():
            raise DataError(f"{file}: line {k}: expected 'COARSE:fine question' with COARSE one of "
                            f"{', '.join(TREC_COARSE)}: {line[:60]!r}")
        rows.append({"label": coarse, "fine_label": label, "text": text.strip()})
        lines.append(k)
    if split in ("train", "dev"):
        keep = carve([str(n) for n in lines], [r["label"] for r in rows], split)
        rows, lines = [rows[k] for k in keep], [lines[k] for k in keep]
    return rows, lines
