"""Concurrent writers on one run folder: of commands started together on one folder exactly one writes, every
other is refused in one line naming the holder's PID, and no process's clean-up (stale temporaries, a failed
command's own folder) ever removes what a live process holds or writes.

Before the fix, two ``lmforge pretrain`` started 0.05-0.5 s apart on a new folder ended, in 2 of 4 tries, with
neither training: the refused one removed the folder it had seen missing at its start (the winner's folder,
lock and all), and the winner died with ``FileNotFoundError ... ..lmforge.lock.pid.*.tmp``; the refused one
named the holder "unknown" when it read the PID file before the holder had written it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.cli.main import main
from lmforge.errors import EXIT_ENVIRONMENT, RunLocked
from lmforge.utils import lock
from lmforge.utils.io import atomic_write_text, create_folder
from lmforge.utils.lock import GRACE_S, LOCK_FILE, OWNER_FILE, RunFolderLock, refuse_if_held, \
    remove_stale_temporaries, removed_on_failure
from test_faults_lock import locked_out, snapshot
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import _latest, _spawn, _wait_for

def _contender(folder: str, start: float, results, grace: float = GRACE_S, margin: float = 1.0) -> None:
    """One of many commands started at ``start`` on ``folder``: fail-safe wrapper, lock, write, then hold the
    lock ``margin`` s past every waiter's grace."""
    lock.GRACE_S = grace  # this forked process's own
    time.sleep(max(0.0, start - time.time()))
    try:
        with removed_on_failure(folder):
            with RunFolderLock(folder):
                atomic_write_text(Path(folder) / f"written-by-{os.getpid()}", "x")
                time.sleep(grace + margin)
                intact = (Path(folder) / OWNER_FILE).read_text().strip() == str(os.getpid()) \
                    and (Path(folder) / f"written-by-{os.getpid()}").is_file()
            results.put(("held", os.getpid(), intact))
    except RunLocked as exc:
        results.put(("refused", os.getpid(), str(exc)))
    except BaseException as exc:  # noqa: BLE001 - any other outcome is the failure under test
        results.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "existing-folder"])
def test_twenty_processes_started_together_exactly_one_holds_the_rest_name_it(tmp_path, existing):
    folder = tmp_path / "run"
    if existing:
        folder.mkdir()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start = time.time() + 1.0  # every process forked and spinning before the start
    # The holder keeps the lock 4 s past the grace: on a loaded 2-core host a forked process can be scheduled
    # seconds late, and one that starts after the holder let go rightly holds the folder in its turn.
    procs = [ctx.Process(target=_contender, args=(str(folder), start, results, GRACE_S, 4.0)) for _ in range(20)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [o for o in outcomes if o[0] == "error"]
    assert not errors, errors
    held = [o for o in outcomes if o[0] == "held"]
    assert len(held) == 1 and held[0][2], outcomes  # one writer, whose lock note and file nobody removed
    winner = held[0][1]
    refused = [o for o in outcomes if o[0] == "refused"]
    assert len(refused) == 19
    assert all(f"in use by lmforge process {winner};" in o[2] for o in refused), refused
    # Nothing of the winner's was removed by a refused process's clean-up.
    assert (folder / f"written-by-{winner}").is_file() and (folder / LOCK_FILE).is_file()
    assert not (folder / OWNER_FILE).exists()  # released by its holder


def test_two_processes_started_together_twenty_times_in_both_orders(tmp_path):
    """Twenty starts of a pair, the first of the two alternating (and once both at the same instant): one holds,
    the other is refused naming it. A short grace keeps each start under a second; the protocol is the same."""
    ctx = multiprocessing.get_context("fork")
    for trial in range(20):
        folder = tmp_path / f"run-{trial}"
        results = ctx.Queue()
        start = time.time() + 0.2
        offsets = (0.0, 0.0) if trial == 0 else (0.0, 0.005 * (trial % 5)) if trial % 2 else (0.005 * (trial % 5), 0)
        procs = [ctx.Process(target=_contender, args=(str(folder), start + dt, results, 0.2, 0.4)) for dt in offsets]
        for p in procs:
            p.start()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=30)
        assert [o[0] for o in outcomes] == ["held", "refused"], (trial, outcomes)
        assert outcomes[0][2] and f"in use by lmforge process {outcomes[0][1]};" in outcomes[1][2], (trial, outcomes)


def test_stale_temporaries_of_a_live_writer_are_spared(tmp_path):
    """A ``.NAME.PID-<random>.tmp`` goes only when its writer is dead (or is the caller)."""
    dead = multiprocessing.get_context("fork").Process(target=lambda: None)
    dead.start()
    dead.join()
    live = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    live.start()
    try:
        files = {who: tmp_path / f".model.{pid}-abc123.tmp" for who, pid in
                 (("dead", dead.pid), ("live", live.pid), ("self", os.getpid()))}
        files["old-style"] = tmp_path / ".model.abc_12x.tmp"
        for path in files.values():
            path.mkdir()
        removed = remove_stale_temporaries(tmp_path, "model")
        assert sorted(removed) == sorted(files[w] for w in ("dead", "self", "old-style"))
        assert files["live"].is_dir()
    finally:
        live.kill()
        live.join()


