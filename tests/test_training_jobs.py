"""What a finished job keeps and reports: ``--final-checkpoint full|weights|none``, ``--threads``, the progress
bar's name, the summary line and the loop/total times in metrics.jsonl."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.training.logging import read_metrics
from lmforge.training.state import OPTIMIZER_FILE, CheckpointManager
from lmforge.training.trainer import Trainer
from tests import task_helpers as th
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401


def _args(data, out, **settings):
    # A constant LR: extending max_steps leaves the schedule of the steps already taken unchanged, so an
    # extended run can be compared with an unbroken one step for step.
    return pretrain_args("clm", data, out, **{"eval_every": 0, "save_every": 100, "schedule": "constant",
                                              "warmup": 0, "seed": 3, **settings})


def _weights(out):
    return load_file(str(out / "model" / checkpoint.WEIGHTS_FILE))


@pytest.fixture(scope="module")
def gpt_data(data_root):  # noqa: F811
    return prepared(data_root, "gpt")


@pytest.fixture
def unbroken(gpt_data, tmp_path_factory):  # per test: with the same torch threads as the test (fp32 sums)
    out = tmp_path_factory.mktemp("unbroken") / "run"
    assert main(_args(gpt_data, out, max_steps=4)) == 0
    return out


def test_full_final_checkpoint_keeps_the_optimizer_and_extends_bit_exactly(gpt_data, unbroken, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(gpt_data, out, max_steps=2)) == 0  # full is the default
    folder = CheckpointManager(out / "checkpoints").latest_valid()[0]
    assert (folder / OPTIMIZER_FILE).is_file()
    capsys.readouterr()
    assert main(["pretrain", "--no-progress", "--out", str(out), "--resume", "--max-steps", "4"]) == 0
    assert "holds no optimizer state" not in capsys.readouterr().err
    ours, theirs = _weights(out), _weights(unbroken)
    assert [k for k in theirs if not torch.equal(ours[k], theirs[k])] == []
    assert [r["loss"] for r in read_metrics(out / "metrics.jsonl")] == \
        [r["loss"] for r in read_metrics(unbroken / "metrics.jsonl")]


def test_weights_final_checkpoint_drops_the_optimizer_and_an_extension_restarts_it(gpt_data, unbroken, tmp_path,
                                                                                  capsys):
    out = tmp_path / "run"
    assert main(_args(gpt_data, out, max_steps=2, final_checkpoint="weights")) == 0
    summary = capsys.readouterr().out
    assert "final checkpoint weights:" in summary and "none saves" in summary
    folder = CheckpointManager(out / "checkpoints").latest_valid()[0]  # passes its manifest check
    assert not (folder / OPTIMIZER_FILE).exists()
    assert json.loads((folder / "trainer_state.json").read_text())["optimizer"] is None
    assert main(["pretrain", "--no-progress", "--out", str(out), "--resume", "--max-steps", "4"]) == 0
    err = capsys.readouterr().err
    assert "holds no optimizer state" in err and "optimizer restarts" in err
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # The first two steps are the unbroken run's; after them fresh AdamW moments take other steps.
    theirs = read_metrics(unbroken / "metrics.jsonl")
    assert [r["loss"] for r in records[:3]] == [r["loss"] for r in theirs[:3]]
    assert not all(torch.equal(a, b) for a, b in zip(_weights(out).values(), _weights(unbroken).values()))


def test_none_final_checkpoint_keeps_only_the_model(gpt_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(gpt_data, out, max_steps=3, save_every=1, final_checkpoint="none")) == 0
    assert not (out / "checkpoints").exists()
    assert (out / "model" / checkpoint.WEIGHTS_FILE).is_file()
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loop ")]
    assert line and "final checkpoint none: 0 MB" in line[0]


def test_a_run_stopped_before_the_end_keeps_a_full_checkpoint_whatever_final_checkpoint_says(gpt_data, tmp_path):
    from lmforge.training.config import TrainConfig
    from lmforge.training.pretrain import build_pretraining

    out = tmp_path / "run"
    config = TrainConfig(model="gpt-tiny", objective="clm", data=str(gpt_data), out=str(out), max_steps=4,
                         batch_size=2, seq_len=32, eval_every=0, precision="fp32", progress=False, tensorboard=False,
                         final_checkpoint="weights", overrides={"n_layers": 1, "d_model": 32, "n_heads": 2,
                                                                "d_ff": 64})
    result = build_pretraining(config).trainer.fit(steps=2)
    assert result.stopped_by == "steps" and result.kept is None
    assert (result.checkpoint / OPTIMIZER_FILE).is_file()


def test_the_summary_and_metrics_give_loop_time_total_time_and_tokens_per_second(gpt_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(gpt_data, out, max_steps=2)) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loop ")][0]
    assert " s, total " in line and " tokens/s" in line and "final checkpoint full:" in line
    assert "final_checkpoint weights saves" in line
    last = read_metrics(out / "metrics.jsonl")[-1]
    assert last["total_s"] >= last["wall_s"] > 0 and last["tokens_per_s"] > 0


def test_threads_reaches_torch(gpt_data, tmp_path, monkeypatch):
    seen = []
    fit = Trainer.fit

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", spy)
    before = torch.get_num_threads()
    try:
        assert main(_args(gpt_data, tmp_path / "run", max_steps=1) + ["--threads", "1"]) == 0
        assert seen == [1]
        torch.set_num_threads(2)
        assert main(_args(gpt_data, tmp_path / "run2", max_steps=1) + ["--threads", "2"]) == 0
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_threads_below_one_is_a_one_line_error(capsys):
    assert main(["model", "info", "gpt-tiny", "--threads", "0"]) == 2
    assert "--threads 0: must be >= 1" in capsys.readouterr().err


def test_every_leaf_command_takes_threads():
    import argparse

    from lmforge.cli.main import build_parser

    def leaves(parser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield parser
        for action in subs:
            for sub in action.choices.values():
                yield from leaves(sub)

    missing = [p.prog for p in leaves(build_parser()) if "--threads" not in p._option_string_actions]
    assert missing == [] and "--threads" not in build_parser()._option_string_actions


def test_the_progress_bar_names_the_job(tmp_path, capsys):
    tok = th.tokenizer(tmp_path, "bert")
    base = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out",
                 str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "8", "--eval-every", "0",
                 "--precision", "fp32", "--no-tensorboard"]) == 0
    err = capsys.readouterr().err
    assert "finetune:" in err and "pretrain" not in err
