"""One writer per run folder: a second process on a locked --out is refused at once (exit 3, one line naming
the holder's PID) without writing anything, the first finishes as if alone, and a killed writer leaves no lock
and no half-replaced folder behind for the next run.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from lmforge.cli.main import main
from lmforge.errors import EXIT_ENVIRONMENT
from lmforge.utils.lock import OWNER_FILE, RunFolderLock
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import _latest, _spawn, _wait_for, assert_same_weights, curve, weights


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def locked_out(err: str, pid: int) -> bool:
    lines = [line for line in err.splitlines() if "error:" in line]
    return len(lines) == 1 and f"in use by lmforge process {pid};" in lines[0] and "Traceback" not in err


def test_a_held_folder_refuses_pretrain_and_resume_untouched(data_root, tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    assert main(pretrain_args("clm", data, out, max_steps=2, eval_every=0)) == 0
    with RunFolderLock(out):
        before = snapshot(out)
        capsys.readouterr()
        assert main(pretrain_args("clm", data, out, max_steps=3, eval_every=0) + ["--resume"]) == EXIT_ENVIRONMENT
        assert locked_out(capsys.readouterr().err, os.getpid())
        assert snapshot(out) == before
    fresh = tmp_path / "fresh"
    with RunFolderLock(fresh):
        before = snapshot(fresh)
        assert main(pretrain_args("clm", data, fresh, max_steps=2, eval_every=0)) == EXIT_ENVIRONMENT
        assert locked_out(capsys.readouterr().err, os.getpid())
        assert snapshot(fresh) == before


def test_two_processes_on_one_folder_the_second_is_refused_the_first_undisturbed(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")

    def args(out: Path) -> list[str]:
        return pretrain_args("clm", data, out, max_steps=6, save_every=2, eval_every=3)

    reference = _spawn(args(tmp_path / "ref"))
    out = tmp_path / "run"
    first = _spawn(args(out))
    _wait_for(lambda: (out / OWNER_FILE).is_file(), first)
    first.send_signal(signal.SIGSTOP)  # it holds the lock: keep it there while the second one tries
    try:
        assert (out / OWNER_FILE).read_text().strip() == str(first.pid)
        before = snapshot(out)
        second = _spawn(args(out))
        _, err = second.communicate(timeout=120)
        assert second.returncode == EXIT_ENVIRONMENT and locked_out(err, first.pid), err
        assert snapshot(out) == before
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    _, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err
    assert curve(out) == curve(tmp_path / "ref")
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))
    assert not (out / OWNER_FILE).exists()


def test_a_writer_killed_while_holding_the_lock_leaves_no_stale_lock(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    args = pretrain_args("clm", data, out, max_steps=100_000, save_every=2, eval_every=0)
    proc = _spawn(args)
    _wait_for(lambda: _latest(out) == "step-00000002", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / OWNER_FILE).read_text().strip() == str(proc.pid)  # its note stays; the OS lock went with it
    step = int(_latest(out).split("-")[1])
    assert main(args + ["--resume", "--max-steps", str(step + 1)]) == 0
    assert (out / "model").is_dir() and not (out / OWNER_FILE).exists()


KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    real = os.replace
    def replace(src, dst):  # atomic_dir moves the old folder aside, then the new one in: die in between
        real(src, dst)
        if str(dst).endswith(".model.old"):
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    from lmforge.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_kill_between_the_renames_of_a_folder_swap_is_recovered_by_the_next_run(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    assert main(pretrain_args("clm", data, out, max_steps=2, eval_every=0)) == 0
    old_model = snapshot(out / "model")
    longer = pretrain_args("clm", data, out, max_steps=3, eval_every=0) + ["--resume"]
    proc = subprocess.run([sys.executable, "-c", KILL_BETWEEN_RENAMES, *longer], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The only complete model folder is the old one, moved aside.
    assert not (out / "model").exists() and snapshot(out / ".model.old") == old_model
    with RunFolderLock(out):  # what the next run does first: the old folder is put back
        assert snapshot(out / "model") == old_model and not (out / ".model.old").exists()
    assert main(longer) == 0
    assert (out / "model" / "model.safetensors").is_file() and not list(out.glob(".*.old"))


def test_a_held_folder_refuses_data_prepare_and_quickstart(data_root, tmp_path, capsys, monkeypatch):  # noqa: F811
    from lmforge.quickstart import runner
    from test_quickstart import _fake_stages

    data = prepared(data_root, "gpt")
    monkeypatch.setattr(runner, "STAGES", tuple(_fake_stages([])))
    commands = {
        "data": ["data", "prepare", "--tokenizer", str(data / "tokenizer"), "--out", str(tmp_path / "data"),
                 "--no-progress", str(data_root / "corpus.txt")],
        "qs": ["quickstart", "--out", str(tmp_path / "qs"), "--minutes", "1", "--no-progress"],
    }
    for name, args in commands.items():
        with RunFolderLock(tmp_path / name):
            before = snapshot(tmp_path / name)
            capsys.readouterr()
            assert main(args) == EXIT_ENVIRONMENT, name
            assert locked_out(capsys.readouterr().err, os.getpid()), name
            assert snapshot(tmp_path / name) == before
        assert main(args) == 0, name  # the lock gone, the same command runs


def test_a_held_folder_refuses_a_peft_finetune_before_it_writes_its_base(tmp_path, capsys):
    from lmforge import checkpoint
    from tests import task_helpers as th

    tok = th.tokenizer(tmp_path, "bert")
    base = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    out = tmp_path / "run"
    # --random-init: the run's base exists nowhere else, so it is saved to OUT/base before the Trainer starts.
    args = ["finetune", "--model", str(base), "--random-init", "--task", "classify", "--train", str(train),
            "--out", str(out), "--max-steps", "2", "--batch-size", "8", "--peft", "lora", "--no-progress",
            "--no-tensorboard", "--precision", "fp32"]
    with RunFolderLock(out):
        before = snapshot(out)
        capsys.readouterr()
        assert main(args) == EXIT_ENVIRONMENT
        assert locked_out(capsys.readouterr().err, os.getpid())
        assert snapshot(out) == before
    assert main(args) == 0
    assert (out / "base" / "config.json").is_file() and (out / "peft.json").is_file()
    assert not (out / OWNER_FILE).exists()
