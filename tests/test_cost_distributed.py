"""Under torchrun the price tag sums over ranks: device-seconds are every rank's (on a CPU, its CPU seconds per
thread, at most its wall seconds: at most twice the wall time on two ranks), tokens and FLOPs those of the global
batch; only rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401


def test_device_seconds_are_summed_over_ranks(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    args = pretrain_args("clm", data, tmp_path / "run", max_steps=4, eval_every=0, save_every=4, device="cpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                           "lmforge.cli.main", *args], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["total_tokens"] == sum(r["tokens"] for r in records) == 4 * 2 * 2 * 32  # steps x ranks x B x T
    # each rank's device-seconds are its CPU seconds on its one thread, at most its wall seconds (ranks start
    # together, so each one's wall seconds are about rank 0's): summed over two ranks, at most about twice the wall
    assert 0 < last["device_s"] <= last["cpu_s"] * (1 + 1e-6) and last["device_s"] < 2.2 * last["wall_s"]
    tag = json.loads((tmp_path / "run" / "price_tag.json").read_text())
    assert tag["device_s"] == last["device_s"]
    assert tag["total_flops"] == pytest.approx(2 * 4 * tag["flop_check"]["analytic"], rel=1e-9)
    assert 0.95 < tag["flop_check"]["ratio"] < 1.05
