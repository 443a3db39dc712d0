"""Environment faults in the writing commands: one line on stderr, exit 3 (or 2), the previous output kept.

Faults are injected in-process at the I/O helpers (``os.fsync`` for a full disk, ``tempfile.mkstemp`` /
``mkdtemp`` for a read-only folder), because tests run as root, where chmod cannot make a folder read-only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from tests import task_helpers as th

FAST = ["--no-progress", "--no-tensorboard", "--precision", "fp32", "--batch-size", "4"]
TINY = ["--override", "n_layers=1", "--override", "d_model=32", "--override", "n_heads=2", "--override", "d_ff=64"]


def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def inject(monkeypatch, code: int) -> None:
    """A full disk fails the flush of what was written; a read-only folder refuses to create any file in it."""
    if code == errno.EROFS:
        monkeypatch.setattr(tempfile, "mkstemp", _raise(code))
        monkeypatch.setattr(tempfile, "mkdtemp", _raise(code))
    else:
        monkeypatch.setattr(os, "fsync", _raise(code))


def tree(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (the run-folder lock's own files aside), or of ``path`` itself."""
    if path.is_file():
        return {"": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".lmforge.lock")}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("lmforge ") and ": error: " in lines[-1], err
    assert "Traceback" not in err, err
    return lines[-1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("envout")
    tok = th.tokenizer(root, "bert")
    tok.save(root / "tok")
    base = checkpoint.save(th.body("bert", tok), root / "base", tokenizer=tok)
    train = th.write_sentiment(root / "train.tsv", 16)
    (root / "texts.txt").write_text("a good film\nbad film\n", encoding="utf-8")
    data = root / "data"
    prepare([th.corpus(root)], root / "tok", data, val_fraction=0.1, progress=False)
    task = root / "task"
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out", str(task),
                 "--max-steps", "1", *FAST]) == 0
    return {"root": root, "base": base, "train": train, "data": data, "task": task / "model"}


def pretrain_args(env, out: Path, steps: int, *extra: str) -> list[str]:
    return ["pretrain", "--model", "bert-tiny", "--objective", "mlm", "--data", str(env["data"]), "--out", str(out),
            "--max-steps", str(steps), "--seq-len", "16", "--save-every", "2", "--eval-every", "0", *TINY, *FAST,
            *extra]


# Each command: (arguments writing to OUT, whether OUT is a folder). OUT holds a good previous output first.
COMMANDS = {
    "pretrain": (lambda env, out: pretrain_args(env, out, 4, "--resume"), True),
    "data prepare": (lambda env, out: ["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out", str(out),
                                       "--no-progress", str(env["root"] / "corpus.txt")],
                     True),
    "finetune": (lambda env, out: ["finetune", "--model", str(env["base"]), "--task", "classify", "--train",
                                   str(env["train"]), "--out", str(out), "--max-steps", "1", *FAST], True),
    "embed": (lambda env, out: ["embed", "--model", str(env["base"]), "--input", str(env["root"] / "texts.txt"),
                                "--output", str(out), "--quiet"], False),
    "tokenizer train": (lambda env, out: ["tokenizer", "train", "--kind", "wordpiece", "--family", "bert",
                                          "--vocab-size", "120", "--min-frequency", "1", "--no-progress", "--out",
                                          str(out), str(env["root"] / "corpus.txt")], True),
    "predict": (lambda env, out: ["predict", "--model", str(env["task"]), "--data", str(env["train"]), "--output",
                                  str(out)], False),
    "convert to-hf": (lambda env, out: ["convert", "to-hf", str(env["base"]), str(out), "--overwrite"], True),
}
OUT_NAMES = {"embed": "v.npy", "predict": "p.jsonl"}


def previous_output(env, command: str, out: Path) -> None:
    """A good output of ``command`` in ``out``, as an earlier run left it."""
    if command == "pretrain":
        assert main(pretrain_args(env, out, 2)) == 0
    elif command not in ("finetune", "data prepare"):  # these two start in a fresh folder and must leave none
        assert main(COMMANDS[command][0](env, out)) == 0


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left"), (errno.EROFS, "read-only")])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_full_or_read_only_disk_is_one_line_and_keeps_the_previous_output(env, tmp_path, monkeypatch, capsys,
                                                                           command, code, words):
    out = tmp_path / OUT_NAMES.get(command, "out")
    previous_output(env, command, out)
    before = tree(out) if out.exists() else None
    capsys.readouterr()
    with monkeypatch.context() as patch:
        inject(patch, code)
        assert main(COMMANDS[command][0](env, out)) == 3
    line = one_line_error(capsys)
    assert words in line and "cannot " in line, line
    assert (tree(out) if out.exists() else None) == before
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_output_path_through_a_file_is_one_line(env, tmp_path, capsys, command):
    # A folder output named by an existing file; a file output inside an existing file.
    blocker = tmp_path / "taken"
    blocker.write_text("keep me")
    args, is_folder = COMMANDS[command]
    out = blocker if is_folder else blocker / OUT_NAMES[command]
    assert main(args(env, out)) in (2, 3)
    line = one_line_error(capsys)
    assert str(blocker) in line and "is a file" in line, line
    assert blocker.read_text() == "keep me"
