"""A failure on one rank ends the whole torchrun job promptly, names that rank, and leaves the last checkpoint
intact: SIGKILL of a rank in the middle of an FSDP ``lmforge pretrain``, and an exception raised on one rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import lmforge
from lmforge.cli.main import main
from lmforge.tokenization import Tokenizer
from lmforge.training import CheckpointManager, TrainConfig
from lmforge.training.pretrain import build_pretraining
from helpers import rank_pid
from test_training_pretrain import data_root, pretrain_args, prepared  # noqa: F401

WORKER = Path(__file__).with_name("distributed_worker.py")
PROMPT_S = 60


def _torchrun(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job ended (rc {proc.returncode}) before the awaited moment:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the job")
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, since: float) -> tuple[int, str, float]:
    try:
        out, _ = proc.communicate(timeout=PROMPT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the job was still running {PROMPT_S} s after the failure:\n{proc.communicate()[0][-5000:]}")
    return proc.returncode, out, time.monotonic() - since


def _root_cause(out: str) -> str:
    assert "Root Cause" in out, out[-5000:]
    return out.split("Root Cause", 1)[1]


def test_killing_one_rank_ends_the_job_and_keeps_the_last_checkpoint(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    args = pretrain_args("clm", data, out, max_steps=100_000, save_every=2, eval_every=0, strategy="fsdp")
    proc = _torchrun(["-m", "lmforge.cli.main", *args])
    latest = out / "checkpoints" / "latest"
    _wait_for(lambda: latest.is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 3, proc)
    victim = rank_pid({proc.pid}, 1)
    assert victim is not None, "rank 1's process not found"
    os.kill(victim, signal.SIGKILL)
    rc, text, took = _finish(proc, time.monotonic())

    assert rc != 0 and took < PROMPT_S
    cause = _root_cause(text)
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9", cause), cause
    # Rank 0 was stopped too; whether torchrun's SIGTERM or its own "lost contact" exit came first is a race.
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*\n\s*exitcode\s*:\s*(-15|1) ", text), text[-3000:]

    # The checkpoint `latest` names is complete (no fallback needed), and one rank resumes it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folder, state = CheckpointManager(out / "checkpoints").latest_valid()
    assert folder.name == latest.read_text().strip() and (folder / "dcp").is_dir()
    step = state["step"]
    config = TrainConfig.load(out / "config.yaml").updated({"resume": True, "strategy": "single",
                                                            "max_steps": step + 2, "progress": False})
    trainer = build_pretraining(config).trainer
    with pytest.warns(UserWarning, match=r"checkpoint of 2 rank\(s\) on 1"):
        result = trainer.fit()
    assert result.step == step + 2

    # And the sharded checkpoint consolidates into a self-contained model folder (the run's tokenizer included).
    assert main(["checkpoint", "consolidate", str(folder), str(tmp_path / "model")]) == 0
    assert lmforge.load(tmp_path / "model").config.n_layers == 1
    assert Tokenizer.load(tmp_path / "model").sha256() == Tokenizer.load(out / "tokenizer").sha256()


def test_an_error_on_one_rank_ends_every_rank_and_is_shown(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")
    proc = _torchrun([str(WORKER), "fail", str(data), str(tmp_path / "run")])
    rc, text, took = _finish(proc, time.monotonic())
    assert rc != 0 and took < PROMPT_S
    assert "[rank1]: RuntimeError: injected failure on rank 1" in text  # the rank's own traceback, as it happened
    cause = _root_cause(text)
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", cause) and "injected failure on rank 1" in cause, cause
    assert "Connection reset by peer" not in cause  # rank 0's echo of the failure is not reported as its cause
