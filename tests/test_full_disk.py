"""A real full disk and a real read-only folder under every writing command: exit 3, one line naming the path,
the previous output intact, and (pretrain, finetune, distill, align) ``--resume`` after space is freed continues exactly.

Not injected errno: the writes of Python's file API *and* of the libraries that write for themselves
(safetensors' Rust writer, numpy, faiss, matplotlib, TensorBoard's background thread) meet a real small
filesystem. As root (CI) that is a tmpfs of a few MB, filled from the test, and the same tmpfs remounted
read-only (chmod does not stop root). Where mount is refused, the full disk falls back to ``RLIMIT_FSIZE`` in a
child process (the write itself fails, EFBIG) and the read-only case to a chmod-ed folder, written by a child
with an ordinary user's view of permissions (root without CAP_DAC_OVERRIDE, through ``setpriv``); only the
mechanism changes, never the case. ``LMFORGE_TEST_NO_MOUNT=1`` runs the fallbacks where mount works.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from tests import task_helpers as th

FAST = ["--no-progress", "--no-tensorboard", "--precision", "fp32", "--batch-size", "4"]
TINY = ["--override", "n_layers=1", "--override", "d_model=32", "--override", "n_heads=2", "--override", "d_ff=64"]
ROOT = os.geteuid() == 0
DISK_KB = 6144  # room for any one command's output below (the largest, a quantised copy, is ~1 MB)


# ---------------------------------------------------------------------------------------- mechanisms
def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)  # busy: detach now, free when unused


def _can_mount() -> bool:
    if not ROOT or not shutil.which("mount"):
        return False
    probe = Path(tempfile.mkdtemp())
    try:
        if not _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)):
            return False
        _umount(probe)
        return True
    finally:
        probe.rmdir()


# LMFORGE_TEST_NO_MOUNT=1 runs the fallbacks even where mount works (to check them).
MOUNT = _can_mount() and not os.environ.get("LMFORGE_TEST_NO_MOUNT")
SETPRIV = shutil.which("setpriv")  # util-linux: runs a child without chosen capabilities


class Disk:
    """A small folder whose file system can be made full or read-only for real.

    tmpfs (as root): :meth:`fill` writes a filler file until ENOSPC and :meth:`free` removes it; :meth:`read_only`
    remounts the tmpfs read-only. Without mount, :meth:`run` runs the command in a child process under
    ``RLIMIT_FSIZE`` (full) or, on a chmod-ed folder, without the capabilities that let root ignore it.
    """

    def __init__(self, path: Path):
        self.path = path
        self.state = "writable"
        self.leave = 0

    def fill(self, leave: int = 0) -> None:
        """No space left but ``leave`` bytes (page-rounded by tmpfs)."""
        self.state, self.leave = "full", leave
        if not MOUNT:
            return
        filler = self.path / ".filler"
        with open(filler, "ab", buffering=0) as f:  # unbuffered: a failed write leaves nothing to flush at close
            for chunk in (b"\0" * 65536, b"\0" * 4096):
                with contextlib.suppress(OSError):
                    while True:
                        f.write(chunk)
        if leave:
            os.truncate(filler, max(0, filler.stat().st_size - leave))

    def free(self) -> None:
        self.state = "writable"
        if MOUNT:
            if not _mount("-o", "remount,rw", str(self.path)):
                raise RuntimeError(f"cannot remount {self.path} read-write")
            (self.path / ".filler").unlink(missing_ok=True)
        else:
            _chmod_tree(self.path, writable=True)

    def read_only(self) -> None:
        if not MOUNT and ROOT and not SETPRIV:
            self.fill()  # no way to refuse root a write here: the case still runs, on a full disk
            return
        self.state = "read-only"
        if MOUNT:
            assert _mount("-o", "remount,ro", str(self.path))
        else:
            _chmod_tree(self.path, writable=False)

    def run(self, args: list[str], capsys) -> tuple[int, str]:
        """(exit code, stderr) of ``lmforge ARGS`` on this disk as it is now."""
        if MOUNT or self.state == "writable" or (self.state == "read-only" and not ROOT):
            capsys.readouterr()
            code = main(args)
            return code, capsys.readouterr().err
        limit = max(self.leave, 1)
        prelude = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))" \
            if self.state == "full" else ""
        script = textwrap.dedent(f"""
            import sys
            {prelude}
            from lmforge.cli.main import main
            sys.exit(main({args!r}))
        """)
        # Root without the capabilities that override file modes: a folder's missing w bit stops it, as any user.
        command = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search,-fowner"] \
            if self.state == "read-only" else []
        result = subprocess.run([*command, sys.executable, "-c", script], capture_output=True, text=True)
        return result.returncode, result.stderr


def _chmod_tree(path: Path, writable: bool) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_dir():
            p.chmod(0o777 if writable else 0o555)


@contextlib.contextmanager
def small_disk(tmp_path: Path, kb: int = DISK_KB) -> Iterator[Disk]:
    """A tmpfs of ``kb`` KiB at ``tmp_path/disk`` (unmounted afterwards, also on failure), or a plain folder."""
    path = tmp_path / "disk"
    path.mkdir()
    mounted = MOUNT and _mount("-t", "tmpfs", "-o", f"size={kb}k,mode=0777", "tmpfs", str(path))
    assert mounted or not MOUNT
    try:
        yield Disk(path)
    finally:
        if mounted:
            _umount(path)


# ---------------------------------------------------------------------------------------- checks
def tree(path: Path) -> dict[str, str] | None:
    """sha256 of every file under ``path`` (lock files and the filler aside), of ``path`` itself, or None."""
    if not path.exists():
        return None
    if path.is_file():
        return {"": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith((".lmforge.lock", ".filler"))}


def one_line(stderr: str, disk: Disk, words: str) -> str:
    """The command's one error line: it names a path on the disk and says what the disk did."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and errors[0] == lines[-1] and lines[-1].startswith("lmforge "), stderr
    assert ": error: cannot " in lines[-1] and str(disk.path) in lines[-1] and words in lines[-1], lines[-1]
    return lines[-1]


