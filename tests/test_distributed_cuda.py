"""DDP and FSDP2 with NCCL on a GPU, and DCP checkpoints that cross between GPU and CPU.

A lent machine has one GPU, so the NCCL jobs run with world size 1 (``torchrun --nproc-per-node 1``): the
collectives, the NCCL process group, FSDP2's sharded parameters and DCP's save and load all run for real, on one
rank. (NCCL refuses two ranks on one device, so two processes on one GPU are not a configuration it allows.)
The runs must match one plain process on the same GPU, and a sharded checkpoint must load on the other device:
saved by the GPU job, continued on the CPU; saved by a CPU (gloo) job, continued on the GPU.

Skipped on the CPU (``make test``); run with ``pytest --device cuda tests/test_distributed_cuda.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distributed_worker import trainer
from lmforge.training import distributed
from test_distributed_training import WORKER, assert_close_runs, assert_close_weights, metrics, weights
from test_training_pretrain import data_root, prepared  # noqa: F401

pytestmark = pytest.mark.cuda_only
CROSS_DEVICE_TOL = 1e-4  # the same fp32 run on two devices: different kernels, rounding apart


def launch(device: str, data: Path, out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LMFORGE_WORKER_DEVICE": device}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(WORKER), "parity", str(data), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"the one-rank {device} job failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}")


@pytest.fixture(scope="module")
def data(data_root) -> Path:  # noqa: F811
    return prepared(data_root, "gpt")


@pytest.fixture(scope="module")
def nccl_runs(data, tmp_path_factory, device) -> Path:
    out = tmp_path_factory.mktemp("nccl")
    launch(device, data, out)
    return out


@pytest.fixture(scope="module")
def gpu_reference(data, tmp_path_factory, device) -> Path:
    out = tmp_path_factory.mktemp("gpu-one-process") / "ref"
    trainer(data, out, distributed.setup("single", device), strategy="single").fit()
    return out


def test_nccl_ddp_and_fsdp2_match_one_process_on_the_gpu(nccl_runs, gpu_reference):
    for run in ("ddp", "ddp-accum", "fsdp"):
        keys = ("loss",) if run == "ddp-accum" else ("loss", "grad_norm", "eval_loss")
        assert_close_runs(metrics(nccl_runs / run), metrics(gpu_reference), keys=keys)
        assert_close_weights(weights(nccl_runs / run / "model"), weights(gpu_reference / "model"))
    assert torch.distributed.is_nccl_available()


def _continue_from_step_5(checkpoints: Path, out: Path, data: Path, device: str) -> Path:
    shutil.copytree(checkpoints / "step-00000005", out / "checkpoints" / "step-00000005")
    (out / "checkpoints" / "latest").write_text("step-00000005\n")
    t = trainer(data, out, distributed.setup("single", device), strategy="single", resume=True)
    assert t.resume() and t.step == 5
    assert all(p.device.type == device for p in t.model.parameters())
    t._started = True  # resumed by hand above
    t.fit()
    return out


def test_dcp_checkpoint_saved_on_the_gpu_continues_on_the_cpu(nccl_runs, gpu_reference, data, tmp_path):
    out = _continue_from_step_5(nccl_runs / "fsdp" / "checkpoints", tmp_path / "on-cpu", data, "cpu")
    assert_close_runs(metrics(out), metrics(gpu_reference)[5:], keys=("loss",), tol=CROSS_DEVICE_TOL)
    assert_close_weights(weights(out / "model"), weights(gpu_reference / "model"), tol=CROSS_DEVICE_TOL)


def test_dcp_checkpoint_saved_on_the_cpu_continues_on_the_gpu(gpu_reference, data, tmp_path, device):
    launch("cpu", data, tmp_path / "gloo")
    out = _continue_from_step_5(tmp_path / "gloo" / "fsdp" / "checkpoints", tmp_path / "on-gpu", data, device)
    assert_close_runs(metrics(out), metrics(gpu_reference)[5:], keys=("loss",), tol=CROSS_DEVICE_TOL)
    assert_close_weights(weights(out / "model"), weights(gpu_reference / "model"), tol=CROSS_DEVICE_TOL)
