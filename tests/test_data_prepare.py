"""`data prepare`: exact tokens, dtype choice, crash safety (injected failure, SIGKILL) and resume."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from lmforge.cli.main import main
import lmforge.data.prepare as prepare_module
from lmforge.data import sources
from lmforge.data import read_manifest, verify
from lmforge.data.prepare import prepare
from lmforge.data.sources import DataError, iter_documents, resolve_inputs
from lmforge.tokenization import Tokenizer, train_tokenizer

SHARD_MB = 0.003  # ~3 KB of text per chunk: many shards from a small corpus


def _doc(i: int) -> str:
    words = ["alpha", "beta", "gamma", "délta", "ε", "日本", "🙂", "the", "of", "and"]
    return " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(5 + (i * 13) % 40)) + f" #{i}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    docs = [_doc(i) for i in range(300)]
    (folder / "a.txt").write_text("\n\n".join(docs[:120]) + "\n", encoding="utf-8")
    with gzip.open(folder / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        for d in docs[120:240]:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    (folder / "c.txt").write_text("\n\n".join(docs[240:]) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tok_dir(corpus, tmp_path_factory) -> Path:
    tok = train_tokenizer([corpus], kind="byte-bpe", family="gpt", vocab_size=400, show_progress=False)
    return tok.save(tmp_path_factory.mktemp("tok") / "tok")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _shard_tokens(folder: Path, split: str) -> tuple[np.ndarray, list[np.ndarray]]:
    manifest = read_manifest(folder)
    tokens, docs = [], []
    for chunk in manifest["chunks"]:
        shard = chunk[split]
        if shard:
            t = np.fromfile(folder / shard["bin"], dtype=manifest["dtype"])
            idx = np.fromfile(folder / shard["idx"], dtype=np.uint64).astype(np.int64)
            assert idx[0] == 0 and idx[-1] == t.size and np.all(np.diff(idx) > 0)
            tokens.append(t)
            docs += [t[a:b] for a, b in zip(idx[:-1], idx[1:])]
    return (np.concatenate(tokens) if tokens else np.zeros(0, manifest["dtype"])), docs


def test_shards_hold_exactly_the_input_tokens(corpus, tok_dir, tmp_path):
    tok = Tokenizer.load(tok_dir)
    expected_docs = [tok.encode(d, add_special_tokens=False) for d in iter_documents(resolve_inputs([corpus]))]
    expected = np.array([t for d in expected_docs for t in d], dtype=np.uint16)

    manifest = prepare([corpus], tok_dir, tmp_path / "all", val_fraction=0.0, shard_mb=SHARD_MB, progress=False)
    assert manifest["complete"] and manifest["dtype"] == "uint16" and manifest["documents_read"] == 300
    assert manifest["splits"]["train"]["shards"] > 5 and manifest["splits"]["val"]["tokens"] == 0
    tokens, docs = _shard_tokens(tmp_path / "all", "train")
    assert tokens.size == expected.size == manifest["splits"]["train"]["tokens"]
    assert hashlib.sha256(tokens.tobytes()).hexdigest() == hashlib.sha256(expected.tobytes()).hexdigest()
    assert [d.tolist() for d in docs] == expected_docs
    assert verify(tmp_path / "all") == []  # the manifest's checksums are the files' checksums
    assert manifest["tokenizer"]["boundary_token_id"] == tok.special_token_ids()["eos_token_id"]

    # With a validation split, every document lands in exactly one split, and the assignment is
    # independent of the shard size (it hashes the text).
    split = prepare([corpus], tok_dir, tmp_path / "split", val_fraction=0.3, shard_mb=SHARD_MB, progress=False)
    _, train = _shard_tokens(tmp_path / "split", "train")
    _, val = _shard_tokens(tmp_path / "split", "val")
    assert sorted(map(tuple, train + val)) == sorted(map(tuple, expected_docs))
    assert 50 < len(val) < 130 and split["splits"]["val"]["documents"] == len(val)
    other = prepare([corpus], tok_dir, tmp_path / "split2", val_fraction=0.3, shard_mb=1.0, progress=False)
    _, val2 = _shard_tokens(tmp_path / "split2", "val")
    assert [d.tolist() for d in val2] == [d.tolist() for d in val] and other["splits"]["val"]["shards"] == 1


def _big_vocab_tokenizer(n: int) -> Tokenizer:
    backend = Backend(models.WordLevel({"<unk>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, n)}},
                                       unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, family=None, roles={"unk": "<unk>", "eos": "</s>"})


def test_vocab_too_large_for_uint16(tmp_path):
    tok = _big_vocab_tokenizer(70_000)
    (tmp_path / "in.txt").write_text("w2 w65535 w65536 w69999\n\nw3 w4\n")
    manifest = prepare([tmp_path / "in.txt"], tok, tmp_path / "auto", val_fraction=0, progress=False)
    assert manifest["dtype"] == "uint32"
    tokens, _ = _shard_tokens(tmp_path / "auto", "train")
    assert tokens.tolist() == [2, 65535, 65536, 69999, 3, 4]
    with pytest.raises(DataError, match=r"--dtype uint16 cannot hold this vocabulary: 70,000 tokens"):
        prepare([tmp_path / "in.txt"], tok, tmp_path / "forced", dtype="uint16", progress=False)
    assert not (tmp_path / "forced").exists()
    small = prepare([tmp_path / "in.txt"], _big_vocab_tokenizer(65_536), tmp_path / "fits", val_fraction=0,
                    progress=False)
    assert small["dtype"] == "uint16"  # ids 0..65535 all fit


def test_injected_failure_then_rerun_matches_a_clean_run(corpus, tok_dir, tmp_path, monkeypatch):
    prepare([corpus], tok_dir, tmp_path / "clean", val_fraction=0.2, shard_mb=SHARD_MB, progress=False)
    writes = []
    real = prepare_module._write_array

    def failing(path, array):
        writes.append(path)
        if len(writes) == 9:
            raise OSError("disk full (injected)")
        return real(path, array)

    monkeypatch.setattr(prepare_module, "_write_array", failing)
    with pytest.raises(OSError, match="injected"):
        prepare([corpus], tok_dir, tmp_path / "run", val_fraction=0.2, shard_mb=SHARD_MB, progress=False)
    partial = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert not partial["complete"] and 1 <= len(partial["chunks"]) < 5
    assert not list((tmp_path / "run").rglob("*.tmp"))
    with pytest.raises(DataError, match="preparation incomplete"):
        read_manifest(tmp_path / "run")

    # Rerun: finished chunks are skipped (not re-tokenised), the rest is written, bytes match.
    monkeypatch.setattr(prepare_module, "_write_array", real)
    encoded = []
    backend_cls = type(Tokenizer.load(tok_dir).backend)
    original = backend_cls.encode_batch_fast
    monkeypatch.setattr(backend_cls, "encode_batch_fast",
                        lambda self, docs, **kw: encoded.append(len(docs)) or original(self, docs, **kw))
    prepare([corpus], tok_dir, tmp_path / "run", val_fraction=0.2, shard_mb=SHARD_MB, progress=False)
    assert sum(encoded) < 300 - 10
    assert _tree(tmp_path / "run") == _tree(tmp_path / "clean")


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import lmforge.data.prepare as p
    calls = []
    real = p.atomic_write_bytes

    def dying(path, data):
        calls.append(path)
        if len(calls) == 7:  # half-write a temporary file, then die without any cleanup
            tmp = path.parent / f".{path.name}.crash.tmp"
            tmp.write_bytes(bytes(data)[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, data)

    p.atomic_write_bytes = dying
    p.prepare([sys.argv[1]], sys.argv[2], sys.argv[3], val_fraction=0.2, shard_mb=float(sys.argv[4]),
              progress=False)
""")