def test_a_failed_command_removes_only_the_folder_it_made(tmp_path):
    made, found = tmp_path / "made", tmp_path / "found"
    found.mkdir()
    for folder in (made, found):
        with pytest.raises(ValueError), removed_on_failure(folder):
            create_folder(folder)
            (folder / "config.yaml").write_text("x")
            raise ValueError("fails before its first step")
    assert not made.exists() and (found / "config.yaml").is_file()
    # A folder it made that another process then locked stays: that process is writing there.
    held = tmp_path / "held"
    with pytest.raises(ValueError), removed_on_failure(held):
        create_folder(held)
        with RunFolderLock(held):
            raise ValueError("refused")
    assert not held.exists()  # released first, then removed: nobody held it any more
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def hold() -> None:
        with RunFolderLock(held):
            ready.set()
            done.wait(30)

    with pytest.raises(ValueError), removed_on_failure(held):
        create_folder(held)
        other = ctx.Process(target=hold)
        other.start()
        assert ready.wait(30)
        raise ValueError("refused")
    assert (held / LOCK_FILE).is_file() and (held / OWNER_FILE).read_text().strip() == str(other.pid)
    done.set()
    other.join()


def test_the_probe_refuses_a_held_folder_and_never_a_free_one(tmp_path):
    folder = tmp_path / "run"
    refuse_if_held(folder)  # missing: nothing happens, nothing is created
    assert not folder.exists()
    with RunFolderLock(folder):
        refuse_if_held(folder)  # a process never refuses itself: it holds the folder, it is the writer
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(RunLocked, match=f"in use by lmforge process {holder.pid};"):
            refuse_if_held(folder)
        assert time.monotonic() - began < GRACE_S + 2
    finally:
        holder.kill()
        holder.wait()
    before = snapshot(folder) | {"names": sorted(p.name for p in folder.iterdir())}
    refuse_if_held(folder)
    assert snapshot(folder) | {"names": sorted(p.name for p in folder.iterdir())} == before


def _pair(data: Path, out: Path, delay: float) -> None:
    """Two identical pretrain commands ``delay`` s apart on ``out``: one trains (stopped by SIGTERM once it
    saved a checkpoint), the other is refused in one line naming the first's PID, never a traceback."""
    args = pretrain_args("clm", data, out, max_steps=100_000, save_every=2, eval_every=0)
    first = _spawn(args)
    time.sleep(delay)
    second = _spawn(args)
    deadline = time.monotonic() + 180
    while first.poll() is None and second.poll() is None:
        assert time.monotonic() < deadline, "neither command ended"
        time.sleep(0.05)
    loser, winner = (first, second) if first.poll() is not None else (second, first)
    _, err = loser.communicate(timeout=60)
    assert loser.returncode == EXIT_ENVIRONMENT and locked_out(err, winner.pid), err
    _wait_for(lambda: _latest(out) is not None, winner)  # it trains
    winner.send_signal(signal.SIGTERM)
    _, err = winner.communicate(timeout=120)
    assert winner.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert (out / "checkpoints" / _latest(out)).is_dir() and (out / "metrics.jsonl").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_two_pretrains_started_together_one_trains_the_other_is_refused(data_root, tmp_path, delay):  # noqa: F811
    _pair(prepared(data_root, "gpt"), tmp_path / "run", delay)


def test_a_held_folder_refuses_pretrain_finetune_and_experiment_at_once(data_root, tmp_path, capsys):  # noqa: F811
    """At once: before the model is built (pretrain prints its model line after building it)."""
    from experiment_helpers import LR_AXIS, grid_text, write_grid
    from tests import task_helpers as th

    data = prepared(data_root, "gpt")
    tok = th.tokenizer(tmp_path, "bert")
    from lmforge import checkpoint
    base = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    grid = write_grid(tmp_path, grid_text(data, [LR_AXIS], seeds=(0,), steps=4))
    commands = {
        "pretrain": lambda out: pretrain_args("clm", data, out, max_steps=2, eval_every=0),
        "finetune": lambda out: ["finetune", "--model", str(base), "--task", "classify", "--train", str(train),
                                 "--out", str(out), "--max-steps", "2", "--batch-size", "8", "--no-progress",
                                 "--no-tensorboard", "--precision", "fp32"],
        "experiment": lambda out: ["experiment", "run", str(grid), "--out", str(out)],
    }
    for name, args in commands.items():
        out = tmp_path / f"held-{name}"
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            before = snapshot(out)
            capsys.readouterr()
            assert main(args(out)) == EXIT_ENVIRONMENT, name
            captured = capsys.readouterr()
            assert locked_out(captured.err, holder.pid), (name, captured.err)
            assert "parameters" not in captured.err, name  # refused before building anything
            assert snapshot(out) == before, name
        finally:
            holder.kill()
            holder.wait()


HOLDER = """
import sys, time
from lmforge.utils.lock import RunFolderLock
lock = RunFolderLock(sys.argv[1]).acquire()  # kept: a lock that is garbage-collected is released
print("held", flush=True)
time.sleep(600)
"""
