"""Small demo data sets shipped inside the package (gzip-compressed; provenance in ``SOURCES.md`` here).

    name              rows (train/dev/test)    columns                                   licence
    corpus            270 documents            text (one Austen chapter per document)    public domain
    rt-sentiment      8056 / 1007 / 1007       id, score, label, text                    MIT (VADER); research use
    kjv-rv1909        26718 / 1521 / 1699      ref, en, es                               public domain
    bible-paraphrase  16000 / 3124 / 3458      ref1, ref2, text1, text2, label           public domain
    bible-triplets    8000 / - / -             anchor, positive, negative, ref, neg_ref  public domain
    bible-next-verse  4000 / 1453 / 1631       ref, context, choice0..choice3, label     public domain
    demo-instructions 1700 / 215 / -           kind, instruction, input, output          public domain
    wnut16            1836 / 229 / 230         tokens, tags (CoNLL)                      not shipped: pass data_dir

``demo-instructions`` is an instruction-tuning set written from the public-domain texts above and generated
arithmetic (:mod:`lmforge.datasets.instructions`): ``lmforge finetune --task instruct --train demo-instructions``.

Generated rather than shipped: arithmetic word problems with worked rationales (:mod:`lmforge.datasets.arithmetic`,
the chain-of-thought task of ``lmforge prompt generate --task arithmetic``).

WNUT-16 is tweets released without a licence (X/Twitter terms apply), and its provenance notes ask
that it not be shipped inside a product, so ``load("wnut16", data_dir=...)`` reads it from a folder
you provide (holding ``wnut16_{train,dev,test}.conll``).

``label`` columns are returned as ``int`` and ``score`` as ``float``; everything else is a string.

Example:
    >>> from lmforge import datasets
    >>> rows = datasets.load("rt-sentiment", split="dev")
    >>> len(rows), sorted(rows[0])
    (1007, ['id', 'label', 'score', 'text'])
    >>> datasets.path("corpus").name      # a pre-training input for `lmforge data prepare`
    'austen.txt.gz'
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.data.sources import DataError, iter_documents
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.utils.io import not_utf8

FILES = Path(__file__).parent / "files"
SPLIT_ALIASES = {"validation": "dev", "valid": "dev", "val": "dev"}


@dataclass(frozen=True)
class DatasetInfo:
    """One data set: its files per split, row counts and licence.

    Args:
        name: registry name.
        description: one line.
        format: ``"text"`` (documents), ``"tsv"`` or ``"conll"``.
        files: split -> file name (under ``files/`` when shipped, else under the caller's ``data_dir``).
        rows: split -> number of rows (documents for ``"text"``, sentences for ``"conll"``).
        license: short licence note (full texts in ``SOURCES.md``).
        shipped: False when the files must come from ``data_dir``.
    """

    name: str
    description: str
    format: str
    files: dict[str, str]
    rows: dict[str, int]
    license: str
    shipped: bool = True
    columns: tuple[str, ...] = field(default=())


def _splits(stem: str, ext: str, splits=("train", "dev", "test")) -> dict[str, str]:
    return {s: f"{stem}_{s}.{ext}" for s in splits}


REGISTRY: dict[str, DatasetInfo] = {d.name: d for d in (
    DatasetInfo("corpus", "Jane Austen's six novels, one chapter per document (pre-training text)", "text",
                {"train": "austen.txt.gz"}, {"train": 270},
                "public domain (text); janeaustenr package MIT", columns=("text",)),
    DatasetInfo("rt-sentiment", "Rotten Tomatoes review sentences, binary sentiment with mean human score",
                "tsv", _splits("rt_snippets", "tsv.gz"), {"train": 8056, "dev": 1007, "test": 1007},
                "MIT (vaderSentiment); review text by its authors, research/evaluation use",
                columns=("id", "score", "label", "text")),
    DatasetInfo("kjv-rv1909", "English (KJV) / Spanish (Reina-Valera 1909) Bible verse pairs", "tsv",
                _splits("kjv_rv1909", "tsv.gz"), {"train": 26718, "dev": 1521, "test": 1699},
                "public domain", columns=("ref", "en", "es")),
    DatasetInfo("bible-paraphrase", "KJV/WEB verse pairs: same verse (1) or hard negative (0)", "tsv",
                _splits("bible_pairs", "tsv.gz"), {"train": 16000, "dev": 3124, "test": 3458},
                "public domain", columns=("ref1", "ref2", "text1", "text2", "label")),
    DatasetInfo("bible-triplets", "KJV anchor, WEB positive, WEB hard negative from the same chapter", "tsv",
                {"train": "bible_triplets_train.tsv.gz"}, {"train": 8000}, "public domain",
                columns=("anchor", "positive", "negative", "ref", "neg_ref")),
    DatasetInfo("bible-next-verse", "KJV verse and four candidates from its book: pick the next verse "
                "(multiple choice)", "tsv", _splits("bible_next_verse", "tsv.gz"),
                {"train": 4000, "dev": 1453, "test": 1631}, "public domain",
                columns=("ref", "context", "choice0", "choice1", "choice2", "choice3", "label")),
    DatasetInfo("cloze-facts", "LAMA-style cloze facts stated in the shipped corpora (KJV, Austen): relation, "
                "template, subject, object", "tsv", {"test": "cloze_facts.tsv"}, {"test": 66},
                "the project's own (facts taken from public-domain texts)",
                columns=("relation", "template", "subject", "object", "source")),
    DatasetInfo("demo-instructions", "instruction/response pairs from the public-domain Bible and Austen texts "
                "and generated arithmetic (Alpaca-style, for --task instruct)", "tsv",
                _splits("demo_instructions", "tsv.gz", ("train", "dev")), {"train": 1700, "dev": 215},
                "public domain (KJV, RV 1909, WEB, Austen) and the project's own (arithmetic)",
                columns=("kind", "instruction", "input", "output")),
    DatasetInfo("wnut16", "WNUT-16 Twitter named entities, BIO tags, 10 types", "conll",
                _splits("wnut16", "conll"), {"train": 1836, "dev": 229, "test": 230},
                "tweets, no explicit licence (X/Twitter terms); not redistributed", shipped=False,
                columns=("tokens", "tags")),
)}


def names() -> list[str]:
    """Registered data set names."""
    return list(REGISTRY)


def info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``name``."""
    if name not in REGISTRY:
        raise DataError(f"unknown data set {name!r}; available: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def path(name: str, split: str = "train", data_dir: str | Path | None = None) -> Path:
    """File of one split: inside the package, or under ``data_dir`` for sets that are not shipped.

    The corpus path is a valid input of ``lmforge data prepare`` and ``lmforge tokenizer train``.
    """
    entry = info(name)
    split = SPLIT_ALIASES.get(split, split)
    if split not in entry.files:
        raise DataError(f"data set {name!r} has no split {split!r} (splits: {', '.join(entry.files)})")
    if data_dir is None:
        if not entry.shipped:
            raise DataError(f"{name!r} is not shipped with lmforge ({entry.license}); pass data_dir= a folder "
                            f"holding {entry.files[split]}")
        return FILES / entry.files[split]
    file = Path(data_dir) / entry.files[split]
    if not file.is_file() and (Path(data_dir) / entry.files[split].removesuffix(".gz")).is_file():
        file = Path(data_dir) / entry.files[split].removesuffix(".gz")  # an uncompressed copy will do
    if not file.is_file():
        raise InputFileNotFound(f"{file}: not found (data set {name!r}, split {split!r})")
    return file


def _open_text(file: Path) -> io.TextIOBase:
    if file.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(file, "rb"), encoding="utf-8", newline="")
    return open(file, encoding="utf-8", newline="")


def read_tsv(file: str | Path) -> list[dict[str, Any]]:
    """Rows of a TSV with a header (csv-module default quoting); ``label`` -> int, ``score`` -> float."""
    file = Path(file)
    if file.is_dir():
        raise UserInputError(f"{file}: is a folder, not a file; give a .tsv file")
    try:
        with _open_text(file) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except UnicodeDecodeError:
        with _open_text(file) as f:
            raise not_utf8(file, f.buffer.read()) from None
    for row in rows:
        if "label" in row:
            row["label"] = int(row["label"])
        if "score" in row:
            row["score"] = float(row["score"])
    return rows


def read_conll(file: str | Path) -> list[dict[str, list[str]]]:
    """Sentences of a ``token<TAB>tag`` CoNLL file: ``[{"tokens": [...], "tags": [...]}, ...]``."""
    sentences, tokens, tags = [], [], []
    with _open_text(Path(file)) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if tokens:
                    sentences.append({"tokens": tokens, "tags": tags})
                tokens, tags = [], []
                continue
            parts = line.split("\t")
            if len(parts) < 2:
                raise DataError(f"{file}: line {number}: expected 'token<TAB>tag', got {line!r}")
            tokens.append(parts[0])
            tags.append(parts[-1])
    if tokens:
        sentences.append({"tokens": tokens, "tags": tags})
    return sentences


def load(name: str, split: str = "train", data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of one split as a list of dicts.

    Args:
        name: a registered name (see :func:`names`).
        split: ``"train"``, ``"dev"`` (alias ``"validation"``) or ``"test"``.
        data_dir: folder holding the files, for sets that are not shipped (``wnut16``) or to read other copies.

    Returns:
        TSV sets: one dict per row keyed by the header. CoNLL: ``{"tokens": [...], "tags": [...]}`` per
        sentence. Text corpora: ``{"text": document}`` per document.
    """
    entry = info(name)
    file = path(name, split, data_dir)
    if entry.format == "tsv":
        return read_tsv(file)
    if entry.format == "conll":
        return read_conll(file)
    return [{"text": doc} for doc in iter_documents([file])]


def file_sizes(name: str) -> tuple[int, int]:
    """``(bytes on disk, bytes uncompressed)`` of a shipped set, all splits together."""
    disk = raw = 0
    for file_name in info(name).files.values():
        file = FILES / file_name
        size = file.stat().st_size
        disk += size
        with open(file, "rb") as f:
            if f.read(2) != b"\x1f\x8b":  # not gzipped (e.g. cloze_facts.tsv): its size is its raw size
                raw += size
                continue
            f.seek(-4, 2)  # gzip stores the uncompressed size (mod 2**32) in its last 4 bytes
            raw += int.from_bytes(f.read(4), "little")
    return disk, raw
