"""Shipped demo data: contents equal the shared sources, loaders, sizes, and no run-time use of ../shared.

The shared sources are compared byte for byte when ../shared is beside the checkout (as in CI), and through
their sha256 sums recorded in tests/fixtures/shared_data.sha256 otherwise.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import pytest

from lmforge import datasets
from lmforge.cli.main import main
from lmforge.data.sources import DataError, iter_documents

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SHARED_SUMS = Path(__file__).resolve().parent / "fixtures" / "shared_data.sha256"
PACKAGE = Path(datasets.__file__).resolve().parents[1]


def test_every_shipped_split_loads_with_its_registered_rows_and_columns():
    for name in datasets.names():
        entry = datasets.info(name)
        if not entry.shipped:
            continue
        for split in entry.files:
            rows = datasets.load(name, split)
            assert len(rows) == entry.rows[split], (name, split)
            assert list(rows[0]) == list(entry.columns), (name, split)
    dev = datasets.load("rt-sentiment", split="validation")
    assert {type(r["label"]) for r in dev} == {int} and {type(r["score"]) for r in dev} == {float}
    assert all(r["label"] == (r["score"] > 0) for r in dev)
    pairs = datasets.load("bible-paraphrase", "test")
    assert sum(r["label"] for r in pairs) * 2 == len(pairs)


def test_tsv_reader_follows_the_shared_quoting_convention(tmp_path):
    # A field that begins with a double quote is CSV-quoted (inner quotes doubled); others are literal.
    (tmp_path / "x.tsv").write_text('id\ttext\tlabel\n1\t"""Hi,"" she said"\t1\n2\tsays "no" twice\t0\n')
    assert datasets.read_tsv(tmp_path / "x.tsv") == [{"id": "1", "text": '"Hi," she said', "label": 1},
                                                     {"id": "2", "text": 'says "no" twice', "label": 0}]


def test_package_data_is_small_and_documented():
    total = sum(p.stat().st_size for p in datasets.FILES.iterdir())
    assert total < 25e6
    sources_md = (datasets.FILES.parent / "SOURCES.md").read_text(encoding="utf-8")
    for name in datasets.names():
        entry = datasets.info(name)
        for file_name in entry.files.values() if entry.shipped else ():
            assert f"`files/{file_name}`" in sources_md
    assert "MIT License" in sources_md and "WNUT-16" in sources_md
    shipped = {p.name for p in datasets.FILES.iterdir()}
    registered = {f for n in datasets.names() if datasets.info(n).shipped for f in datasets.info(n).files.values()}
    assert shipped == registered


