"""A benchmark name works wherever a task is taken: fine-tune glue/sst2 by name, then evaluate, predict, distil
and run a grid cell by the same name; each equals the same rows given as files, and a test split's submission
file is GLUE's format."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from sklearn import metrics as skm

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.experiments import cell
from lmforge.experiments.grid import CELL_DEFAULTS, load_grid
from tests import task_helpers as th

GLUE = Path(__file__).parent / "fixtures" / "benchmarks" / "glue"
TRAIN = ["--max-steps", "3", "--batch-size", "2", "--max-length", "48", "--eval-every", "3", "--lr", "1e-3",
         "--precision", "fp32", "--no-progress", "--no-tensorboard"]


def _unset_glue_variable(mp) -> None:
    """--data-dir sets the suite's variable in this process; setenv first records it, so teardown removes it."""
    mp.setenv("LMFORGE_GLUE_DIR", "")
    mp.delenv("LMFORGE_GLUE_DIR")


@pytest.fixture(autouse=True)
def no_glue_variable(monkeypatch):
    _unset_glue_variable(monkeypatch)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """glue/sst2 and glue/cola fine-tuned by name (a few steps each)."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        _unset_glue_variable(mp)
        for name in ("sst2", "cola"):
            assert main(["finetune", "--model", str(model_dir), "--task", f"glue/{name}", "--data-dir", str(GLUE),
                         "--out", str(root / name), *TRAIN]) == 0
    return root


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_evaluate_by_name_equals_the_same_rows_as_a_file(runs, tmp_path, capsys):
    run = runs / "sst2"
    assert main(["evaluate", "--model", str(run), "--task", "glue/sst2", "--data-dir", str(GLUE),
                 "--out", str(tmp_path / "d")]) == 0
    by_name = _json(capsys)
    assert set(by_name) == {"accuracy"}
    assert json.loads((tmp_path / "d" / "scores.json").read_text()) == by_name
    # the same dev rows as a file: the task's own evaluate reports the same accuracy
    assert main(["evaluate", "--model", str(run), "--data", str(GLUE / "SST-2" / "dev.tsv")]) == 0
    assert _json(capsys)["accuracy"] == by_name["accuracy"]
    # and by hand from the predictions
    assert main(["predict", "--model", str(run), "--data", str(GLUE / "SST-2" / "dev.tsv"),
                 "--output", str(tmp_path / "p.jsonl")]) == 0
    preds = [json.loads(line)["prediction"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    gold = [r["label"] for r in csv.DictReader((GLUE / "SST-2" / "dev.tsv").open(), delimiter="\t")]
    assert by_name["accuracy"] == pytest.approx(skm.accuracy_score(gold, preds))
    # predict by name writes the file the same rows give
    assert main(["predict", "--model", str(run), "--task", "glue/sst2", "--data-dir", str(GLUE),
                 "--output", str(tmp_path / "q.jsonl")]) == 0
    assert (tmp_path / "q.jsonl").read_text() == (tmp_path / "p.jsonl").read_text()
    assert main(["predict", "--model", str(run), "--data", "glue/sst2:dev", "--data-dir", str(GLUE),
                 "--output", str(tmp_path / "r.jsonl")]) == 0
    assert (tmp_path / "r.jsonl").read_text() == (tmp_path / "p.jsonl").read_text()
    # `lmforge tasks evaluate` is the same scoring
    assert main(["tasks", "evaluate", "glue/sst2", "--model", str(run), "--data-dir", str(GLUE)]) == 0
    assert _json(capsys) == by_name


def test_cola_by_name_equals_a_parquet_of_its_headerless_rows(runs, tmp_path, capsys):
    """CoLA's files have no header: the name supplies the columns; a Parquet file of the rows scores the same."""
    rows = list(csv.reader((GLUE / "CoLA" / "dev.tsv").open(), delimiter="\t", quoting=csv.QUOTE_NONE))
    pq.write_table(pa.table({"sentence": [r[3] for r in rows], "label": [int(r[1]) for r in rows]}),
                   tmp_path / "cola_dev.parquet")
    assert main(["evaluate", "--model", str(runs / "cola"), "--task", "glue/cola", "--data-dir", str(GLUE)]) == 0
    by_name = _json(capsys)
    assert main(["evaluate", "--model", str(runs / "cola"), "--task", "glue/cola",
                 "--data", str(tmp_path / "cola_dev.parquet")]) == 0
    assert _json(capsys) == by_name and set(by_name) == {"mcc"}
    assert main(["predict", "--model", str(runs / "cola"), "--task", "glue/cola", "--data-dir", str(GLUE),
                 "--output", str(tmp_path / "p.jsonl")]) == 0
    preds = [json.loads(line)["prediction"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert by_name["mcc"] == pytest.approx(skm.matthews_corrcoef([r[1] for r in rows], preds))


def test_a_test_split_writes_the_glue_submission_file(runs, tmp_path, capsys):
    run = runs / "sst2"
    out = tmp_path / "submission"
    assert main(["evaluate", "--model", str(run), "--task", "glue/sst2", "--data-dir", str(GLUE), "--split", "test",
                 "--out", str(out)]) == 0
    assert f"wrote 2 predictions to {out / 'SST-2.tsv'}" in capsys.readouterr().err
    lines = (out / "SST-2.tsv").read_text().splitlines()
    assert main(["predict", "--model", str(run), "--task", "glue/sst2", "--data-dir", str(GLUE), "--split", "test",
                 "--output", str(tmp_path / "t.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    test_rows = list(csv.DictReader((GLUE / "SST-2" / "test.tsv").open(), delimiter="\t"))
    assert [p["index"] for p in preds] == [r["index"] for r in test_rows]  # the test split's ids come back
    assert lines == ["index\tprediction"] + [f"{p['index']}\t{p['prediction']}" for p in preds]
    assert not (out / "scores.json").exists()  # a test split has no labels to score


def test_distill_by_name_scores_as_its_files(runs, tmp_path, capsys):
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(runs / "sst2"), "--task", "glue/sst2", "--data-dir", str(GLUE),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "2", "--eval-every", "2", "--lr", "1e-3",
                 "--precision", "fp32", "--no-progress", "--no-tensorboard"]) == 0
    saved = yaml.safe_load((out / "distill.yaml").read_text())["distill"]
    assert (saved["train"], saved["eval"]) == ("glue/sst2:train", "glue/sst2:dev")
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--task", "glue/sst2", "--data-dir", str(GLUE)]) == 0
    by_name = _json(capsys)
    assert main(["evaluate", "--model", str(out), "--data", str(GLUE / "SST-2" / "dev.tsv")]) == 0
    assert _json(capsys)["accuracy"] == by_name["accuracy"]
    assert main(["distill", "--teacher", str(runs / "sst2"), "--task", "glue/stsb", "--data-dir", str(GLUE),
                 "--out", str(tmp_path / "x")]) == 2
    assert "task distillation takes classification tasks; glue/stsb is a 'regress' task" in _error(capsys)


def test_a_grid_cell_by_name_trains_as_the_files_do(model_dir, tmp_path):
    settings = {"model": str(model_dir), "batch_size": 2, "max_length": 48, "lr": 1e-3, "eval_every": 3,
                "precision": "fp32", "schedule": "constant"}
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "command": "finetune", "budget": {"steps": 3}, "seeds": [0], "metrics": ["finetune_accuracy"],
        "settings": {**settings, "task": "glue/sst2", "data_dir": "glue"},  # relative to the grid file
        "axes": [{"name": "lr", "variants": [{"name": "base"}]}]}))
    (tmp_path / "glue").symlink_to(GLUE, target_is_directory=True)
    stage = load_grid(grid).cells[0].stages["finetune"]
    assert stage["task"] == "glue/sst2" and stage["data_dir"] == str((tmp_path / "glue").resolve())
    by_name = cell.finetune_stage(tmp_path / "named", stage, 0, None)
    files = {**settings, **CELL_DEFAULTS, "task": "classify", "text_column": "sentence", "max_steps": 3,
             "train": str(GLUE / "SST-2" / "train.tsv"), "eval": str(GLUE / "SST-2" / "dev.tsv"), "peft": None}
    by_files = cell.finetune_stage(tmp_path / "files", files, 0, None)
    assert by_name["metrics"] == by_files["metrics"] and "finetune_accuracy" in by_name["metrics"]
    losses = [[r.get("loss") for r in map(json.loads, (tmp_path / d / "finetune" / "metrics.jsonl").read_text()
                                         .splitlines())] for d in ("named", "files")]
    assert losses[0] == losses[1]