def leftovers(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name]


WORDS = {"full": ("no space left", "file-size limit"), "read-only": ("read-only", "permission denied")}


def words(disk: Disk) -> str:
    return WORDS[disk.state][0 if MOUNT else 1]


# ---------------------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Tiny inputs on the ordinary disk: a bert tokenizer, body, shards and task model; a gpt policy and pairs."""
    root = tmp_path_factory.mktemp("full_disk")
    tok = th.tokenizer(root, "bert")
    tok.save(root / "tok")
    base = checkpoint.save(th.body("bert", tok, n_layers=1), root / "base", tokenizer=tok)
    train = th.write_sentiment(root / "train.tsv", 16)
    (root / "texts.txt").write_text("a good film\nbad film\nthe plot was dull\n", encoding="utf-8")
    # Enough documents that the HNSW graph is the index folder's largest file: a filling disk meets faiss' writer.
    (root / "docs.txt").write_text("".join(f"{t} {i}\n" for i, (t, _) in enumerate(th.sentiment_rows(300))),
                                   encoding="utf-8")
    prepare([th.corpus(root)], root / "tok", root / "data", val_fraction=0.1, progress=False)
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out",
                 str(root / "task"), "--max-steps", "1", *FAST]) == 0
    assert main(["convert", "to-hf", str(base), str(root / "hf")]) == 0
    gpt_tok = th.tokenizer(root / "gpt", "gpt") if (root / "gpt").mkdir() is None else None
    policy = checkpoint.save(th.body("gpt", gpt_tok, n_layers=1), root / "policy", tokenizer=gpt_tok)
    pairs = [{"prompt": "the film was", "chosen": " good", "rejected": " bad"}] * 8
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    grid = {"command": "pretrain", "settings": {"model": "bert-tiny", "objective": "mlm", "data": str(root / "data"),
                                                "overrides": {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64},
                                                "seq_len": 16, "batch_size": 2, "eval_every": 0, "save_every": 2,
                                                "precision": "fp32", "device": "cpu"},
            "axes": [{"name": "lr", "variants": [{"name": "low", "lr": 1e-3}]}], "seeds": [0],
            "budget": {"steps": 2}, "metrics": ["train_loss"]}
    (root / "grid.yaml").write_text(yaml.safe_dump(grid, sort_keys=False), encoding="utf-8")
    return {"root": root, "base": base, "train": train, "data": root / "data", "task": root / "task" / "model",
            "hf": root / "hf", "policy": policy, "pairs": root / "pairs.jsonl", "grid": root / "grid.yaml"}


def pretrain_args(env, out: Path, steps: int, *extra: str) -> list[str]:
    return ["pretrain", "--model", "bert-tiny", "--objective", "mlm", "--data", str(env["data"]), "--out", str(out),
            "--max-steps", str(steps), "--seq-len", "16", "--save-every", "2", "--eval-every", "0", *TINY, *FAST,
            *extra]


def finetune_args(env, out: Path, steps: int, *extra: str) -> list[str]:
    return ["finetune", "--model", str(env["base"]), "--task", "classify", "--train", str(env["train"]), "--out",
            str(out), "--max-steps", str(steps), "--save-every", "2", *FAST, *extra]