def _recorded_shared_sums() -> dict[str, tuple[str, str]]:
    """file name -> (path under shared/data, sha256), from tests/fixtures/shared_data.sha256."""
    lines = [line.split() for line in SHARED_SUMS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#")]
    return {Path(rel).name: (rel, digest) for digest, rel in lines}


# Files built inside lmforge from the shipped ones (not copies of shared files): checked by a rebuild below.
DERIVED = {f for name in ("bible-next-verse", "demo-instructions") for f in datasets.info(name).files.values()}


def test_shipped_files_are_the_shared_files_byte_for_byte():
    sources_md = (datasets.FILES.parent / "SOURCES.md").read_text(encoding="utf-8")
    recorded = _recorded_shared_sums()
    packed_files = sorted(p for p in datasets.FILES.glob("*.gz") if p.name not in DERIVED)
    assert {p.name.removesuffix(".gz") for p in packed_files} == set(recorded)
    for packed in packed_files:
        raw = gzip.decompress(packed.read_bytes())
        rel, digest = recorded[packed.name.removesuffix(".gz")]
        assert hashlib.sha256(raw).hexdigest() == digest, packed.name
        if SHARED.is_dir():  # the sources themselves, which also keeps the recorded sums honest
            assert raw == (SHARED / rel).read_bytes(), packed.name
        assert digest in sources_md


def test_next_verse_files_are_their_documented_rebuild():
    from lmforge.datasets import next_verse

    sources_md = (datasets.FILES.parent / "SOURCES.md").read_text(encoding="utf-8")
    for split, file_name in datasets.info("bible-next-verse").files.items():
        verses = datasets.load("kjv-rv1909", split)
        rows = next_verse.build(verses, limit=next_verse.TRAIN_ROWS if split == "train" else None)
        packed = (datasets.FILES / file_name).read_bytes()
        assert next_verse.tsv_gz(rows) == packed, file_name
        assert hashlib.sha256(gzip.decompress(packed)).hexdigest() in sources_md
        # Each row: the answer is the verse after the context, every distractor is another verse of its book.
        text = {v["ref"]: v["en"] for v in verses}
        book_texts = {}
        for ref, t in text.items():
            book_texts.setdefault(ref.rsplit(".", 2)[0], set()).add(t)
        for row in datasets.load("bible-next-verse", split)[:300]:
            book, chapter, verse = row["ref"].rsplit(".", 2)
            choices = [row[f"choice{k}"] for k in range(4)]
            assert row["context"] == text[row["ref"]]
            assert choices[row["label"]] == text[f"{book}.{chapter}.{int(verse) + 1}"]
            assert len(set(choices)) == 4 and set(choices) <= book_texts[book]


def test_corpus_path_is_a_pretraining_input():
    path = datasets.path("corpus")
    assert path.is_file() and path.name == "austen.txt.gz"
    docs = list(iter_documents([path]))
    assert len(docs) == 270 and docs[0].startswith("The family of Dashwood")
    assert datasets.load("corpus")[0] == {"text": docs[0]}


def test_wnut16_is_read_from_a_user_folder_only(request):
    with pytest.raises(DataError, match="'wnut16' is not shipped with lmforge.*pass data_dir="):
        datasets.load("wnut16", "train")
    rows = datasets.load("wnut16", "train", data_dir=request.getfixturevalue("wnut16_dir"))
    assert len(rows) == 1836 and set(rows[0]) == {"tokens", "tags"}
    assert all(len(r["tokens"]) == len(r["tags"]) for r in rows)
    assert {t.split("-", 1)[0] for r in rows for t in r["tags"]} == {"O", "B", "I"}
    assert sum(len(r["tokens"]) for r in rows) == 35_568


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="unknown data set 'imdb'; available: corpus, rt-sentiment"):
        datasets.load("imdb")
    with pytest.raises(DataError, match="has no split 'test'"):
        datasets.path("bible-triplets", "test")
    with pytest.raises(FileNotFoundError, match="wnut16_dev.conll: not found"):
        datasets.load("wnut16", "dev", data_dir=tmp_path)
    (tmp_path / "wnut16_dev.conll").write_text("tok\tO\nbroken line\n\n")
    with pytest.raises(DataError, match="line 2: expected 'token<TAB>tag'"):
        datasets.load("wnut16", "dev", data_dir=tmp_path)


def test_data_code_never_reads_the_shared_tree():
    mine = [PACKAGE / "tokenization.py", *(PACKAGE / "data").glob("*.py"), *(PACKAGE / "datasets").glob("*.py"),
            *(PACKAGE / "cli" / f"{m}.py" for m in ("tokenizer", "data", "datasets"))]
    for source in mine:
        text = source.read_text(encoding="utf-8")
        assert not re.search(r"shared/data|\.\./shared", text), source


def test_cli_list_path_and_show(capsys):
    assert main(["datasets", "list"]) == 0
    out = capsys.readouterr().out
    for name in datasets.names():
        assert name in out
    assert "train 8,056, dev 1,007, test 1,007" in out and "public domain" in out and "not shipped" in out
    assert main(["datasets", "path", "corpus"]) == 0
    assert capsys.readouterr().out.strip() == str(datasets.path("corpus"))
    assert main(["datasets", "show", "rt-sentiment", "--split", "test", "-n", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