def test_benchmark_takes_one_task_by_name(model_dir, tmp_path, capsys):
    out = tmp_path / "glue"
    assert main(["benchmark", "glue/rte", "--model", str(model_dir), "--data-dir", str(GLUE), "--out", str(out),
                 "--max-steps", "1", "--batch-size", "2", "--max-length", "48", "--no-progress",
                 "--no-tensorboard"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["tasks"] == ["glue/rte"] and (out / "submission" / "RTE.tsv").is_file()
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out / "rte"), "--task", "glue/rte", "--data-dir", str(GLUE)]) == 0
    assert _json(capsys) == result["scores"]["glue/rte"]
    assert main(["benchmark", "superglue/boolq", "--model", str(model_dir), "--out", str(tmp_path / "s")]) == 2
    assert "unknown benchmark suite 'superglue'" in _error(capsys)


def test_names_are_refused_in_one_line(runs, tmp_path, capsys):
    run = str(runs / "sst2")
    assert main(["evaluate", "--model", run, "--task", "glue/sst", "--data-dir", str(GLUE)]) == 2
    assert "unknown task 'glue/sst'; did you mean 'glue/sst2'?" in _error(capsys)
    assert main(["evaluate", "--model", run, "--task", "glue/sst2", "--data-dir", str(GLUE), "--split", "val"]) == 2
    assert _error(capsys).endswith("--split val: glue/sst2 has no split 'val' (splits: train, dev, test)")
    assert main(["evaluate", "--model", run, "--task", "glue/sst2", "--data-dir", str(GLUE), "--split", "test"]) == 2
    assert _error(capsys).endswith("--split test: glue/sst2's test split has no labels; evaluate writes its "
                                   "submission file there: give --out DIR")
    assert main(["evaluate", "--model", run, "--task", "glue/stsb", "--data-dir", str(GLUE)]) == 2
    assert "was fine-tuned for task 'classify'; glue/stsb is a 'regress' task" in _error(capsys)
    assert main(["evaluate", "--model", run, "--task", "glue/sst2", "--data-dir", str(tmp_path)]) == 2
    assert f"{tmp_path}/SST-2/dev.tsv: not found; glue/sst2 is not shipped" in _error(capsys)
    assert main(["evaluate", "--model", run]) == 2
    assert _error(capsys).endswith("missing --data FILE (or --task NAME, e.g. glue/sst2, with --data-dir)")
