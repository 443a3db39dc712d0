"""Training that diverges stops: ``max_nonfinite_steps`` steps in a row with a non-finite loss (or gradient
norm) end the run with a one-line error naming the step, the learning rate and the last good checkpoint, which
stays the newest; no model folder is written and the weights the run holds stay finite (updates are skipped).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lmforge
from lmforge.cli.main import main
from lmforge.objectives import build_objective
from lmforge.training import TrainConfig, Trainer
from lmforge.training.trainer import LossOutput, TrainingDiverged
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401

# The library cases train on a plain list of batches, which has no position to checkpoint.
pytestmark = pytest.mark.filterwarnings("ignore:train_data has no state_dict")


def latest(out: Path) -> str:
    return (out / "checkpoints" / "latest").read_text().strip()


def test_pretrain_with_a_huge_learning_rate_stops_with_one_line(data_root, tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    args = pretrain_args("clm", data, out, max_steps=12, lr=1e6, save_every=1, eval_every=0)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "training diverged at step" in lines[0], err
    assert "lr " in lines[0] and f"last good checkpoint is {out.resolve() / 'checkpoints' / latest(out)}" in lines[0]
    assert "done" not in err and "model saved" not in err and not (out / "model").exists()
    step = int(lines[0].split("at step ")[1].split(":")[0])
    assert int(latest(out).split("-")[1]) == step - 3  # the default: three non-finite steps in a row
    weights = load_file(str(out / "checkpoints" / latest(out) / "model" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())


class NanAfter:
    """The model's own loss, made NaN at the steps in ``bad`` (counted in calls, one call per step)."""

    def __init__(self, bad: set[int]) -> None:
        self.bad, self.calls = bad, 0

    def __call__(self, model, batch):
        self.calls += 1
        out = model(**batch)
        loss = out.loss * float("nan") if self.calls in self.bad else out.loss
        return LossOutput(loss, out.n_targets)


def _trainer(tmp_path: Path, bad: set[int], **settings) -> Trainer:
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    data = [torch.randint(0, 50, (4, 17)) for _ in range(4)]
    cfg = TrainConfig(**{"max_steps": 10, "lr": 1e-3, "eval_every": 0, "save_every": 2, "progress": False,
                         "tensorboard": False, "precision": "fp32", "schedule": "constant", **settings})
    return Trainer(model, build_objective("clm", pad_token_id=0), data, cfg, out=tmp_path / "run",
                   loss=NanAfter(bad))


def test_trainer_stops_at_the_kth_nan_loss_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, bad={5, 6, 7, 8})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(UserWarning, match="non-finite loss; update skipped"):
        with pytest.raises(TrainingDiverged, match=r"at step 7: 3 steps in a row .*loss nan, lr 0\.001.*"
                                                   r"step-00000004"):
            trainer.fit()
    out = tmp_path / "run"
    assert latest(out) == "step-00000004" and not (out / "model").exists()
    # The NaN steps changed nothing: the weights are those of step 4, finite.
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    saved = load_file(str(out / "checkpoints" / "step-00000004" / "model" / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in trainer.model.state_dict().items() if k in saved)
    # The lock went with the failed run: the folder can be resumed at once.
    assert _trainer(tmp_path, bad=set(), resume=True).fit().step == 10


def test_fewer_nan_steps_than_the_limit_or_limit_zero_finish(tmp_path):
    with pytest.warns(UserWarning, match="update skipped"):
        result = _trainer(tmp_path / "a", bad={3, 4, 6}).fit()  # never three in a row
    assert (result.step, result.stopped_by) == (10, "max_steps") and result.model_dir.is_dir()
    assert math.isfinite(result.metrics["loss"])
    with pytest.warns(UserWarning, match="update skipped"):
        result = _trainer(tmp_path / "b", bad={3, 4, 5, 6}, max_nonfinite_steps=0).fit()
    assert result.stopped_by == "max_steps"


def test_max_nonfinite_steps_is_checked():
    with pytest.raises(ValueError, match="max_nonfinite_steps=-1 must be >= 0"):
        TrainConfig(max_nonfinite_steps=-1).validate()
