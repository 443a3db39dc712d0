"""The rank program of the distributed tests: ``torchrun --nproc-per-node 2 tests/distributed_worker.py SCENARIO
DATA OUT``. It trains tiny runs with the real Trainer, loaders and checkpoints, and leaves what the tests compare
in OUT (the tests in ``test_distributed_*.py`` read it; rank 0 writes).

Scenarios:
    parity  DDP (batch 4), DDP with accumulation (batch 2 x 2, counting the gradient all-reduces), FSDP (batch 4,
            checkpoints at steps 5 and 10).
    resume  in new processes, after ``parity`` in the same OUT: the FSDP run resumed from its step-5 checkpoint,
            and the DDP run's plain checkpoint loaded into FSDP.
    fail    rank 1 raises at its third batch; the job must end promptly with that error shown.

The ranks train on the CPU with gloo, whatever the machine has; ``LMFORGE_WORKER_DEVICE=cuda`` puts them on
``cuda:LOCAL_RANK`` with NCCL instead (``tests/test_distributed_cuda.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch

import lmforge
from lmforge.data import PackedDataset
from lmforge.training import TrainConfig, Trainer
from lmforge.training import distributed

DEVICE = os.environ.get("LMFORGE_WORKER_DEVICE", "cpu")
STEPS = 10
SEQ_LEN = 16
MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64, "vocab_size": 300,
         "dropout": 0.0, "attn_dropout": 0.0, "ffn_dropout": 0.0}


class RaggedCLM:
    """Causal LM with holes: targets divisible by 3 carry no loss, nor the second half of rows that start with an
    even token. The labels depend only on each row's tokens, so they are the same however the global batch is
    split over ranks and micro-batches, while the ranks' target counts differ from step to step.

    Args:
        fail_rank: raise on this rank at the third call (the ``fail`` scenario); None never fails.
    """

    def __init__(self, fail_rank: int | None = None) -> None:
        self.fail_rank, self.calls = fail_rank, 0

    def __call__(self, blocks: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.fail_rank is not None and self.calls == 3 and torch.distributed.get_rank() == self.fail_rank:
            raise RuntimeError(f"injected failure on rank {self.fail_rank}")
        x = torch.as_tensor(blocks)  # (B, T + 1)
        labels = x[:, 1:].clone()  # (B, T)
        labels[labels % 3 == 0] = -100
        labels[x[:, 0] % 2 == 0, SEQ_LEN // 2:] = -100
        return {"input_ids": x[:, :-1], "labels": labels}

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def config(**settings) -> TrainConfig:
    base = dict(max_steps=STEPS, batch_size=4, lr=1e-3, warmup=2, schedule="cosine", eval_every=5, eval_batches=2,
                save_every=0, precision="fp32", progress=False, tensorboard=False, seed=0)
    return TrainConfig(**{**base, **settings})


def trainer(data: Path, out: Path, ctx, objective=None, **settings) -> Trainer:
    """A tiny GPT on ``data``'s packed blocks; same seed, same initial weights on every rank and in every run."""
    cfg = config(**settings)
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", **MODEL)
    train = PackedDataset(data, SEQ_LEN, cfg.batch_size, seed=0)  # this rank's slice, from the process group
    val = PackedDataset(data, SEQ_LEN, cfg.batch_size, split="val", shuffle=False)
    return Trainer(model, objective or RaggedCLM(), train, cfg, out=out, eval_data=val, dist=ctx)


def count_allreduces(t: Trainer) -> list[int]:
    """Count DDP's bucket all-reduces (then do them as usual)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = [0]

    def hook(group, bucket):
        calls[0] += 1
        return allreduce_hook(group, bucket)

    t._wrapped.register_comm_hook(None, hook)
    return calls


def parity(data: Path, out: Path) -> None:
    with distributed.session("ddp", DEVICE) as ctx:
        comm = {}
        for name, settings in (("ddp", {"batch_size": 4}), ("ddp-accum", {"batch_size": 2, "grad_accum": 2})):
            t = trainer(data, out / name, ctx, strategy="ddp", **settings)
            calls = count_allreduces(t)
            t.fit()
            comm[name] = calls[0] / STEPS

        fsdp_ctx = distributed.setup("fsdp", DEVICE)  # the same group, another strategy
        trainer(data, out / "fsdp", fsdp_ctx, strategy="fsdp", save_every=5).fit()
        if ctx.is_main:
            (out / "comm.json").write_text(json.dumps(comm))


def resume(data: Path, out: Path) -> None:
    """New processes continue the runs of ``parity`` (same OUT) from their checkpoints."""
    with distributed.session("fsdp", DEVICE) as ctx:
        # The FSDP run's step-5 checkpoint, resumed to step 10.
        resumed = out / "fsdp-resumed"
        if ctx.is_main:
            shutil.copytree(out / "fsdp" / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
            (resumed / "checkpoints" / "latest").write_text("step-00000005\n")
        ctx.barrier()
        trainer(data, resumed, ctx, strategy="fsdp", save_every=5, resume=True).fit()

        # A plain (DDP) checkpoint into FSDP: rank 0 reads it, FSDP scatters the slices.
        crossed = trainer(data, out / "ddp-to-fsdp", ctx, strategy="fsdp")
        if ctx.is_main:
            shutil.copytree(out / "ddp" / "checkpoints", out / "ddp-to-fsdp" / "checkpoints")
        ctx.barrier()
        assert crossed.resume()
        crossed.save_checkpoint()  # sharded now: the test compares it with the DDP checkpoint it came from


def fail(data: Path, out: Path) -> None:
    @distributed.recorded  # as `lmforge pretrain` does
    def main() -> None:
        with distributed.session("ddp", DEVICE) as ctx:
            trainer(data, out, ctx, objective=RaggedCLM(fail_rank=1), strategy="ddp", max_steps=1000).fit()

    main()


if __name__ == "__main__":
    torch.set_num_threads(1)
    scenario, data_dir, out_dir = sys.argv[1:4]
    {"parity": parity, "resume": resume, "fail": fail}[scenario](Path(data_dir), Path(out_dir))
