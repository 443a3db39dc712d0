"""Environment faults in the writing commands: one line on stderr, exit 3 (or 2), the previous output kept.

Faults are injected in-process at the I/O helpers (``os.fsync`` for a full disk, ``tempfile.mkstemp`` /
``mkdtemp`` for a read-only folder), because tests run as root, where chmod cannot make a folder read-only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from lmforge.tokenization import Tokenizer
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


def test_a_full_disk_at_a_checkpoint_keeps_the_last_good_one_newest(env, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(env, out, 2)) == 0
    before = tree(out / "checkpoints")
    replace = os.replace

    def full_at_step_4(src, dst, *args, **kwargs):
        if "step-00000004" in str(dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_at_step_4)
    capsys.readouterr()
    assert main(pretrain_args(env, out, 4, "--resume")) == 3
    line = one_line_error(capsys)
    assert f"cannot write {out / 'checkpoints' / 'step-00000004'}" in line and "no space left" in line, line
    monkeypatch.undo()
    assert tree(out / "checkpoints") == before
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_embed_output_that_is_a_folder_is_one_line(env, tmp_path, capsys):
    (tmp_path / "v.npy").mkdir()
    assert main(COMMANDS["embed"][0](env, tmp_path / "v.npy")) == 3
    assert "it is a folder, not a file" in one_line_error(capsys)


def test_finetune_that_fails_validation_removes_only_the_folder_it_created(env, tmp_path, capsys):
    args = ["finetune", "--model", str(env["base"]), "--task", "classify", "--train", str(env["train"]),
            "--label-column", "nope", "--max-steps", "1", *FAST]
    assert main([*args, "--out", str(tmp_path / "new")]) == 2
    assert "no column 'nope'" in one_line_error(capsys)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert main([*args, "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"  # a folder that was there stays


def test_pretrain_that_fails_before_its_first_step_removes_the_folder_it_created(env, tmp_path, monkeypatch,
                                                                                 capsys):
    with monkeypatch.context() as patch:
        inject(patch, errno.ENOSPC)
        assert main(pretrain_args(env, tmp_path / "run", 2)) == 3
    one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, name", [("convert to-hf", "hf"), ("tokenizer train", "tok"), ("embed", "v.npy"),
                                           ("predict", "p.jsonl")])
def test_a_rerun_removes_the_leftovers_of_a_killed_write(env, tmp_path, capsys, command, name):
    (tmp_path / f".{name}.x1y2abcd.tmp").mkdir()  # as a kill during the write leaves it
    (tmp_path / f".{name}.x1y2abcd.tmp" / "model.safetensors").write_bytes(b"half")
    (tmp_path / f".{name}.k3l4mnop.tmp").write_bytes(b"half")
    (tmp_path / ".other.abcdefgh.tmp").mkdir()  # another output's: not this command's to remove
    assert main(COMMANDS[command][0](env, tmp_path / name)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.abcdefgh.tmp", name]


def test_files_follow_the_umask_in_model_tokenizer_and_export_folders(env, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        tok = Tokenizer.load(env["root"] / "tok")
        checkpoint.save(th.body("bert", tok), tmp_path / "model", tokenizer=tok)
        assert main(COMMANDS["tokenizer train"][0](env, tmp_path / "tok")) == 0
        assert main(["convert", "to-hf", str(env["base"]), str(tmp_path / "hf")]) == 0
        assert main(COMMANDS["embed"][0](env, tmp_path / "v.npy")) == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    assert {"model/config.json", "model/model.safetensors", "model/tokenizer.json", "tok/tokenizer.json",
            "hf/model.safetensors", "hf/tokenizer.json", "v.npy"} <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode != (0o755 if (tmp_path / name).is_dir() else 0o644)} == {}


# ------------------------------------------------------------------ smaller cases: input files
def test_prompt_file_that_is_a_folder_or_not_utf8_is_named(env, tmp_path, capsys):
    generate = ["generate", "--model", str(env["base"]), "--no-stream", "--prompt-file"]
    assert main([*generate, str(tmp_path)]) == 2
    assert f"--prompt-file {tmp_path}: is a folder, not a file" in one_line_error(capsys)
    bad = tmp_path / "prompt.txt"
    bad.write_bytes("café au lait".encode("utf-8") + b" \xff\xfe rest")
    assert main([*generate, str(bad)]) == 2
    assert f"--prompt-file {bad}: not UTF-8 at byte 14" in one_line_error(capsys)


def test_embed_input_that_is_a_folder_or_not_utf8_is_named(env, tmp_path, capsys):
    embed = ["embed", "--model", str(env["base"]), "--output", str(tmp_path / "v.npy"), "--input"]
    assert main([*embed, str(tmp_path)]) == 2
    assert f"--input {tmp_path}: is a folder, not a file; give a file" in one_line_error(capsys)
    bad = tmp_path / "texts.txt"
    bad.write_bytes(b"ok\n\x80bad\n")
    assert main([*embed, str(bad)]) == 2
    assert f"{bad}: not UTF-8 at byte 3" in one_line_error(capsys)
    assert not (tmp_path / "v.npy").exists()


def test_a_bom_before_a_tsv_header_is_dropped_and_invisible_names_are_shown(env, tmp_path, capsys):
    tsv = tmp_path / "corpus.tsv"
    tsv.write_text("\ufefftext\tlabel\nthe good film\t1\nthe bad film\t0\n", encoding="utf-8")
    assert main(["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out", str(tmp_path / "d"),
                 "--no-progress", "--val-fraction", "0", str(tsv)]) == 0
    capsys.readouterr()
    tsv.write_text("\ufefftext\tlabel \nthe good film\t1\n", encoding="utf-8")
    assert main(["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out", str(tmp_path / "e"),
                 "--no-progress", "--text-field", "label", str(tsv)]) == 2
    assert "(columns: text, 'label ')" in one_line_error(capsys)


def test_a_task_data_file_that_is_not_utf8_is_named_with_its_byte_offset(env, tmp_path, capsys):
    bad = tmp_path / "rows.tsv"
    bad.write_bytes(b"text\tlabel\nab\xffc\t1\n")
    assert main(["predict", "--model", str(env["task"]), "--data", str(bad), "--output", str(tmp_path / "p.jsonl")]) == 2
    assert f"{bad}: not UTF-8 at byte 13 (b'\\xffc\\t1')" in one_line_error(capsys)
    assert not (tmp_path / "p.jsonl").exists()


def test_prompt_and_embedding_data_that_is_a_folder_or_not_utf8_is_one_line(tmp_path):
    from lmforge.cli.prompt import read_rows
    from lmforge.embeddings.sbert import read_rows as read_pairs
    from lmforge.errors import LmforgeError

    for read in (read_rows, read_pairs):
        with pytest.raises(LmforgeError, match="is a folder, not a file"):
            read(str(tmp_path))
    for name in ("rows.tsv", "rows.jsonl"):
        (tmp_path / name).write_bytes(b"text\tlabel\n\xc3(\t1\n")
        for read in (read_rows, read_pairs):
            with pytest.raises(LmforgeError, match=f"{name}: not UTF-8 at byte 11"):
                read(str(tmp_path / name))


def test_a_full_disk_in_the_metrics_log_is_one_line_naming_it(tmp_path, monkeypatch):
    from lmforge.errors import EnvironmentFault
    from lmforge.training import logging as run_logging

    logger = run_logging.RunLogger(tmp_path, 0, 2, progress=False, tensorboard=False)

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        flush = close = write

    logger._file = FullDisk()
    with pytest.raises(EnvironmentFault, match=f"cannot append to {tmp_path / 'metrics.jsonl'}: no space left"):
        logger.log({"step": 1, "loss": 1.0})
    monkeypatch.setattr(run_logging, "open", _raise(errno.EROFS), raising=False)
    with pytest.raises(EnvironmentFault, match="metrics.jsonl: the file system is read-only"):
        run_logging.RunLogger(tmp_path, 0, 2, progress=False, tensorboard=False)


def test_a_real_file_size_limit_in_embed_keeps_the_previous_array(env, tmp_path):
    # RLIMIT_FSIZE makes the write itself fail (EFBIG), as a full disk does, in a child process.
    out = tmp_path / "v.npy"
    assert main(COMMANDS["embed"][0](env, out)) == 0
    before = out.read_bytes()
    script = textwrap.dedent(f"""
        import resource, sys
        from lmforge.cli.main import main
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
        sys.exit(main({COMMANDS["embed"][0](env, out)!r}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [f"lmforge embed: error: cannot write {out}: the file grew past this "
                                                  "process's file-size limit (ulimit -f); raise it or write less"]
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["v.npy"]


def test_task_data_that_is_a_folder_is_named_as_one(env, tmp_path, capsys):
    assert main(["predict", "--model", str(env["task"]), "--data", str(tmp_path), "--output",
                 str(tmp_path / "p.jsonl")]) == 2
    assert f"{tmp_path}: is a folder, not a file; give a .tsv" in one_line_error(capsys)


def test_embedding_finetune_that_fails_before_a_step_removes_the_folder_it_created(env, tmp_path, capsys):
    assert main(["finetune", "--task", "embedding", "--model", str(env["base"]), "--train", str(env["train"]),
                 "--eval", str(tmp_path), "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert "is a folder, not a file" in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_data_prepare_overwrite_keeps_the_old_shards_until_the_new_ones_are_complete(env, tmp_path, monkeypatch,
                                                                                    capsys, code):
    out = tmp_path / "data"
    prepare([env["root"] / "corpus.txt"], env["root"] / "tok", out, progress=False)
    (out / "notes.txt").write_text("mine")
    before = tree(out)
    args = ["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out", str(out), "--no-progress",
            "--overwrite", "--seed", "1", str(env["root"] / "corpus.txt")]
    with monkeypatch.context() as patch:
        inject(patch, code)
        assert main(args) == 3
    one_line_error(capsys)
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert main(args) == 0  # and when it succeeds, the user's own files stay
    assert json.loads((out / "manifest.json").read_text())["settings"]["seed"] == 1
    assert (out / "notes.txt").read_text() == "mine"
