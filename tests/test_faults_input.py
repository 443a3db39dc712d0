"""Input normalised the same way everywhere: BOM and CRLF, colliding config keys, ignored decoding flags and
lengths beyond the model's context."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.data.prepare import prepare
from lmforge.data.sources import iter_documents
from lmforge.generation import GenerationConfig
from lmforge.tasks.data import read_table
from lmforge.tokenization import train_tokenizer
from lmforge.training.config import TrainConfig

DOCS = "the cat sat on the mat\nand the dog sat too\n\nsecond document here\n\nthird one, café ☃\n"


def _windows(text: str) -> bytes:
    """``text`` as a Windows editor saves it: a UTF-8 byte-order mark and CRLF line ends."""
    return b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    (root / "corpus.txt").write_text(DOCS * 30, encoding="utf-8")
    tok = train_tokenizer([root / "corpus.txt"], kind="byte-bpe", family="gpt", vocab_size=300, show_progress=False)
    return tok.save(root / "tok")


def _shards(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted((folder / "train").rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------- BOM and CRLF
@pytest.mark.parametrize("name", ["docs.txt", "docs.jsonl", "docs.tsv", "docs.csv.gz"])
def test_prepare_gives_the_same_shards_for_a_bom_crlf_file_as_for_its_unix_twin(tmp_path, tok_dir, name):
    docs = [d for d in DOCS.split("\n\n") if d.strip()]
    if name.startswith("docs.jsonl"):
        text = "".join('{"text": "%s"}\n' % d.replace("\n", "\\n") for d in docs)
    elif ".tsv" in name or ".csv" in name:
        text = "text\n" + "".join(d.replace("\n", " ").replace(",", "") + "\n" for d in docs)
    else:
        text = DOCS
    for kind, data in (("unix", text.encode("utf-8")), ("windows", _windows(text))):
        (tmp_path / kind).mkdir()
        path = tmp_path / kind / name
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        prepare([path], tok_dir, tmp_path / f"out-{kind}", val_fraction=0, progress=False)
    assert _shards(tmp_path / "out-unix") == _shards(tmp_path / "out-windows")
    assert _shards(tmp_path / "out-unix")


def test_lone_cr_line_ends_are_line_ends_and_a_cr_split_across_reads_is_one(tmp_path, monkeypatch):
    import lmforge.data.sources as sources

    monkeypatch.setattr(sources, "BLOCK", 3)  # cut every CRLF of the file across two reads somewhere
    (tmp_path / "mac.txt").write_bytes(b"\xef\xbb\xbfone\rtwo\r\rthree\r\n\r\nfour\r")
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "a"}\r{"text": "b"}\r\n')
    assert list(iter_documents([tmp_path / "mac.txt"])) == ["one\ntwo", "three", "four"]
    assert list(iter_documents([tmp_path / "mac.jsonl"])) == ["a", "b"]


def test_finetune_tables_share_the_normalisation(tmp_path):
    (tmp_path / "a.tsv").write_bytes(_windows("text\tlabel\ngood film\t1\n"))
    (tmp_path / "a.jsonl").write_bytes(_windows('{"text": "good film", "label": "1"}\n'))
    for name in ("a.tsv", "a.jsonl"):
        table = read_table(tmp_path / name)
        assert table.columns == ["text", "label"] and table.rows[0]["text"] == "good film"


def test_bad_utf8_in_a_task_table_is_a_one_line_error_naming_the_file(tmp_path):
    from lmforge.tasks.data import TaskDataError

    (tmp_path / "a.tsv").write_bytes(b"text\tlabel\ngood \xff film\t1\n")
    with pytest.raises(TaskDataError, match=r"a.tsv: line 2: invalid UTF-8"):
        read_table(tmp_path / "a.tsv")
