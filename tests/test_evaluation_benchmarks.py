"""Benchmark tasks by name: every registered task loads its official-layout fixture, fine-tunes a tiny model a
step through `lmforge finetune --task NAME --data-dir`, and is scored with its leaderboard metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats
from sklearn import metrics as skm

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.datasets import benchmarks as layouts
from lmforge.errors import UserInputError
from lmforge.evaluation import benchmarks
from lmforge.tasks.data import read_table
from tests import task_helpers as th

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


def test_list_names_every_suite(capsys):
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("glue/cola", "glue/sst2", "glue/mrpc", "glue/qqp", "glue/stsb", "glue/mnli", "glue/qnli",
                 "glue/rte", "glue/wnli", "glue/ax", "superglue/boolq", "superglue/cb", "superglue/copa",
                 "superglue/multirc", "superglue/rte", "superglue/wic", "superglue/wsc", "squad/v1.1",
                 "squad/v2.0", "swag/swag", "rt-sentiment", "bible-next-verse"):
        assert name in out
    assert main(["tasks", "show", "glue/mnli"]) == 0
    shown = capsys.readouterr().out
    assert "dev_matched" in shown and "MNLI/dev_mismatched.tsv" in shown and "LMFORGE_GLUE_DIR" in shown


def test_unknown_name_lists_the_tasks_with_the_closest(capsys, model_dir, tmp_path):
    with pytest.raises(UserInputError, match=r"unknown task 'glue/mrcp'; did you mean 'glue/mrpc'\? Known tasks: "
                                             r"glue/cola, glue/sst2"):
        benchmarks.get("glue/mrcp")
    assert main(["finetune", "--model", str(model_dir), "--task", "superglue/bolq", "--out", str(tmp_path / "r")]) == 2
    assert "did you mean 'superglue/boolq'?" in capsys.readouterr().err


def test_missing_file_names_the_expected_path_and_the_source(tmp_path, monkeypatch, capsys, model_dir):
    monkeypatch.delenv("LMFORGE_GLUE_DIR", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        read_table("glue/rte:dev")
    assert str(err.value) == ("$LMFORGE_GLUE_DIR/RTE/dev.tsv: not found (pass --data-dir or set LMFORGE_GLUE_DIR); "
                              "glue/rte is not shipped with lmforge: get the official data from "
                              "https://gluebenchmark.com/tasks (download_glue_data.py unpacks glue_data/)")
    assert main(["finetune", "--model", str(model_dir), "--task", "glue/rte", "--data-dir", str(tmp_path),
                 "--out", str(tmp_path / "r")]) == 2
    err_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{tmp_path}/RTE/train.tsv: not found; glue/rte is not shipped" in err_line


def test_official_layouts_read_as_lmforge_rows(monkeypatch):
    monkeypatch.setenv("LMFORGE_GLUE_DIR", str(FIXTURES / "glue"))
    cola = read_table("glue/cola:train")
    assert cola.columns == list(layouts.COLA_NAMES) and cola.rows[2]["sentence"] == 'She "really" likes tea.'
    assert cola.where(1).endswith("train.tsv: row 2 (line 2)")  # no header: row n is line n
    mnli = read_table("glue/mnli:dev_mismatched")
    assert mnli.rows[0]["gold_label"] == "neutral" and mnli.where(0).endswith("row 1 (line 2)")
    monkeypatch.setenv("LMFORGE_SQUAD_DIR", str(FIXTURES / "squad"))
    squad = read_table("squad/v2.0:dev")
    assert squad.rows[2]["answers"] == {"text": [], "answer_start": []}
    monkeypatch.setenv("LMFORGE_SUPERGLUE_DIR", str(FIXTURES / "superglue"))
    multirc = read_table("superglue/multirc:val")
    assert len(multirc) == 4 and multirc.rows[1]["label"] == 0 and multirc.rows[3]["question_id"] == "0-1"
    assert read_table("superglue/boolq:val").rows[0]["label"] == "true"


# A generation task by name (cnn_dm, xsum, wmt14/en-de) needs an LM head, not this encoder: its fixture is read and
# scored in tests/test_benchmarks_more_b.py.
TRAINABLE = [n for n, b in benchmarks.TASKS.items() if n in layouts.LAYOUTS and b.train and b.task != "seq2seq"]


@pytest.mark.parametrize("name", TRAINABLE)
def test_every_benchmark_finetunes_and_scores_from_its_fixture(name, model_dir, tmp_path, capsys, monkeypatch):
    for env, _ in layouts.SUITES.values():
        monkeypatch.delenv(env, raising=False)
    bench = benchmarks.get(name)
    suite = FIXTURES / layouts.LAYOUTS[name].suite
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--task", name, "--data-dir", str(suite), "--max-steps", "1",
                 "--batch-size", "2", "--max-length", "64", "--no-progress", "--no-tensorboard",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    task = json.loads((out / "best" / "task.json").read_text())["spec"]
    assert task["task"] == bench.task and all(task[f"{r}_column"] == c for r, c in bench.columns.items())
    if bench.labels:
        assert task["labels"] == list(bench.labels)
    # Predict the first eval split, then score it by the leaderboard's metric.
    source = bench.source(bench.evals[0])
    assert main(["predict", "--model", str(out / "best"), "--data", source, "--output", str(tmp_path / "p.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    table = read_table(source)
    if bench.task == "qa":
        assert main(["evaluate", "--model", str(out / "best"), "--data", source]) == 0
        scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    else:
        gold = [r[bench.columns["label"]] for r in table.rows]
        groups = [r.get("question_id") for r in table.rows]
        scores = benchmarks.score(name, gold, [p["prediction"] for p in preds], groups)
    for metric in bench.metrics:
        assert metric in scores, (metric, scores)
    # `lmforge tasks evaluate` reports the same metrics on every evaluation split (MNLI: both).
    assert main(["tasks", "evaluate", name, "--model", str(out), "--data-dir", str(suite)]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if len(bench.evals) == 1:
        assert reported == pytest.approx({m: scores[m] for m in bench.metrics}, nan_ok=True)
    else:
        assert set(reported) == {f"{m}_{s.rsplit('_', 1)[-1]}" for m in bench.metrics for s in bench.evals}


def test_mnli_reports_matched_and_mismatched(model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("LMFORGE_GLUE_DIR", raising=False)
    assert main(["finetune", "--model", str(model_dir), "--task", "glue/mnli", "--data-dir", str(FIXTURES / "glue"),
                 "--max-steps", "1", "--no-progress", "--no-tensorboard", "--out", str(tmp_path / "run")]) == 0
    scores = benchmarks.evaluate(tmp_path / "run" / "best", "glue/mnli", FIXTURES / "glue")
    assert set(scores) == {"accuracy_matched", "accuracy_mismatched"}
    with pytest.raises(UserInputError, match="glue/ax has no labelled evaluation split"):
        benchmarks.evaluate(tmp_path / "run" / "best", "glue/ax", FIXTURES / "glue")
    assert len(benchmarks.table("glue/ax", "test", FIXTURES / "glue")) == 2


def test_leaderboard_metrics_equal_the_libraries():
    gold, pred = ["1", "0", "1", "1", "0", "0"], ["1", "0", "0", "1", "1", "0"]
    m = benchmarks.score("glue/cola", gold, pred)
    assert m == {"mcc": pytest.approx(skm.matthews_corrcoef(gold, pred))}
    m = benchmarks.score("glue/qqp", gold, pred)
    assert m["f1"] == pytest.approx(skm.f1_score([int(g) for g in gold], [int(p) for p in pred]))
    assert m["f1"] == pytest.approx(2 / 3) and m["accuracy"] == pytest.approx(4 / 6)  # TP 2, FP 1, FN 1
    g, p = [0.0, 1.5, 3.0, 4.5], [0.2, 1.0, 3.5, 4.0]
    m = benchmarks.score("glue/stsb", g, p)
    assert m["pearson"] == pytest.approx(stats.pearsonr(g, p)[0]) and m["spearman"] == pytest.approx(1.0)
    # MultiRC: F1 over all answers; EM per question (q1 all right, q2 one wrong).
    m = benchmarks.score("superglue/multirc", ["1", "0", "1", "0"], ["1", "0", "1", "1"], ["q1", "q1", "q2", "q2"])
    assert m["em"] == 0.5 and m["f1a"] == pytest.approx(0.8)
    m = benchmarks.score("superglue/cb", ["entailment", "neutral", "contradiction"],
                         ["entailment", "entailment", "contradiction"])
    assert m["f1_macro"] == pytest.approx((2 / 3 + 0 + 1) / 3)
