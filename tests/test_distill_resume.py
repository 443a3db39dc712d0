"""`lmforge distill` runs through the Trainer: killed with SIGKILL after a checkpoint and resumed with
``--out RUN --resume`` alone (the settings come from the run folder), it logs the uninterrupted run's losses and
ends with its weights, bit for bit (fp32, CPU, one thread), for pre-training and for task distillation.
"""

from __future__ import annotations

import signal
from pathlib import Path

from safetensors.torch import load_file

import lmforge
from lmforge.cli.main import main
from test_distill_pretraining import distill_args, teacher  # noqa: F401
from test_distill_task import teacher as task_teacher  # noqa: F401
from test_training_pretrain import data_root  # noqa: F401
from test_training_resume import _latest, _spawn, _wait_for, assert_same_weights, curve, weights

N = 6  # the checkpoint to kill after; the runs are 3N steps, so the kill lands mid-run


def _kill_after_checkpoint(args: list[str], out: Path) -> None:
    proc = _spawn(args)
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _latest(out) == f"step-{N:08d}" and not (out / "model").exists()  # it really stopped mid-run


def test_pretraining_distillation_resumes_exactly_after_sigkill(teacher, tmp_path):  # noqa: F811
    data, folder = teacher
    # dropout 0.1 (the teacher's config), shuffled data, MLM masks, accumulation, evaluation: every stream.
    settings = dict(max_steps=3 * N, save_every=N, grad_accum=2, eval_every=4, eval_batches=1)
    assert lmforge.load(folder).config.dropout > 0

    assert main(distill_args(folder, data, tmp_path / "ref", **settings)) == 0
    out = tmp_path / "killed"
    _kill_after_checkpoint(distill_args(folder, data, out, **settings), out)
    assert main(["distill", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert curve(out) == curve(tmp_path / "ref") and len(curve(out)) == 3 * N
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))


def test_task_distillation_resumes_exactly_after_sigkill(task_teacher, tmp_path):  # noqa: F811
    _, train, dev, folder = task_teacher

    def args(out: Path) -> list[str]:
        return ["distill", "--teacher", str(folder), "--train", str(train), "--eval", str(dev), "--out", str(out),
                "--max-steps", str(3 * N), "--batch-size", "8", "--grad-accum", "2", "--save-every", str(N),
                "--eval-every", "4", "--lr", "3e-3", "--precision", "fp32", "--no-progress", "--no-tensorboard",
                "--override", "dropout=0.1"]

    assert main(args(tmp_path / "ref")) == 0
    out = tmp_path / "killed"
    _kill_after_checkpoint(args(out), out)
    assert main(["distill", "--out", str(out), "--resume", "--no-progress"]) == 0
    keys = ("step", "loss", "lr", "grad_norm", "eval_accuracy", "eval_loss")
    assert curve(out, keys) == curve(tmp_path / "ref", keys) and len(curve(out)) == 3 * N
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))
    assert_same_weights(load_file(str(out / "model" / "task_head.safetensors")),
                        load_file(str(tmp_path / "ref" / "model" / "task_head.safetensors")))
