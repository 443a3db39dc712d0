"""The single-process side of distributed training: strategy choice from the launcher's environment, per-rank
seeds, mapping a loader position to another number of ranks, telling a peer's death from a rank's own error,
and the settings' validation. (Two-process behaviour: test_distributed_training.py and _failures.py.)
"""

from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.data import PackedDataset
from lmforge.objectives.clm import CausalLM
from lmforge.training import TrainConfig, Trainer
from lmforge.training.dist_checkpoint import reshard_data_state
from lmforge.training.distributed import is_comm_error, launcher_env, rank_seed, resolve_strategy, setup
from test_training_pretrain import data_root, prepared  # noqa: F401


@pytest.mark.parametrize("strategy, world, expected", [
    ("auto", 1, "single"), ("auto", 8, "ddp"), ("ddp", 1, "ddp"), ("fsdp", 4, "fsdp"), ("single", 1, "single"),
])
def test_strategy_resolution(strategy, world, expected):
    assert resolve_strategy(strategy, world) == expected


def test_strategy_refusals():
    with pytest.raises(ValueError, match="strategy=single under a launcher with WORLD_SIZE=2"):
        resolve_strategy("single", 2)
    with pytest.raises(ValueError, match="strategy='zero3' is not one of auto, single, ddp, fsdp"):
        resolve_strategy("zero3", 1)
    with pytest.raises(ConfigError, match="strategy='fsdp2' is not one of auto, single, ddp, fsdp"):
        TrainConfig.from_dict({"strategy": "fsdp2"}, source="run.yaml")
    with pytest.raises(ConfigError, match="fsdp_reduce_dtype='fp16' is not one of fp32, bf16"):
        TrainConfig.from_dict({"fsdp_reduce_dtype": "fp16"}, source="run.yaml")


def test_setup_reads_the_launcher_environment(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert launcher_env() == (0, 0, 1)
    ctx = setup("auto", "cpu")
    assert (ctx.strategy, ctx.world_size, ctx.device.type, ctx.grouped) == ("single", 1, "cpu", False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launcher_env() == (3, 1, 4)
    with pytest.raises(ValueError, match="strategy=single under a launcher"):
        setup("single", "cpu")


def test_rank_seeds_differ_and_rank_zero_keeps_the_run_seed():
    seeds = [rank_seed(7, r) for r in range(64)]
    assert seeds[0] == 7 and len(set(seeds)) == 64
    assert all(0 <= s < 2**32 for s in seeds)  # numpy's and the objectives' seeding accept them
    assert rank_seed(8, 1) != rank_seed(7, 1)


def test_data_position_maps_to_the_same_global_sample(data_root):  # noqa: F811
    data = prepared(data_root, "gpt")
    two = [PackedDataset(data, 16, 4, seed=3, rank=r, world_size=2) for r in (0, 1)]
    for ds in two:
        ds.load_state_dict({**ds.state_dict(), "batch": 5})  # both ranks did 5 steps: 5 x 4 x 2 = 40 samples
    one = PackedDataset(data, 16, 8, seed=3, rank=0, world_size=1)
    state, repeated = reshard_data_state([d.state_dict() for d in two], one.state_dict())
    assert (state["batch"], repeated) == (5, 0)
    one.load_state_dict(state)
    # The single rank's next batch is global samples 40..47, which the two ranks would have drawn next.
    merged = torch.stack([two[g % 2].get_batch(0, 5)[g // 2 - 20] for g in range(40, 48)])
    assert torch.equal(next(iter(one)), merged)

    three = PackedDataset(data, 16, 4, seed=3, rank=2, world_size=3)
    state, repeated = reshard_data_state([d.state_dict() for d in two], three.state_dict())
    assert (state["batch"], state["rank"], repeated) == (3, 2, 4)  # 40 = 3 x 12 + 4 samples seen again
    three.load_state_dict(state)
    assert reshard_data_state([{"position": 3}], one.state_dict()) == (None, 0)  # not an lmforge loader


def test_trainer_refuses_data_built_for_another_rank(data_root, tmp_path):  # noqa: F811
    data = prepared(data_root, "gpt")
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=300)
    wrong = PackedDataset(data, 16, 4, rank=1, world_size=2)
    with pytest.raises(ValueError, match="train_data serves rank 1 of 2, but this process is rank 0 of 1"):
        Trainer(model, CausalLM(pad_token_id=0), wrong, TrainConfig(precision="fp32"), out=tmp_path)


def test_a_dead_peer_is_told_from_a_rank_own_error():
    reset = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:8599: "
                         "Connection reset by peer")
    assert is_comm_error(reset)
    try:
        try:
            raise reset
        except RuntimeError as exc:
            raise ValueError("checkpoint save failed") from exc
    except ValueError as wrapped:
        assert is_comm_error(wrapped)  # DCP and others wrap the collective's error
    assert not is_comm_error(RuntimeError("CUDA out of memory"))
    assert not is_comm_error(ValueError("labels missing"))


def test_fsdp_options_in_a_group_of_one(data_root, tmp_path):  # noqa: F811
    # Without torchrun, --strategy fsdp forms a process group of one: the FSDP code paths run in a plain process.
    from distributed_worker import trainer

    from lmforge.training import distributed

    data = prepared(data_root, "gpt")
    with distributed.session("fsdp", "cpu") as ctx:
        assert (ctx.strategy, ctx.world_size, torch.distributed.is_initialized()) == ("fsdp", 1, True)

        def losses(name: str, **settings) -> list[float]:
            """Training losses of 3 steps, then the evaluation loss."""
            t = trainer(data, tmp_path / name, ctx, strategy="fsdp", max_steps=3, eval_every=3, **settings)
            t.fit()
            assert type(t.model).__name__ == "FSDPTransformer"  # sharded, even in a group of one
            records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            return [r["loss"] for r in records] + [records[-1]["eval_loss"]]

        plain = losses("plain")
        assert losses("offload", fsdp_cpu_offload=True) == plain
        assert losses("recompute", activation_checkpointing=True) == plain  # recomputed blocks: same gradients
        bf16 = losses("bf16", fsdp_param_dtype="bf16", fsdp_reduce_dtype="bf16")
        assert bf16 != plain and max(abs(a - b) for a, b in zip(bf16, plain)) < 0.05  # bf16 compute: close
    assert not torch.distributed.is_initialized()  # the session closed the group it opened