def distill_args(env, out: Path, steps: int, *extra: str) -> list[str]:
    return ["distill", "--teacher", str(env["base"]), "--data", str(env["data"]), "--out", str(out), "--max-steps",
            str(steps), "--seq-len", "16", "--save-every", "2", "--eval-every", "0", *FAST, *extra]


def align_args(env, out: Path, steps: int, *extra: str) -> list[str]:
    return ["align", "--policy", str(env["policy"]), "--train", str(env["pairs"]), "--out", str(out), "--max-steps",
            str(steps), "--save-every", "2", *FAST, *extra]


LORA = ["--peft", "lora", "--peft-option", "r=4", "--peft-option", "alpha=8"]
JOBS = {"pretrain": pretrain_args, "finetune": finetune_args, "distill": distill_args, "align": align_args,
        "finetune lora": lambda env, out, steps, *extra: finetune_args(env, out, steps, *LORA, *extra)}


# Each writing command: its arguments writing OUT (a name on the disk), and whether a good earlier output is
# made first (commands that refuse an existing OUT start in a fresh one, which a failure must not leave behind).
COMMANDS = {
    "pretrain": ("run", lambda env, out: pretrain_args(env, out, 2), False),
    "finetune": ("run", lambda env, out: finetune_args(env, out, 2), False),
    "data prepare": ("data", lambda env, out: ["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out",
                                               str(out), "--no-progress", "--overwrite",
                                               str(env["root"] / "corpus.txt")],
                     # the same inputs and settings again are found prepared and skipped: a new seed rewrites
                     lambda env, out: ["data", "prepare", "--tokenizer", str(env["root"] / "tok"), "--out", str(out),
                                       "--no-progress", "--seed", "7", str(env["root"] / "corpus.txt")]),
    "tokenizer train": ("tok", lambda env, out: ["tokenizer", "train", "--kind", "wordpiece", "--family", "bert",
                                                 "--vocab-size", "120", "--min-frequency", "1", "--no-progress",
                                                 "--out", str(out), str(env["root"] / "corpus.txt")], True),
    "embed": ("v.npy", lambda env, out: ["embed", "--model", str(env["base"]), "--input",
                                         str(env["root"] / "texts.txt"), "--output", str(out), "--quiet"], True),
    "index build": ("idx", lambda env, out: ["index", "build", "--model", str(env["base"]), "--docs",
                                             str(env["root"] / "docs.txt"), "--out", str(out), "--quiet"], True),
    "index build faiss": ("idx", lambda env, out: ["index", "build", "--model", str(env["base"]), "--docs",
                                                   str(env["root"] / "docs.txt"), "--out", str(out), "--quiet",
                                                   "--backend", "faiss"], True),
    "predict": ("p.jsonl", lambda env, out: ["predict", "--model", str(env["task"]), "--data", str(env["train"]),
                                             "--output", str(out)], True),
    "quantize": ("q", lambda env, out: ["quantize", "--model", str(env["policy"]), "--to", "int8", "--out",
                                        str(out)], True),
    "convert to-hf": ("hf", lambda env, out: ["convert", "to-hf", str(env["base"]), str(out), "--overwrite"], True),
    "convert from-hf": ("lm", lambda env, out: ["convert", "from-hf", str(env["hf"]), str(out), "--overwrite"],
                        True),
    "distill": ("run", lambda env, out: distill_args(env, out, 2), False),
    "align": ("run", lambda env, out: align_args(env, out, 2), False),
    "experiment run": ("exp", lambda env, out: ["experiment", "run", str(env["grid"]), "--out", str(out),
                                                "--threads", "1"], False),
    "quickstart": ("qs", lambda env, out: ["quickstart", "--out", str(out), "--minutes", "1", "--no-progress"],
                   False),
    "attention": ("maps", lambda env, out: ["attention", "--model", str(env["base"]), "a good film", "--out",
                                            str(out)], True),
}


