"""DDP and FSDP on two CPU processes (torchrun, gloo) against one process with the double batch, and FSDP's sharded
checkpoints: exact resume on two ranks, loading on one rank, consolidation to a model folder, and a plain checkpoint
loaded into FSDP.

Two torchrun launches (``distributed_worker.py parity``, then ``resume`` in new processes) make every two-rank
run; the single-process reference and the one-rank resume run here. The objective leaves ragged holes in the
labels, so the two ranks' target counts differ at almost every step: the loss normalisation across ranks is
really exercised (local normalisation fails these tests by 2e-4 in the loss).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lmforge
from distributed_worker import STEPS, RaggedCLM, trainer
from lmforge.checkpoint import read_config
from lmforge.cli.main import main
from lmforge.data import PackedDataset
from lmforge.training import distributed
from lmforge.training.dist_checkpoint import consolidate, empty_model, load_training_checkpoint
from lmforge.training.optim import build_optimizer
from lmforge.training.state import CheckpointManager, verify_checkpoint
from test_training_pretrain import data_root, prepared  # noqa: F401

WORKER = Path(__file__).with_name("distributed_worker.py")
TOL = 1e-5


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], env=env, capture_output=True, text=True, timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_close_runs(run: list[dict], ref: list[dict], keys=("loss", "grad_norm", "eval_loss"), tol: float = TOL) -> None:
    assert [r["step"] for r in run] == [r["step"] for r in ref]
    assert [r["targets"] for r in run] == [r["targets"] for r in ref]  # the same global batches
    for a, b in zip(run, ref):
        for key in keys:
            assert (key in a) == (key in b), (a["step"], key)
            if key in a:
                assert abs(a[key] - b[key]) < tol, (a["step"], key, a[key], b[key])


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = TOL) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] - b[name]).abs().max().item() < tol, name


@pytest.fixture(scope="module")
def data(data_root) -> Path:  # noqa: F811
    return prepared(data_root, "gpt")


@pytest.fixture(scope="module")
def launched(data, tmp_path_factory) -> Path:
    """Two torchrun launches into one folder: the runs, then new processes resuming their checkpoints."""
    out = tmp_path_factory.mktemp("two-ranks")
    for scenario in ("parity", "resume"):
        proc = torchrun(str(WORKER), scenario, str(data), str(out))
        if proc.returncode != 0:
            pytest.fail(f"{scenario}: the two-rank job failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                        f"{proc.stderr[-6000:]}")
    return out


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """The same model and data in one process with batch 8 = 2 ranks x 4."""
    out = tmp_path_factory.mktemp("one-rank") / "ref"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer(data, out, distributed.setup("single", "cpu"), strategy="single", batch_size=8).fit()
    finally:
        torch.set_num_threads(threads)
    return out


def test_the_ranks_hold_ragged_target_counts(data):
    # The premise of the parity tests: each step, the two ranks hold different numbers of targets.
    objective = RaggedCLM()
    counts = [[int((objective(PackedDataset(data, 16, 4, seed=0, rank=r, world_size=2).get_batch(0, i))["labels"]
                    != -100).sum()) for r in (0, 1)] for i in range(STEPS)]
    assert sum(a != b for a, b in counts) >= STEPS - 1, counts


def test_ddp_two_ranks_match_one_process_with_the_double_batch(launched, reference):
    assert_close_runs(metrics(launched / "ddp"), metrics(reference))
    assert_close_weights(weights(launched / "ddp" / "model"), weights(reference / "model"))
    assert [r["tokens"] for r in metrics(launched / "ddp")] == [r["tokens"] for r in metrics(reference)]


def test_ddp_accumulation_all_reduces_once_per_step(launched, reference):
    # batch 2 x 2 micro-steps x 2 ranks: the same global batch; no_sync leaves one all-reduce per step, not two.
    comm = json.loads((launched / "comm.json").read_text())
    assert comm["ddp-accum"] == comm["ddp"] >= 1
    assert_close_runs(metrics(launched / "ddp-accum"), metrics(reference), keys=("loss",))
    assert_close_weights(weights(launched / "ddp-accum" / "model"), weights(reference / "model"))


def test_fsdp_two_ranks_match_one_process_with_the_double_batch(launched, reference):
    assert_close_runs(metrics(launched / "fsdp"), metrics(reference))
    assert_close_weights(weights(launched / "fsdp" / "model"), weights(reference / "model"))


def test_fsdp_checkpoint_is_sharded_and_pickle_free(launched):
    folder = launched / "fsdp" / "checkpoints" / "step-00000005"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == ["dcp/shard-00001-model-00001-of-00001.safetensors",
                     "dcp/shard-00002-model-00001-of-00001.safetensors", "manifest.json", "model/config.json",
                     "trainer_state.json"]
    state = verify_checkpoint(folder)
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
    assert [r["data"]["rank"] for r in state["ranks"]] == [0, 1]
    assert json.loads((folder / "manifest.json").read_text())["layout"] == "sharded"
    # Each rank holds about half of every large tensor: the vocabulary table is split by rows.
    shard = [load_file(str(folder / f)) for f in files[:2]]
    assert shard[0]["model.embed_tokens.weight"].shape[0] + shard[1]["model.embed_tokens.weight"].shape[0] == 300


def test_fsdp_resume_on_two_ranks_in_new_processes_is_exact(launched):
    keys = ("step", "loss", "lr", "grad_norm", "eval_loss", "targets")
    whole = [tuple(r.get(k) for k in keys) for r in metrics(launched / "fsdp")]
    resumed = [tuple(r.get(k) for k in keys) for r in metrics(launched / "fsdp-resumed")]
    assert resumed == whole[5:]  # steps 6..10, bit for bit
    a, b = weights(launched / "fsdp" / "model"), weights(launched / "fsdp-resumed" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_checkpoint_loads_on_one_rank_and_continues(launched, reference, data, tmp_path):
    out = tmp_path / "one-rank"
    shutil.copytree(launched / "fsdp" / "checkpoints" / "step-00000005", out / "checkpoints" / "step-00000005")
    (out / "checkpoints" / "latest").write_text("step-00000005\n")
    consolidated = consolidate(out / "checkpoints" / "step-00000005", tmp_path / "step5")

    t = trainer(data, out, distributed.setup("single", "cpu"), strategy="single", batch_size=8, resume=True)
    with pytest.warns(UserWarning, match=r"checkpoint of 2 rank\(s\) on 1: .* the data continues at the same "
                                         r"global sample, and the random streams are new"):
        assert t.resume()
    assert t.step == 5 and t.train_data.state_dict()["batch"] == 5  # 5 x 4 x 2 samples = 5 batches of 8
    loaded = t.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in weights(consolidated).items())
    t._started = True  # resumed by hand above
    t.fit()
    assert_close_runs(metrics(out), metrics(reference)[5:])
    assert_close_weights(weights(out / "model"), weights(reference / "model"))


def test_consolidated_fsdp_checkpoint_is_the_trained_model(launched, tmp_path, capsys):
    dst = tmp_path / "model"
    assert main(["checkpoint", "consolidate", str(launched / "fsdp"), str(dst)]) == 0  # the run's newest
    assert "step-00000010 (sharded)" in capsys.readouterr().err
    model, trained = lmforge.load(dst), lmforge.load(launched / "fsdp" / "model")
    assert model.config == trained.config
    a, b = model.state_dict(), trained.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_consolidate_refuses_damaged_or_missing_checkpoints(launched, tmp_path, capsys):
    assert main(["checkpoint", "consolidate", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    folder = tmp_path / "step-00000005"
    shutil.copytree(launched / "fsdp" / "checkpoints" / "step-00000005", folder)
    shard = folder / "dcp" / "shard-00002-model-00001-of-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert main(["checkpoint", "consolidate", str(folder), str(tmp_path / "out")]) == 2
    assert "shard-00002-model-00001-of-00001.safetensors: checksum mismatch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_plain_checkpoint_loads_into_fsdp(launched):
    # The DDP run's plain step-10 checkpoint, loaded by FSDP on two ranks and saved again sharded, holds the same
    # weights and Adam moments: compare both, each loaded into one plain process.
    single = distributed.setup("single", "cpu")

    def load(folder: Path):
        model = empty_model(read_config(folder / "model"))
        optimizer = build_optimizer(model, 1e-3)
        load_training_checkpoint(folder, model, optimizer, verify_checkpoint(folder), single)
        return model.state_dict(), optimizer.state_dict()["state"]

    plain_model, plain_optim = load(launched / "ddp" / "checkpoints" / "step-00000010")
    sharded = CheckpointManager(launched / "ddp-to-fsdp" / "checkpoints").latest_valid()[0]
    assert (sharded / "dcp").is_dir()
    sharded_model, sharded_optim = load(sharded)
    assert all(torch.equal(plain_model[k], sharded_model[k]) for k in plain_model)
    assert plain_optim.keys() == sharded_optim.keys()
    for index, entry in plain_optim.items():
        for key, value in entry.items():
            assert torch.equal(value, sharded_optim[index][key]), (index, key)
