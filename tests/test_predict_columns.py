"""`lmforge predict` writes each input row as it came (id, text, gold label, any other column, in file order)
followed by the model's ``prediction`` and ``prediction_<name>`` columns, from every input format."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmforge.cli.main import main
from lmforge.tasks import inference
from lmforge.tasks.data import Table
from lmforge.tasks.finetune import finetune
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th

COLUMNS = ["id", "text", "note", "label"]


def _rows(n: int = 6) -> list[dict[str, str]]:
    return [{"id": f"r{k:02d}", "text": text, "note": f"batch {k % 2}", "label": label}
            for k, (text, label) in enumerate(th.sentiment_rows(n, seed=3))]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict")
    tok = th.tokenizer(folder, "bert")
    train = th.write_sentiment(folder / "train.tsv", 16)
    finetune(th.body("bert", tok), TaskSpec(task="classify"), train, config=th.train_config(steps=2),
             out=folder / "run", tokenizer=tok)
    return folder / "run" / "model"


def _write(path, rows):
    if path.suffix == ".tsv":
        th.write_tsv(path, COLUMNS, [[r[c] for c in COLUMNS] for r in rows])
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.table({c: [r[c] for r in rows] for c in COLUMNS}), path)
    return path


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl", ".parquet"])
def test_every_input_column_is_kept_and_the_prediction_added(model, tmp_path, suffix):
    rows = _rows()
    source = _write(tmp_path / f"in{suffix}", rows)
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(model), "--data", str(source), "--output", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [list(r)[:4] for r in written] == [COLUMNS] * len(rows)  # the input's columns first, in file order
    assert [{c: r[c] for c in COLUMNS} for r in written] == rows  # ids, the extra column, the gold label: as given
    assert all(r["prediction"] in ("0", "1") for r in written)
    probs = [r["prediction_probabilities"] for r in written]
    assert all(set(p) == {"0", "1"} and p[r["prediction"]] == max(p.values()) for p, r in zip(probs, written))
    assert set(written[0]) == {*COLUMNS, "prediction", "prediction_probabilities"}


def test_delimited_output_has_one_probability_column_per_class(model, tmp_path):
    source = _write(tmp_path / "in.tsv", _rows(4))
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--data", str(source), "--output", str(out)]) == 0
    with out.open(newline="", encoding="utf-8") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == [*COLUMNS, "prediction", "prediction_prob_0", "prediction_prob_1"]
    assert [r["id"] for r in read] == ["r00", "r01", "r02", "r03"]
    for r in read:
        assert float(r["prediction_prob_0"]) + float(r["prediction_prob_1"]) == pytest.approx(1.0, abs=1e-5)


def test_the_library_returns_the_same_rows_it_writes(model, tmp_path):
    table = Table("mem", _rows(3), COLUMNS)
    rows = inference.predict(model, table, tmp_path / "p.jsonl")
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rows == written and [r["id"] for r in rows] == ["r00", "r01", "r02"]


@pytest.mark.parametrize("column", ["prediction", "prediction_probabilities"])
def test_an_input_column_named_prediction_is_refused_in_one_line(model, tmp_path, capsys, column):
    source = th.write_tsv(tmp_path / "in.tsv", ["id", "text", column], [["a", "good film", "x"]])
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(model), "--data", str(source), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"lmforge predict: error: in.tsv: the input already has a column {column!r}, where predictions "
                   "are written; rename it"]
    assert not out.exists()


def test_flat_cells_read_back_unambiguously():
    flat = inference._flat({"tokens": ["john", "lives"], "choices": ["in rome", "in lima"], "answers": {"text": ["x"]},
                            "prediction_probabilities": [0.25, None]})
    assert flat == {"tokens": "john lives", "choices": '["in rome", "in lima"]', "answers": '{"text": ["x"]}',
                    "prediction_probabilities": "0.25 "}


def test_a_baselines_predictions_have_the_same_layout(tmp_path, capsys):
    from lmforge.evaluation import baselines

    train = _write(tmp_path / "train.tsv", _rows(16))
    run = baselines.train_baseline("tfidf-logreg", TaskSpec(task="classify"), str(train), out=tmp_path / "b")
    source = _write(tmp_path / "in.jsonl", _rows(4))
    rows = baselines.predict(run["model_dir"], str(source), tmp_path / "p.jsonl")
    assert [{c: r[c] for c in COLUMNS} for r in rows] == _rows(4)
    assert all(list(r) == [*COLUMNS, "prediction", "prediction_probabilities"] for r in rows)
    clash = th.write_tsv(tmp_path / "clash.tsv", ["text", "prediction"], [["good film", "1"]])
    assert main(["predict", "--model", str(run["model_dir"]), "--data", str(clash), "--output",
                 str(tmp_path / "q.jsonl")]) == 2
    assert "clash.tsv: the input already has a column 'prediction'" in capsys.readouterr().err
