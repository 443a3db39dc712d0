"""Exact resume: stopping (in-process, SIGKILL, SIGINT, SIGTERM) and resuming gives the uninterrupted run's
per-step losses, learning rates and final weights bit for bit (fp32, CPU, one thread), and damaged checkpoints
are detected and skipped with a warning.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.cli.main import main
from lmforge.training import CheckpointManager, Schedule, TrainConfig
from lmforge.training.pretrain import build_pretraining
# The prepared-data fixture and the one-thread fixture (bitwise equality across processes needs the same thread
# count, which fixes the reduction order) are shared with the end-to-end tests.
from test_training_pretrain import TINY, data_root, prepared, pretrain_args  # noqa: F401


def config(recipe: str, data: Path, out: Path, **settings) -> TrainConfig:
    """A tiny run that keeps every source of randomness: dropout (the presets' 0.1), shuffled data,
    MLM masking, accumulation over two micro-batches, evaluation in between."""
    preset, _, overrides = TINY[recipe]
    base = dict(model=preset, objective=recipe, data=str(data), out=str(out), overrides=overrides, max_steps=6,
                batch_size=2, grad_accum=2, seq_len=32, warmup=2, schedule="linear", eval_every=3, eval_batches=1,
                save_every=3, precision="fp32", progress=False, tensorboard=False)
    return TrainConfig.from_dict({**base, **settings})


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def curve(out: Path, keys=("step", "loss", "lr", "grad_norm", "eval_loss", "eval_accuracy")) -> list[tuple]:
    return [tuple(r.get(k) for k in keys) for r in metrics(out)]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_stop_and_resume_is_exact(tmp_path: Path, model: str, objective: str, data, overrides) -> None:
    """A 6-step run stopped at step 3 and resumed equals the uninterrupted run: its curve and its weights."""
    def run(name: str, **settings):
        cfg = TrainConfig.from_dict(dict(
            model=model, objective=objective, data=str(data), out=str(tmp_path / name), overrides=overrides,
            max_steps=6, batch_size=2, grad_accum=2, seq_len=32, warmup=2, schedule="linear", eval_every=3,
            eval_batches=1, save_every=3, precision="fp32", progress=False, tensorboard=False, **settings))
        return build_pretraining(cfg).trainer

    run("ref").fit()
    assert run("run").fit(steps=3).step == 3
    assert run("run", resume=True).fit().step == 6
    assert curve(tmp_path / "run") == curve(tmp_path / "ref")
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))


@pytest.mark.parametrize("recipe, workers", [("clm", 0), ("mlm", 0), ("mlm", 1)])
def test_stop_and_resume_in_process_is_exact(recipe, workers, data_root, tmp_path, device):
    # With a DataLoader worker, creating its iterator draws from torch's generator: it must not shift dropout.
    data = prepared(data_root, TINY[recipe][1])
    reference = build_pretraining(config(recipe, data, tmp_path / "ref", num_workers=workers, device=device)).trainer
    reference.fit()

    first = build_pretraining(config(recipe, data, tmp_path / "run", num_workers=workers, device=device)).trainer
    result = first.fit(steps=3)
    assert (result.step, result.stopped_by, result.model_dir) == (3, "steps", None)
    # What a crash after step 3 leaves behind: lines for steps that no checkpoint holds, the last one cut short.
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 99.0}\n{"step": 5, "lo')
    resumed = build_pretraining(config(recipe, data, tmp_path / "run", resume=True, num_workers=workers,
                                       device=device)).trainer
    result = resumed.fit()
    assert (result.step, result.stopped_by) == (6, "max_steps")

    assert curve(tmp_path / "run") == curve(tmp_path / "ref")  # losses, LRs, grad norms, eval: identical
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))
    assert resumed.tokens_seen == reference.tokens_seen
    # The schedule continues where it was: the LR of update s is lr * schedule(s), before and after resume.
    sched = Schedule("linear", 6, warmup=2)
    assert [r["lr"] for r in metrics(tmp_path / "run")] == pytest.approx([3e-4 * sched(s) for s in range(1, 7)])


def test_fit_in_stages_equals_one_fit(data_root, tmp_path, device):
    data = prepared(data_root, "gpt")
    whole = build_pretraining(config("clm", data, tmp_path / "a", eval_every=0, device=device)).trainer
    whole.fit()
    staged = build_pretraining(config("clm", data, tmp_path / "b", eval_every=0, device=device)).trainer
    for _ in range(3):
        staged.fit(steps=2)
    assert curve(tmp_path / "a") == curve(tmp_path / "b")
    assert_same_weights(weights(tmp_path / "a" / "model"), weights(tmp_path / "b" / "model"))


def _flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, what", [
    (lambda ck: _flip_byte(ck / "optimizer.safetensors"), "optimizer.safetensors: checksum mismatch"),
    (lambda ck: (ck / "model" / "model.safetensors").write_bytes(b"\0" * 10), "model.safetensors: checksum mismatch"),
    (lambda ck: (ck / "trainer_state.json").unlink(), "trainer_state.json: missing"),
    (lambda ck: (ck / "manifest.json").unlink(), "manifest.json: missing or unreadable"),
])
def test_corrupt_latest_checkpoint_falls_back_with_a_warning(damage, what, data_root, tmp_path):
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    build_pretraining(config("clm", data, out, max_steps=4, save_every=2, eval_every=0)).trainer.fit()
    original = curve(out)
    damage(out / "checkpoints" / "step-00000004")

    trainer = build_pretraining(config("clm", data, out, max_steps=4, save_every=2, eval_every=0, resume=True)).trainer
    with pytest.warns(UserWarning, match=rf"checkpoint step-00000004 is corrupt \(.*{what}.*falling back"):
        trainer.fit()
    # It resumed from step 2, redid steps 3 and 4 exactly, and replaced the damaged checkpoint.
    assert curve(out) == original
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CheckpointManager(out / "checkpoints").latest_valid()[0].name == "step-00000004"


def test_every_checkpoint_corrupt_is_an_error(data_root, tmp_path, capsys):
    data = prepared(data_root, "gpt")
    args = pretrain_args("clm", data, tmp_path / "run", max_steps=2, save_every=1)
    assert main(args) == 0
    for step in (1, 2):
        _flip_byte(tmp_path / "run" / "checkpoints" / f"step-{step:08d}" / "trainer_state.json")
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "warning: checkpoint step-00000002 is corrupt" in err and "every checkpoint is damaged" in err


def test_rotation_keeps_the_newest_and_cleans_leftovers(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    leftover = out / "checkpoints" / ".step-00000009.x1y2.tmp"  # what a SIGKILL during a save leaves
    leftover.mkdir(parents=True)
    build_pretraining(config("clm", data, out, max_steps=5, save_every=1, keep_checkpoints=2)).trainer.fit()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-00000004", "step-00000005"]
    assert (out / "checkpoints" / "latest").read_text() == "step-00000005\n"
    manifest = json.loads((out / "checkpoints" / "step-00000005" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model/config.json", "model/model.safetensors", "optimizer.safetensors",
                                      "trainer_state.json"}


def test_resume_without_checkpoints_starts_fresh_with_a_warning(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    trainer = build_pretraining(config("clm", data, tmp_path / "run", max_steps=3, resume=True)).trainer
    with pytest.warns(UserWarning, match="no checkpoint to resume from; starting at step 0"):
        assert trainer.fit().step == 3


# ------------------------------------------------------------------------------ real processes
def _spawn(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before the awaited moment:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the run")
        time.sleep(0.002)


def _latest(out: Path) -> str | None:
    try:
        return (out / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return None


def _lines(out: Path) -> int:
    try:
        return (out / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


def test_sigkill_then_resume_matches_the_uninterrupted_run(data_root, tmp_path):
    N = 15
    data = prepared(data_root, "bert")

    def args(out: Path, **settings) -> list[str]:
        return pretrain_args("mlm", data, out, max_steps=2 * N, grad_accum=2, eval_every=5, **settings)

    assert main(args(tmp_path / "ref", save_every=N)) == 0

    # 1. Killed right after the checkpoint at step N is written.
    out = tmp_path / "killed"
    proc = _spawn(args(out, save_every=N))
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _latest(out) == f"step-{N:08d}" and not (out / "model").exists()  # it really stopped mid-run
    assert main(args(out, save_every=N) + ["--resume"]) == 0
    assert curve(out) == curve(tmp_path / "ref")
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))

    # 2. Killed at an arbitrary moment while checkpoints are written every step (save_every does not change
    # the arithmetic, so the reference still applies): `latest` must name an intact checkpoint.
    out = tmp_path / "anytime"
    proc = _spawn(args(out, save_every=1))
    _wait_for(lambda: _latest(out) is not None, proc)
    time.sleep(random.Random(0).uniform(0.0, 0.05))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback needed: what `latest` names is complete
        folder, state = CheckpointManager(out / "checkpoints").latest_valid()
    assert folder.name == _latest(out) and state["step"] < 2 * N
    assert main(args(out, save_every=1) + ["--resume"]) == 0
    assert curve(out) == curve(tmp_path / "ref")
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_save_a_resumable_checkpoint(signum, data_root, tmp_path):
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    args = pretrain_args("clm", data, out, max_steps=100_000, save_every=0, eval_every=0)
    proc = _spawn(args)
    _wait_for(lambda: _lines(out) >= 3, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    stopped = metrics(out)[-1]["step"]
    assert f"stopped by {signal.Signals(signum).name} at step {stopped}" in err
    assert _latest(out) == f"step-{stopped:08d}"  # no periodic saves: the signal wrote it

    # Resumable: continue for two more steps (with a shorter schedule, which only changes the LR).
    assert main(args + ["--resume", "--max-steps", str(stopped + 2)]) == 0
    assert [r["step"] for r in metrics(out)] == list(range(1, stopped + 3))
    assert _latest(out) == f"step-{stopped + 2:08d}"
