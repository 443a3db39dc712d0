"""Corpus readers: document splitting, every format and compression, and the bad-input messages."""

from __future__ import annotations

import importlib

import csv
import gzip
import json
import random
import re

import pytest

from lmforge.data import sources
from lmforge.data.sources import DataError, iter_documents, resolve_inputs

DOCS = ["First document.\nIts second line.", "Second: naïve café 日本語 🙂", "  indented third\twith tab",
        'Fourth, with "quotes", commas\nand a newline']


def _reference_txt_docs(text: str) -> list[str]:
    """Line-by-line definition of a document: lines between blank (whitespace-only) lines."""
    docs, lines = [], []
    for line in text.split("\n"):
        if line.strip() == "":
            if lines:
                docs.append("\n".join(lines))
            lines = []
        else:
            lines.append(line)
    if lines:
        docs.append("\n".join(lines))
    return [d.strip("\r\n") for d in docs if d.strip()]


def test_txt_documents_match_line_definition_across_block_boundaries(tmp_path, monkeypatch):
    pieces = ["word", "naïve", "日本", "🙂", " ", "  ", "\t", "\n", "\n\n", "\n \n", "\n\t\n\n", "\r\n", "\n  "]
    path = tmp_path / "a.txt"
    for seed in range(60):
        rng = random.Random(seed)
        text = (rng.choice(["", "\n", " \n", "\n\n", " "]) + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 200)))
                + rng.choice(["", "\n", " ", "\n ", " \n"]))
        path.write_text(text, encoding="utf-8")
        expected = [d.replace("\r", "") for d in _reference_txt_docs(text.replace("\r\n", "\n"))]
        for block in (1, 3, 7, 1 << 20):  # tiny blocks split multi-byte characters and boundaries
            monkeypatch.setattr(sources, "BLOCK", block)
            got = [d.replace("\r", "") for d in iter_documents([path])]
            assert got == expected, (seed, block)


def _write_all_formats(folder, docs):
    (folder / "a.txt").write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs) + "\n", encoding="utf-8")
    with open(folder / "b.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": 1, "body": d}, ensure_ascii=False) + "\n")
    for name, delim in (("c.csv", ","), ("d.tsv", "\t")):
        with open(folder / name, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter=delim)
            w.writerow(["id", "body"])
            w.writerows([[i, d] for i, d in enumerate(docs)])


def test_every_format_and_compression_reads_the_same_documents(tmp_path):
    pa = importlib.import_module("pyarrow")
    pq = importlib.import_module("pyarrow.parquet")
    zstandard = importlib.import_module("zstandard")
    _write_all_formats(tmp_path, DOCS)
    pq.write_table(pa.table({"body": DOCS, "n": list(range(len(DOCS)))}), tmp_path / "e.parquet")
    plain = sorted(tmp_path.iterdir())
    for path in plain:
        data = path.read_bytes()
        (tmp_path / (path.name + ".gz")).write_bytes(gzip.compress(data))
        # Two zstd frames back to back, as `zstd` or appending produce: both must be read.
        cctx = zstandard.ZstdCompressor()
        (tmp_path / (path.name + ".zst")).write_bytes(cctx.compress(data[:10]) + cctx.compress(data[10:]))
    files = resolve_inputs([tmp_path])
    assert len(files) == 15
    for path in files:
        got = list(iter_documents([path], text_field="body"))
        assert got == DOCS, path.name


