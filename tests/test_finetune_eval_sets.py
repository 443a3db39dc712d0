"""Further evaluation sets of a fine-tuning run (--eval-set NAME=FILE): scored at every evaluation beside --eval as
eval_<NAME>_<metric>, equal to `lmforge evaluate` of the final model on the same file, kept by --resume, refused
in one line when malformed, and accepted by finetune grids."""

from __future__ import annotations

import json

import pytest
import yaml

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.experiments.grid import GridError, load_grid
from lmforge.tasks.settings import finetune_settings, parse_eval_sets
from tests import task_helpers as th

COMMON = ["--no-progress", "--no-tensorboard", "--precision", "fp32", "--batch-size", "4", "--lr", "3e-3"]


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evalsets")
    tok = th.tokenizer(folder, "bert")
    return {"model": checkpoint.save(th.body("bert", tok), folder / "base", tokenizer=tok),
            "train": th.write_sentiment(folder / "train.tsv", 32, seed=0),
            "dev": th.write_sentiment(folder / "dev.tsv", 12, seed=1),
            "ood1": th.write_sentiment(folder / "ood1.tsv", 10, seed=2),
            "ood2": th.write_sentiment(folder / "ood2.tsv", 14, seed=3)}


def test_two_eval_sets_are_reported_beside_eval_and_equal_evaluate_on_the_final_model(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(files["model"]), "--task", "classify", "--train", str(files["train"]),
                 "--eval", str(files["dev"]), "--eval-set", f"ood1={files['ood1']}", "--eval-set",
                 f"ood-2={files['ood2']}", "--out", str(out), "--max-steps", "4", "--eval-every", "2",
                 "--save-every", "2", *COMMON]) == 0
    printed = capsys.readouterr().out
    evaluations = [r for r in _records(out) if "eval_accuracy" in r]
    assert [r["step"] for r in evaluations] == [2, 4]
    for record in evaluations:
        for name in ("ood1", "ood-2"):
            assert {f"eval_{name}_accuracy", f"eval_{name}_loss"} <= set(record)
    last = evaluations[-1]
    assert "eval set ood1 (step 4): " in printed and "eval set ood-2 (step 4): " in printed
    assert f"accuracy {last['eval_ood1_accuracy']:.4f}" in printed
    saved = yaml.safe_load((out / "finetune.yaml").read_text())
    assert saved["eval_sets"] == {"ood1": str(files["ood1"]), "ood-2": str(files["ood2"])}
    # The last evaluation is of the final model (step 4 = max_steps), which OUT/model holds.
    for name, key in (("ood1", "ood1"), ("ood-2", "ood2")):
        assert main(["evaluate", "--model", str(out / "model"), "--data", str(files[key])]) == 0
        scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert scores["accuracy"] == pytest.approx(last[f"eval_{name}_accuracy"], abs=1e-6)
        assert scores["loss"] == pytest.approx(last[f"eval_{name}_loss"], abs=1e-5)
    # OUT/best is picked by --eval alone
    best = json.loads((out / "best" / "task.json").read_text())["best"]
    assert best["metric"] == "accuracy" and best["value"] == max(r["eval_accuracy"] for r in evaluations)


def test_resume_keeps_the_eval_sets(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(files["model"]), "--task", "classify", "--train", str(files["train"]),
                 "--eval-set", f"ood1={files['ood1']}", "--out", str(out), "--max-steps", "2", "--eval-every", "2",
                 "--save-every", "2", *COMMON]) == 0
    assert main(["finetune", "--out", str(out), "--resume", "--max-steps", "4", *COMMON]) == 0
    assert "eval set ood1 (step 4)" in capsys.readouterr().out
    evaluations = [r for r in _records(out) if "eval_ood1_accuracy" in r]
    assert [r["step"] for r in evaluations] == [2, 4]
    assert not any("eval_accuracy" in r for r in evaluations)  # no --eval: the sets alone, no OUT/best
    assert not (out / "best").exists()
    assert finetune_settings({"out": str(out), "resume": True})["eval_sets"] == {"ood1": str(files["ood1"])}


def test_bad_eval_sets_are_refused_in_one_line_before_anything_is_written(files, tmp_path, capsys):
    cases = {
        "ood1": "--eval-set 'ood1': expected NAME=FILE",
        f"={files['ood1']}": "expected NAME=FILE",
        "ood1=": "--eval-set 'ood1=': expected NAME=FILE",
        f"out_of_domain={files['ood1']}": "the name 'out_of_domain' may hold letters, digits, '.' and '-'",
        f"x={tmp_path / 'nope.tsv'}": f"--eval-set x={tmp_path / 'nope.tsv'}: {tmp_path / 'nope.tsv'}: no such data file",
    }
    for value, message in cases.items():
        out = tmp_path / "run"
        assert main(["finetune", "--model", str(files["model"]), "--task", "classify", "--train",
                     str(files["train"]), "--eval-set", value, "--out", str(out), "--max-steps", "1", *COMMON]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not out.exists()
    assert main(["finetune", "--model", str(files["model"]), "--task", "classify", "--train", str(files["train"]),
                 "--eval-set", f"a={files['ood1']}", "--eval-set", f"a={files['ood2']}", "--out", str(tmp_path / "r"),
                 *COMMON]) == 2
    assert "the name 'a' is given twice" in capsys.readouterr().err
    with pytest.raises(InputFileNotFound):
        parse_eval_sets({"a": "missing.tsv"})
    with pytest.raises(UserInputError, match="expected NAME=FILE"):
        parse_eval_sets({"a": None})
    assert parse_eval_sets({"a": str(files["ood1"])}) == {"a": str(files["ood1"])}


def test_finetune_grids_accept_eval_sets(files, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "command": "finetune", "budget": {"steps": 2}, "seeds": [0],
        "metrics": ["finetune_accuracy", "finetune_ood1_accuracy"],
        "settings": {"model": str(files["model"]), "task": "classify", "train": str(files["train"]),
                     "eval": str(files["dev"]), "eval_sets": {"ood1": "ood1.tsv"}},
        "axes": [{"name": "lr", "variants": [{"name": "small", "lr": 1e-4}]}]}))
    (tmp_path / "ood1.tsv").write_text(files["ood1"].read_text())
    loaded = load_grid(grid)
    assert loaded.cells[0].stages["finetune"]["eval_sets"] == {"ood1": str((tmp_path / "ood1.tsv").resolve())}
    assert loaded.metrics == ["finetune_accuracy", "finetune_ood1_accuracy"]
    bad = yaml.safe_load(grid.read_text())
    bad["metrics"] = ["finetune_ood9_accuracy"]
    grid.write_text(yaml.safe_dump(bad))
    with pytest.raises(GridError, match="unknown metric 'finetune_ood9_accuracy'"):
        load_grid(grid)
