"""Forgetting: the pre-training loss before fine-tuning is the Trainer's evaluation of the pre-trained model; a
body that fine-tuning froze forgets nothing, one that trained does; the CLI finds the pre-trained model in the
run's finetune.yaml."""

from __future__ import annotations

import json

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from lmforge.errors import UserInputError
from lmforge.evaluation import forgetting as fg
from tests import task_helpers as th


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forget")
    tok = th.tokenizer(folder, "bert")
    base = checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)
    prepare([th.corpus(folder)], tok, folder / "data", val_fraction=0.3, progress=False)
    train = th.write_sentiment(folder / "train.tsv", n=32)
    runs = {}
    for name, extra in (("frozen", ["--freeze-body"]), ("full", [])):
        out = folder / name
        assert main(["finetune", "--model", str(base), "--task", "classify", "--train", str(train), "--max-steps", "8",
                     "--lr", "0.01", "--batch-size", "8", "--no-progress", "--no-tensorboard", *extra,
                     "--out", str(out)]) == 0
        runs[name] = out
    return base, folder / "data", runs


def test_frozen_body_forgets_nothing_and_a_trained_one_does(setup):
    base, data, runs = setup
    frozen = fg.forgetting(runs["frozen"] / "model", base, data, eval_batches=4)
    assert frozen["objective"] == "mlm" and frozen["after"] == frozen["before"] and frozen["forgetting"] == 0.0
    full = fg.forgetting(runs["full"] / "model", None, data, eval_batches=4)  # base found in finetune.yaml
    assert full["pretrained"] == str(base) and full["before"] == frozen["before"]
    assert abs(full["forgetting"]) > 1e-3
    body, tok = checkpoint.load_body(base)
    assert full["before"] == pytest.approx(fg.pretraining_loss(body, tok, data, "mlm", eval_batches=4))


def test_forgetting_cli_and_bad_input(setup, capsys, tmp_path):
    base, data, runs = setup
    assert main(["evaluate", "--forgetting", "--model", str(runs["full"]), "--data", str(data), "--limit", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) >= {"before", "after", "forgetting"} and result["objective"] == "mlm"
    other_tok = th.tokenizer(tmp_path, "gpt")
    gpt = checkpoint.save(th.body("gpt", other_tok), tmp_path / "gpt", tokenizer=other_tok)
    with pytest.raises(UserInputError, match="does not fit the pre-trained model"):
        fg.forgetting(runs["full"] / "model", gpt, data, eval_batches=1)
    with pytest.raises(UserInputError, match="not a fine-tuned task folder"):
        fg.forgetting(base, base, data)