@pytest.mark.parametrize("state", ["full", "read-only"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_real_full_or_read_only_disk_is_one_line_and_keeps_the_previous_output(env, tmp_path, capsys, command,
                                                                                 state):
    name, args, earlier = COMMANDS[command]
    with small_disk(tmp_path) as disk:
        out = disk.path / name
        if earlier:
            code, err = disk.run((args if earlier is True else earlier)(env, out), capsys)
            assert code == 0, err
        before = tree(out)
        disk.fill() if state == "full" else disk.read_only()
        code, err = disk.run(args(env, out), capsys)
        assert code == 3, err
        one_line(err, disk, words(disk))
        assert tree(out) == before
        assert not leftovers(disk.path)
        disk.free()


# ---------------------------------------------------------------------------------------- resume after a full disk
def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def _weights(folder: Path) -> dict:
    """Every tensor of every .safetensors file under a model folder (a model's, a LoRA adapter's, a task head's)."""
    from safetensors.torch import load_file

    return {f"{p.relative_to(folder)}:{k}": v for p in sorted(folder.rglob("*.safetensors"))
            for k, v in load_file(str(p)).items()}


@pytest.mark.parametrize("job", list(JOBS))
def test_a_disk_that_fills_at_a_checkpoint_keeps_the_last_good_one_and_resume_reproduces(env, tmp_path, capsys,
                                                                                         job):
    args = JOBS[job]
    # The same two runs (2 steps, then resumed to 4: the schedule spans each run's max_steps) on an ordinary disk.
    reference = tmp_path / "reference"
    assert main(args(env, reference, 2, "--keep-checkpoints", "1")) == 0
    assert main(args(env, reference, 4, "--resume")) == 0
    with small_disk(tmp_path) as disk:
        run = disk.path / "run"
        code, err = disk.run(args(env, run, 2, "--keep-checkpoints", "1"), capsys)
        assert code == 0, err
        checkpoints = run / "checkpoints"
        before, model = tree(checkpoints), tree(run / "model")  # the 2-step run's model folder
        # Room for the small files of steps 3-4 (metrics, the lock), not for a checkpoint: it fails in the middle
        # of one, in safetensors' writer or a JSON file after it.
        disk.fill(leave=_size(checkpoints / "step-00000002") // 2)
        code, err = disk.run(args(env, run, 4, "--resume", "--keep-checkpoints", "1"), capsys)
        assert code == 3, err
        line = one_line(err, disk, words(disk))
        assert str(checkpoints / "step-00000004") in line, line
        assert tree(checkpoints) == before and (checkpoints / "latest").read_text().strip() == "step-00000002"
        assert tree(run / "model") == model and not leftovers(disk.path)
        disk.free()
        code, err = disk.run(args(env, run, 4, "--resume"), capsys)
        assert code == 0, err
        assert _losses(run) == _losses(reference) and len(_losses(run)) == 4
        mine, theirs = _weights(run / "model"), _weights(reference / "model")
        assert mine and mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)


# ---------------------------------------------------------------------------------------- every write of a command
# A command fails where the disk fills: at the first write with no room at all, later with more. Each command is
# run with more room each time, until it succeeds; every failure must be the clean one, and the failures must reach
# the files the libraries write themselves (safetensors, faiss, numpy, tokenizers' JSON, matplotlib's PNG).
SWEEP = {
    "quantize": "model.safetensors",
    "convert to-hf": "model.safetensors",
    "convert from-hf": "model.safetensors",
    "index build faiss": "hnsw.faiss",
    "embed": "v.npy",
    "tokenizer train": "tok",  # tokenizers' JSON comes back as text, written by Python into the staged folder
    "attention": ".png",
}


@pytest.mark.parametrize("command", list(SWEEP))
def test_more_and_more_room_fails_cleanly_at_each_write_up_to_the_library_files(env, tmp_path, capsys, command):
    name, args, _ = COMMANDS[command]
    named = []
    with small_disk(tmp_path) as disk:
        out = disk.path / name
        for leave in sorted({4096 * round(1.5 ** i) for i in range(22)} | {0}):  # 0, 4 KiB, ... 6 MiB
            disk.fill(leave)
            code, err = disk.run(args(env, out), capsys)
            said = words(disk)
            disk.free()
            if code == 0:
                break
            assert code == 3, err
            line = one_line(err, disk, said)
            named.append(line.split(": error: cannot ", 1)[1].split(": ", 1)[0])
            assert tree(out) is None and not leftovers(disk.path), line  # a failed first write leaves nothing
            assert not out.exists(), line
        assert code == 0, named
    print(command, named)
    assert any(SWEEP[command] in n for n in named), named


# ---------------------------------------------------------------------------------------- TensorBoard
@pytest.mark.skipif(not MOUNT, reason="needs a second file system for OUT/tensorboard alone (mount as root)")
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's traceback
@pytest.mark.parametrize("when", ["at the start", "mid-run"])
def test_a_full_disk_under_tensorboard_degrades_to_one_warning_and_the_run_goes_on(env, tmp_path, capsys, when):
    # TensorBoard writes from a background thread; its events are a second copy of metrics.jsonl. Its own full
    # disk (OUT/tensorboard on a tmpfs of its own) stops the events with one warning, and the run finishes.
    steps = 24  # about 10 KB of step events: more than the 4 KiB left "mid-run"
    reference = tmp_path / "reference"
    assert main(pretrain_args(env, reference, 2)) == 0 and main(pretrain_args(env, reference, steps, "--resume")) == 0
    run = tmp_path / "run"
    with_events = lambda *args: [a for a in pretrain_args(env, run, *args) if a != "--no-tensorboard"]  # noqa: E731
    assert main(with_events(2)) == 0
    events = run / "tensorboard"
    kept = tree(events)
    assert _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(events))
    try:
        Disk(events).fill(leave=0 if when == "at the start" else 4096)
        capsys.readouterr()
        assert main(with_events(steps, "--resume")) == 0
        err = capsys.readouterr().err
    finally:
        _umount(events)
    assert "Traceback" not in err and "Exception in thread" not in err, err
    warned = [line for line in err.splitlines() if "TensorBoard events stopped" in line]
    assert len(warned) == 1 and f"cannot write {events}: no space left" in warned[0], err
    assert tree(events) == kept  # below the tmpfs, the first run's events are as they were
    assert _losses(run) == _losses(reference) and len(_losses(run)) == steps


@pytest.mark.skipif(not MOUNT, reason="in-process only on a real small file system (mount as root)")
def test_a_full_disk_in_the_metrics_log_is_one_fault_at_the_write_and_at_close(tmp_path):
    from lmforge.errors import EnvironmentFault
    from lmforge.training.logging import RunLogger

    with small_disk(tmp_path, kb=64) as disk:
        logger = RunLogger(disk.path, 0, 1000, progress=False, tensorboard=False)
        disk.fill()
        with pytest.raises(EnvironmentFault, match=f"cannot append to {disk.path / 'metrics.jsonl'}: no space left"):
            for step in range(1, 1000):  # the last page of metrics.jsonl takes some records first
                logger.log({"step": step, "loss": 1.0, "text": "x" * 200})
        # What the disk refused is still in the file's buffer: closing flushes it again, and fails the same way.
        with pytest.raises(EnvironmentFault, match="no space left"):
            logger.close()
        assert logger._file.closed
        disk.free()


def test_a_disk_that_fills_inside_an_experiment_cell_ends_the_experiment_with_exit_3_and_retry_finishes(
        env, tmp_path, capsys):
    args = COMMANDS["experiment run"][1]
    with small_disk(tmp_path) as disk:
        code, err = disk.run(args(env, disk.path / "first"), capsys)
        assert code == 0, err
        exp = disk.path / "exp"
        disk.fill(leave=_size(disk.path / "first") // 2)  # the cell starts, its run folder does not fit
        code, err = disk.run(args(env, exp), capsys)
        assert code == 3, err
        one_line(err, disk, words(disk))
        disk.free()
        code, err = disk.run([*args(env, exp), "--retry-failed"], capsys)
        assert code == 0, err
        assert [r["status"] for r in map(json.loads, (exp / "results.jsonl").read_text().splitlines())] == ["ok"]


# ---------------------------------------------------------------------------------------- library exceptions
def test_library_exceptions_that_carry_an_errno_become_the_one_fault():
    # The exceptions of the writers measured above (their messages verbatim) and DCP's, which wraps each rank's.
    from torch.distributed.checkpoint.api import CheckpointException

    from lmforge.errors import EnvironmentFault
    from lmforge.utils.faults import environment_errors, library_errno

    full = OSError(errno.ENOSPC, "No space left on device")
    cases = {
        "safetensors": Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
        "safetensors, read-only": Exception('Error while serializing: I/O error: Read-only file system (os error 30) '
                                            'at path "/d/.tmpT1Uyjp"'),
        "faiss": RuntimeError("Error in void faiss::write_HNSW(const HNSW*, IOWriter*) at index_write.cpp:362: "
                              "Error: 'ret == (size)' failed: write error in /d/f.faiss: 10331 != 34320 (No space "
                              "left on device)"),
        "tokenizers": Exception("No space left on device (os error 28)"),
        "dcp": CheckpointException("save failed", {1: (full, None)}),
    }
    for name, exc in cases.items():
        code = library_errno(exc)
        assert code in (errno.ENOSPC, errno.EROFS), name
        with pytest.raises(EnvironmentFault, match="cannot write /d/x: (no space left|the file system is read-only)"):
            with environment_errors("/d/x", "write"):
                raise exc
    for unrelated in (RuntimeError("shape mismatch"), KeyError("os error"), OSError("100000 requested")):
        assert library_errno(unrelated) is None
        with pytest.raises(type(unrelated)):
            with environment_errors("/d/x", "write"):
                raise unrelated