def test_resolve_inputs_globs_folders_and_missing(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("x\n")
    (tmp_path / "sub" / ".hidden.txt").write_text("h\n")
    (tmp_path / "y.jsonl.gz").write_bytes(gzip.compress(b'{"text": "y"}\n'))
    (tmp_path / "notes.pdf").write_bytes(b"%PDF")
    assert resolve_inputs([tmp_path]) == [tmp_path / "sub" / "x.txt", tmp_path / "y.jsonl.gz"]
    assert resolve_inputs(str(tmp_path / "**" / "*.txt")) == [tmp_path / "sub" / "x.txt"]
    assert resolve_inputs([tmp_path / "sub" / "x.txt", tmp_path / "sub" / "x.txt"]) == [tmp_path / "sub" / "x.txt"]
    with pytest.raises(FileNotFoundError, match="input not found: .*missing.txt"):
        resolve_inputs([tmp_path / "missing.txt"])
    with pytest.raises(FileNotFoundError, match="no input files match"):
        resolve_inputs([str(tmp_path / "*.parquet")])
    with pytest.raises(DataError, match="notes.pdf: unsupported input format"):
        resolve_inputs([tmp_path / "notes.pdf"])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="folder holds no input files"):
        resolve_inputs([tmp_path / "empty_dir"])


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv", ".txt.gz"])
def test_non_utf8_reports_file_and_byte_offset(tmp_path, suffix):
    good = {".txt": b"line one\n\nok line\n", ".jsonl": b'{"text": "ok"}\n', ".csv": b"text\nok\n"}
    body = good[suffix.removesuffix(".gz")]
    bad_line = {".txt": b"caf\xe9 au lait\n", ".jsonl": b'{"text": "caf\xe9"}\n', ".csv": b"caf\xe9\n"}
    payload = body + bad_line[suffix.removesuffix(".gz")]
    offset = len(body) + payload[len(body):].index(b"\xe9")
    path = tmp_path / ("bad" + suffix)
    path.write_bytes(gzip.compress(payload) if suffix.endswith(".gz") else payload)
    with pytest.raises(DataError) as err:
        list(iter_documents([path]))
    message = str(err.value)
    assert str(path) in message and f"byte{' of the decompressed data' if '.gz' in suffix else ''} {offset} " in message
    line = body.count(b"\n") + 1
    assert f"(line {line})" in message and "--errors replace" in message
    docs = list(iter_documents([path], errors="replace"))
    assert any("caf\ufffd" in d for d in docs)


def test_missing_json_field_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"body": "c", "id": 3}\n', encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}: line 4: no field 'text' (fields: body, id)")):
        list(iter_documents([path]))
    path.write_text('{"text": "a"}\n{"text": 5}\n')
    with pytest.raises(DataError, match="line 2: field 'text' is int, not a string"):
        list(iter_documents([path]))
    path.write_text('{"text": "a"}\n{"text": "b"\n')
    with pytest.raises(DataError, match="line 2: invalid JSON"):
        list(iter_documents([path]))


def test_missing_csv_and_parquet_columns(tmp_path):
    (tmp_path / "t.tsv").write_text("id\tbody\n1\thello\n")
    with pytest.raises(DataError, match=r"t.tsv: no column 'text' in the header \(columns: id, body\)"):
        list(iter_documents([tmp_path / "t.tsv"]))
    pa = importlib.import_module("pyarrow")
    pq = importlib.import_module("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(DataError, match=r"p.parquet: no column 'text' \(columns: body\)"):
        list(iter_documents([tmp_path / "p.parquet"]))
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match="column 'text' has type int64, not string"):
        list(iter_documents([tmp_path / "n.parquet"]))


def test_truncated_archive_and_counts(tmp_path):
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"hello world\n" * 1000)[:-30])
    with pytest.raises(DataError, match="cut.txt.gz: cannot read"):
        list(iter_documents([tmp_path / "cut.txt.gz"]))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "two.txt").write_text("a\n\nb\n")
    counts, seen = {}, []
    docs = list(iter_documents([tmp_path / "empty.txt", tmp_path / "two.txt"], counts=counts, on_bytes=seen.append))
    assert docs == ["a", "b"]
    assert counts == {str(tmp_path / "empty.txt"): 0, str(tmp_path / "two.txt"): 2}
    assert sum(seen) == 5  # on-disk bytes read, for the progress bar
