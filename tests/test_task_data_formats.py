"""Task data where people keep it: a Parquet file, a `datasets.save_to_disk` folder and a dataset snapshot's
parquet/arrow shards fine-tune to exactly the batches of the TSV they were made from, evaluate to the same
metrics, and a bad column or a missing split is one line naming the file and the column or split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.tasks import classification, columnar
from lmforge.tasks.data import TaskDataError, read_table
from tests import task_helpers as th

STEPS, BATCH = 4, 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The same rows as TSV, Parquet and snapshot shards (labels as int64, as a dataset's ClassLabel stores them)."""
    root = tmp_path_factory.mktemp("formats")
    train, dev = th.sentiment_rows(40, seed=1), th.sentiment_rows(12, seed=2)
    th.write_tsv(root / "train.tsv", ["text", "label"], train)
    th.write_tsv(root / "dev.tsv", ["text", "label"], dev)

    def table(rows):
        return pa.table({"text": [t for t, _ in rows], "label": pa.array([int(lab) for _, lab in rows], pa.int64())})

    pq.write_table(table(train), root / "train.parquet")
    pq.write_table(table(dev), root / "dev.parquet")
    # The Hub's layout: data/<split>-NNNNN-of-NNNNN.parquet, the training split in two shards.
    snap = root / "snapshot"
    (snap / "data").mkdir(parents=True)
    pq.write_table(table(train[:25]), snap / "data" / "train-00000-of-00002.parquet")
    pq.write_table(table(train[25:]), snap / "data" / "train-00001-of-00002.parquet")
    pq.write_table(table(dev), snap / "data" / "validation-00000-of-00001.parquet")
    # Arrow shards in the IPC stream format datasets writes, one folder per split.
    arrow = root / "arrow"
    for split, rows in (("train", train), ("validation", dev)):
        (arrow / split).mkdir(parents=True)
        with pa.ipc.new_stream(arrow / split / "data-00000-of-00001.arrow", table(rows).schema) as writer:
            writer.write_table(table(rows), max_chunksize=16)
    return {"root": root, "train": train, "dev": dev, "table": table}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


