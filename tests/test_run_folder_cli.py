"""Commands that read a model accept a run folder (its best/, else its model/), and --epochs may be fractional."""

from __future__ import annotations

import json

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from tests import task_helpers as th

COMMON = ["--no-progress", "--no-tensorboard", "--precision", "fp32", "--lr", "1e-3", "--batch-size", "8"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return th.tokenizer(tmp_path_factory.mktemp("tok"), "bert")


@pytest.fixture(scope="module")
def data(tmp_path_factory, tok):
    folder = tmp_path_factory.mktemp("data")
    base = checkpoint.save(th.body("bert", tok), folder / "base", tokenizer=tok)
    return base, th.write_sentiment(folder / "train.tsv", 32), th.write_sentiment(folder / "dev.tsv", 8, seed=1)


def _steps(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_evaluate_and_predict_take_a_run_folder(data, tmp_path, capsys):
    base, train, dev = data
    run = tmp_path / "run"
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--eval", str(dev),
                 "--out", str(run), "--max-steps", "2", "--eval-every", "2", *COMMON]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(dev)]) == 0
    out, err = capsys.readouterr()
    assert f"lmforge evaluate: using {run / 'best'} (its best evaluation)" in err
    assert json.loads(out.strip().splitlines()[-1])["examples"] == 8
    predicted = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(run), "--data", str(dev), "--output", str(predicted)]) == 0
    assert f"using {run / 'best'}" in capsys.readouterr().err
    assert len(predicted.read_text().splitlines()) == 8


def test_a_run_without_evaluation_means_its_final_model(data, tmp_path, capsys):
    base, train, dev = data
    run = tmp_path / "run"
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out", str(run),
                 "--max-steps", "1", *COMMON]) == 0
    assert not (run / "best").exists()
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(dev)]) == 0
    assert f"lmforge evaluate: using {run / 'model'} (its final model)" in capsys.readouterr().err
    # A task folder itself is used as it is, without a note.
    assert main(["evaluate", "--model", str(run / "model"), "--data", str(dev)]) == 0
    assert "using" not in capsys.readouterr().err


def test_generate_takes_a_run_folder(tmp_path, capsys):
    tok = th.tokenizer(tmp_path, "gpt")
    checkpoint.save(th.body("gpt", tok), tmp_path / "run" / "model", tokenizer=tok)
    assert main(["generate", "--model", str(tmp_path / "run"), "--prompt", "good", "--max-new-tokens", "2",
                 "--no-stream"]) == 0
    assert f"lmforge generate: using {tmp_path / 'run' / 'model'} (its final model)" in capsys.readouterr().err


def test_fractional_epochs_are_honoured(data, tmp_path, capsys):
    base, train, _ = data
    run = tmp_path / "run"
    # 32 examples in batches of 8: 4 batches an epoch, so half an epoch is 2 steps, and 1.25 epochs 5 steps.
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out", str(run),
                 "--epochs", "0.5", *COMMON]) == 0
    assert "done: step 2," in capsys.readouterr().out
    run = tmp_path / "run2"
    assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--out", str(run),
                 "--epochs", "1.25", *COMMON]) == 0
    assert "done: step 5," in capsys.readouterr().out