def test_killed_process_then_rerun_matches_a_clean_run(corpus, tok_dir, tmp_path):
    prepare([corpus], tok_dir, tmp_path / "clean", val_fraction=0.2, shard_mb=SHARD_MB, progress=False)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(corpus), str(tok_dir), str(run), str(SHARD_MB)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert list(run.rglob(".*.crash.tmp"))  # the kill left a half-written temporary behind...
    assert not json.loads((run / "manifest.json").read_text())["complete"]
    assert main(["data", "prepare", "--tokenizer", str(tok_dir), "--out", str(run), "--val-fraction", "0.2",
                 "--shard-mb", str(SHARD_MB), "--no-progress", str(corpus)]) == 0
    assert not list(run.rglob("*.tmp"))  # ...which the rerun removed
    assert _tree(run) == _tree(tmp_path / "clean")


def test_finished_folder_is_skipped_and_foreign_settings_refused(corpus, tok_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = prepare([corpus], tok_dir, out, val_fraction=0.1, shard_mb=SHARD_MB, progress=False)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(prepare_module, "_write_array", lambda *a: pytest.fail("a finished shard was rewritten"))
    assert prepare([corpus], tok_dir, out, val_fraction=0.1, shard_mb=SHARD_MB, progress=False) == first
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    with pytest.raises(DataError, match="prepared with different val_fraction; pass --overwrite"):
        prepare([corpus], tok_dir, out, val_fraction=0.2, shard_mb=SHARD_MB, progress=False)
    monkeypatch.undo()
    again = prepare([corpus], tok_dir, out, val_fraction=0.2, shard_mb=SHARD_MB, overwrite=True, progress=False)
    assert again["settings"]["val_fraction"] == 0.2 and verify(out) == []


def test_empty_inputs_fail_and_leave_nothing(tok_dir, tmp_path):
    (tmp_path / "e1.txt").write_text("")
    (tmp_path / "e2.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"no text in the inputs \(.*e1.txt, .*e2.jsonl\): every file is empty"):
        prepare([tmp_path / "e1.txt", tmp_path / "e2.jsonl"], tok_dir, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "ok.txt").write_text("some text\n")
    with pytest.warns(UserWarning, match="e1.txt: no documents"):
        prepare([tmp_path / "e1.txt", tmp_path / "ok.txt"], tok_dir, tmp_path / "out", val_fraction=0,
                progress=False)


def test_bad_bytes_midway_leave_only_complete_shards(corpus, tok_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sources, "BLOCK", 4096)  # decode errors surface at the block holding the bad byte
    good = "\n\n".join(_doc(i) for i in range(100)).encode() + b"\n\n"
    payload = good + b"bad \xff byte\n\nmore text\n"
    (tmp_path / "bad.txt").write_bytes(payload)
    out = tmp_path / "out"
    args = ["data", "prepare", "--tokenizer", str(tok_dir), "--out", str(out), "--shard-mb", str(SHARD_MB),
            "--no-progress", str(tmp_path / "bad.txt")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"bad.txt: invalid UTF-8 at byte {len(good) + 4} (line 201)" in err and "--errors replace" in err
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {s[k] for c in manifest["chunks"] for s in (c["train"], c["val"]) if s for k in ("bin", "idx")}
    on_disk = {str(p.relative_to(out)) for p in out.glob("*/*") if p.parent.name in ("train", "val")}
    assert listed == on_disk and not list(out.rglob("*.tmp"))
    assert main(args + ["--errors", "replace"]) == 0  # resumes after the finished chunks
    _, docs = _shard_tokens(out, "train")
    _, val = _shard_tokens(out, "val")
    tok = Tokenizer.load(tok_dir)
    assert any("\ufffd" in tok.decode(d.tolist()) for d in docs + val)


def test_cli_errors_name_the_problem(tok_dir, tmp_path, capsys):
    assert main(["data", "prepare", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "o"),
                 str(tmp_path / "missing.txt")]) == 2
    assert "input not found: " in capsys.readouterr().err
    (tmp_path / "rows.jsonl").write_text('{"text": "a"}\n{"txt": "b"}\n')
    assert main(["data", "prepare", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "o"), "--no-progress",
                 str(tmp_path / "rows.jsonl")]) == 2
    assert "rows.jsonl: line 2: no field 'text' (fields: txt)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["data", "info", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