def _finetune(model_dir, train, dev, out, monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Fine-tune a few steps; the collated batches the Trainer drew (training and evaluation), in order."""
    seen = []
    collate = classification._SequenceTask.collate

    def recording(self, examples):
        batch = collate(self, examples)
        seen.append({k: v.clone() for k, v in batch.items()})
        return batch

    monkeypatch.setattr(classification._SequenceTask, "collate", recording)
    code = main(["finetune", "--model", str(model_dir), "--task", "classify", "--train", str(train), "--eval", str(dev),
                 "--max-steps", str(STEPS), "--batch-size", str(BATCH), "--eval-every", str(STEPS), "--lr", "1e-3",
                 "--precision", "fp32", "--no-progress", "--no-tensorboard", "--out", str(out)])
    assert code == 0  # the one-line error is in the captured stderr
    monkeypatch.setattr(classification._SequenceTask, "collate", collate)
    return seen


@pytest.fixture(scope="module")
def reference(model_dir, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("tsv") / "run"
    with pytest.MonkeyPatch.context() as mp:
        return _finetune(model_dir, data["root"] / "train.tsv", data["root"] / "dev.tsv", out, mp), out


def _same(a, b):
    assert len(a) == len(b) and len(a) >= STEPS
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key


def _losses(run: Path) -> list:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("kind", ["parquet", "snapshot", "arrow"])
def test_parquet_and_snapshot_shards_finetune_to_the_tsv_batches(kind, data, model_dir, reference, tmp_path,
                                                                  monkeypatch, capsys):
    root = data["root"]
    train, dev = {"parquet": (root / "train.parquet", root / "dev.parquet"),
                  "snapshot": (f"{root / 'snapshot'}:train", f"{root / 'snapshot'}:validation"),
                  "arrow": (f"{root / 'arrow'}:train", f"{root / 'arrow'}:validation")}[kind]
    batches = _finetune(model_dir, train, dev, tmp_path / "run", monkeypatch)
    _same(batches, reference[0])
    assert _losses(tmp_path / "run") == _losses(reference[1])


def test_save_to_disk_folders_finetune_to_the_tsv_batches(data, model_dir, reference, tmp_path, monkeypatch, capsys):
    datasets = pytest.importorskip("datasets", reason="the optional extra lmforge[datasets] is not installed")
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    make = lambda rows: datasets.Dataset.from_dict(  # noqa: E731
        {"text": [t for t, _ in rows], "label": [int(lab) for _, lab in rows]}, features=features)
    whole = tmp_path / "dd"
    datasets.DatasetDict({"train": make(data["train"]), "validation": make(data["dev"])}).save_to_disk(str(whole))
    batches = _finetune(model_dir, f"{whole}:train", f"{whole}:validation", tmp_path / "run", monkeypatch)
    _same(batches, reference[0])
    # One Dataset saved on its own is read without a split, and a shuffled selection reads in its new order.
    make(data["dev"]).save_to_disk(str(tmp_path / "one"))
    assert read_table(tmp_path / "one").rows == read_table(f"{whole}:validation").rows
    make(data["dev"]).select([3, 1, 2]).save_to_disk(str(tmp_path / "picked"))
    assert [r["text"] for r in read_table(tmp_path / "picked").rows] == [data["dev"][i][0] for i in (3, 1, 2)]
    capsys.readouterr()
    # evaluate by a split of the DatasetDict equals evaluate on the TSV
    best = tmp_path / "run" / "best"
    assert main(["evaluate", "--model", str(best), "--data", str(data["root"] / "dev.tsv")]) == 0
    on_tsv = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["evaluate", "--model", str(best), "--data", f"{whole}:validation"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == on_tsv
    # errors: a missing split names the splits the folder has; a split of a lone Dataset is refused
    assert main(["evaluate", "--model", str(best), "--data", f"{whole}:test"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"lmforge evaluate: error: {whole}: no split 'test' (expected {whole}/test/, as dataset_dict.json "
                    "lists it; the splits here: train, validation)")
    with pytest.raises(TaskDataError, match=r"one Dataset saved with save_to_disk .* no split 'train'"):
        read_table(f"{tmp_path / 'one'}:train")
    with pytest.raises(TaskDataError, match=r"a DatasetDict saved with save_to_disk \(splits: train, validation\); "
                                            r"name the split"):
        read_table(whole)


def test_parquet_file_evaluates_and_predicts_as_the_tsv(data, reference, tmp_path, capsys):
    best = reference[1] / "best"
    capsys.readouterr()
    scores = []
    for source in (data["root"] / "dev.tsv", data["root"] / "dev.parquet", f"{data['root'] / 'snapshot'}:validation"):
        assert main(["evaluate", "--model", str(best), "--data", str(source)]) == 0
        scores.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert main(["predict", "--model", str(best), "--data", str(source),
                     "--output", str(tmp_path / "p.jsonl")]) == 0
        # The input columns come back as each format typed them (TSV text, Parquet numbers); the predictions
        # themselves are the same.
        written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
        assert all("text" in r and "label" in r for r in written)
        scores[-1]["predictions"] = [{k: v for k, v in r.items() if k.startswith("prediction")} for r in written]
    assert scores[0] == scores[1] == scores[2] and scores[0]["examples"] == len(data["dev"])


def test_bad_column_and_missing_split_are_one_line_naming_the_file(data, model_dir, tmp_path, capsys):
    root = data["root"]
    args = ["finetune", "--model", str(model_dir), "--task", "classify", "--max-steps", "1", "--no-progress",
            "--no-tensorboard"]
    assert main(args + ["--train", str(root / "train.parquet"), "--text-column", "sentence",
                        "--out", str(tmp_path / "a")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("lmforge finetune: error: train.parquet: no column 'sentence'; the columns are: text, label "
                         "(choose others with --text-column, --text-pair-column, --label-column, --target-column)")
    snap = root / "snapshot"
    assert main(args + ["--train", f"{snap}:train", "--eval", f"{snap}:dev", "--out", str(tmp_path / "b")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == (f"lmforge finetune: error: {snap}: no split 'dev' (expected data/dev-*.parquet, dev/*.arrow "
                         "or dev.parquet; the splits here: train, validation)")
    assert main(args + ["--train", str(snap), "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmforge finetune: error: {snap}: a dataset folder with splits train, validation; name the split, e.g. "
        f"{snap}:train")
    assert not any((tmp_path / x).exists() for x in "abc")  # a refused run leaves no folder
    # a bad label in a Parquet row names the file and the row
    bad = data["table"](data["dev"]).set_column(1, "label", pa.array([7] + [0] * (len(data["dev"]) - 1)))
    pq.write_table(bad, tmp_path / "bad.parquet")
    assert main(args + ["--train", str(root / "train.parquet"), "--eval", str(tmp_path / "bad.parquet"),
                        "--out", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lmforge finetune: error: bad.parquet: row 1: label '7' does not occur in the training data (labels: 0, 1)")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(TaskDataError, match=r"broken.parquet: not a readable Parquet file"):
        read_table(tmp_path / "broken.parquet")


def test_a_split_in_two_config_folders_is_refused_and_named(data, tmp_path):
    for config in ("cola", "sst2"):
        (tmp_path / config / "train").mkdir(parents=True)
        pq.write_table(data["table"](data["dev"]), tmp_path / config / "train" / "0000.parquet")
    with pytest.raises(TaskDataError) as err:
        read_table(f"{tmp_path}:train")
    assert str(err.value) == (f"{tmp_path}: split 'train' is in 2 folders ({tmp_path}/cola/train, "
                              f"{tmp_path}/sst2/train); name one, e.g. {tmp_path}/cola:train")
    assert len(read_table(f"{tmp_path / 'sst2'}:train")) == len(data["dev"])


def test_snapshots_are_read_without_datasets(data, tmp_path, monkeypatch):
    """Parquet and Arrow shards need pyarrow alone; only a save_to_disk folder asks for the extra."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    rows = read_table(f"{data['root'] / 'arrow'}:train").rows
    assert rows == read_table(f"{data['root'] / 'snapshot'}:train").rows
    assert rows == read_table(data["root"] / "train.parquet").rows
    assert [(r["text"], str(r["label"])) for r in rows] == data["train"]
    assert read_table(data["root"] / "arrow" / "train" / "data-00000-of-00001.arrow").rows == rows  # one stream file
    with pa.ipc.new_file(tmp_path / "train.arrow", data["table"](data["train"]).schema) as writer:  # file format
        writer.write_table(data["table"](data["train"]))
    assert read_table(tmp_path / "train.arrow").rows == rows
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(TaskDataError, match=r"saved.*save_to_disk; reading it needs the 'datasets' package: "
                                            r"pip install 'lmforge\[datasets\]'"):
        read_table(f"{tmp_path / 'saved'}:train")


def test_split_names_of_snapshot_files():
    assert [columnar.split_of(Path(p)) for p in (
        "data/train-00000-of-00001.parquet", "train/data-00000-of-00001.arrow", "plain_text/partial-test/0001.parquet",
        "validation.parquet", "glue-validation-00000-of-00002.arrow", "data/dev_matched-00000-of-00001.parquet",
    )] == ["train", "train", "test", "validation", "validation", "dev_matched"]
    assert columnar.parse("rt-sentiment:train") is None and columnar.parse("x.tsv") is None
