"""`lmforge benchmark glue`: every GLUE task fine-tuned from its official-layout fixture, scored with its
metric, the table's average as the leaderboard computes it, test predictions in the submission format, and a
second run that continues instead of starting over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.evaluation import benchmark_suite, benchmarks
from tests import task_helpers as th

GLUE = Path(__file__).parent / "fixtures" / "benchmarks" / "glue"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


def test_glue_suite_table_average_and_submission(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LMFORGE_GLUE_DIR", raising=False)
    out = tmp_path / "glue"
    argv = ["benchmark", "glue", "--model", str(model_dir), "--data-dir", str(GLUE), "--out", str(out),
            "--max-steps", "1", "--batch-size", "2", "--max-length", "48", "--no-progress", "--no-tensorboard"]
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    assert result["tasks"] == list(benchmark_suite.SUITES["glue"])
    for name in result["tasks"]:  # each task's dev scores are the leaderboard's metrics of its own run
        bench = benchmarks.get(name)
        expected = benchmarks.evaluate(out / name.split("/")[1] / "best", name, GLUE)
        assert result["scores"][name] == pytest.approx(expected, nan_ok=True)
        suffixes = [f"_{s.rsplit('_', 1)[-1]}" for s in bench.evals] if len(bench.evals) > 1 else [""]
        assert set(expected) == {m + s for m in bench.metrics for s in suffixes}
    # The average by hand: a task's metrics averaged, x 100, then the mean over the nine tasks.
    per_task = {n: 100 * sum(m.values()) / len(m) for n, m in result["scores"].items()}
    assert result["task_scores"] == pytest.approx(per_task)
    assert result["average"] == pytest.approx(sum(per_task.values()) / 9)
    assert "**GLUE score** | mean of 9 of 9 task scores" in (out / "table.md").read_text()
    # Submission files: "index<TAB>prediction", one line per test row, AX from the MNLI model.
    files = sorted(p.name for p in (out / "submission").iterdir())
    assert files == sorted(["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "QQP.tsv", "STS-B.tsv", "MNLI-m.tsv", "MNLI-mm.tsv",
                            "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv"])
    mnli = (out / "submission" / "MNLI-m.tsv").read_text().splitlines()
    assert mnli[0] == "index\tprediction" and len(mnli) == 3
    assert all(line.split("\t")[1] in ("contradiction", "entailment", "neutral") for line in mnli[1:])
    stsb = (out / "submission" / "STS-B.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in stsb[1:]] == ["0", "1"] and float(stsb[1].split("\t")[1]) == float(
        stsb[1].split("\t")[1])
    assert (out / "submission" / "AX.tsv").read_text().count("\n") == 3
    # Run again: finished tasks are not trained again.
    before = (out / "cola" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(argv + ["--tasks", "cola,rte"]) == 0
    assert "glue/cola: fine-tuned already" in capsys.readouterr().err
    assert (out / "cola" / "metrics.jsonl").read_text() == before
    assert json.loads((out / "results.json").read_text())["tasks"] == ["glue/cola", "glue/rte"]


def test_suite_bad_input(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LMFORGE_GLUE_DIR", raising=False)
    base = ["benchmark", "glue", "--model", str(model_dir), "--out", str(tmp_path / "g")]
    assert main(base + ["--data-dir", str(GLUE), "--tasks", "cola,mrcp"]) == 2
    assert "--tasks glue/mrcp: not in glue (its tasks: cola, sst2" in capsys.readouterr().err
    assert main(base + ["--data-dir", str(tmp_path)]) == 2  # nothing trained when a file is missing
    assert f"{tmp_path}/CoLA/train.tsv: not found" in capsys.readouterr().err
    assert not (tmp_path / "g" / "cola").exists()
