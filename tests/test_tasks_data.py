"""Task data: the four formats, row-numbered errors for bad input, truncation reports, resumable batches."""

from __future__ import annotations

import gzip
import json

import pytest

from lmforge.config import ConfigError, ModelConfig
from lmforge.tasks import build_task
from lmforge.tasks.data import ExampleBatches, TaskDataError, read_table
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th


@pytest.fixture(scope="module")
def bert_tok(tmp_path_factory):
    return th.tokenizer(tmp_path_factory.mktemp("tok"), "bert")


def _task(tok, **spec):
    cfg = ModelConfig(arch="encoder", vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_layers=1,
                      max_seq_len=64, type_vocab_size=2, head="none")
    return build_task(TaskSpec(**spec), tok, cfg)


def test_four_formats_read_the_same_rows(tmp_path):
    rows = [("good, \"fun\" film", "1"), ("bad film", "0")]
    th.write_tsv(tmp_path / "a.tsv", ["text", "label"], rows)
    (tmp_path / "a.csv").write_text('text,label\n"good, ""fun"" film",1\nbad film,0\n')
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "label": int(lbl)}) + "\n" for t, lbl in rows))
    with gzip.open(tmp_path / "a.tsv.gz", "wt") as f:
        f.write((tmp_path / "a.tsv").read_text())
    for name in ("a.tsv", "a.csv", "a.jsonl", "a.tsv.gz"):
        table = read_table(tmp_path / name)
        assert [(r["text"], str(r["label"])) for r in table.rows] == rows, name
        assert table.where(1) == f"{name}: row 2 (line {2 if name.endswith('jsonl') else 3})"  # JSONL: no header
    conll = read_table(th.write_conll(tmp_path / "a.conll", n=3))
    assert len(conll) == 3 and conll.columns == ["tokens", "tags"] and conll.lines[1] == 7  # 5 lines + blank


def test_shipped_data_set_by_name():
    table = read_table("rt-sentiment:dev")
    assert len(table) == 1007 and {"text", "label"} <= set(table.columns)


def test_empty_file_unknown_column_and_bad_rows_name_file_and_row(tmp_path, bert_tok):
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(TaskDataError, match=r"empty\.tsv: the file is empty"):
        read_table(tmp_path / "empty.tsv")
    (tmp_path / "header.tsv").write_text("text\tlabel\n")
    with pytest.raises(TaskDataError, match=r"header\.tsv: no rows"):
        read_table(tmp_path / "header.tsv")
    (tmp_path / "ragged.tsv").write_text("text\tlabel\ngood\t1\nbad\n")
    with pytest.raises(TaskDataError, match=r"ragged\.tsv: row 2 \(line 3\): 1 fields, but the header has 2"):
        read_table(tmp_path / "ragged.tsv")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n\n{"text": \n')
    with pytest.raises(TaskDataError, match=r"bad\.jsonl: row 2 \(line 3\): not valid JSON"):
        read_table(tmp_path / "bad.jsonl")
    table = read_table(th.write_sentiment(tmp_path / "train.tsv", n=4))
    with pytest.raises(TaskDataError, match=r"train\.tsv: no column 'sentence'; the columns are: text, label"):
        _task(bert_tok, task="classify", text_column="sentence", labels=["0", "1"]).encode(table)
    th.write_tsv(tmp_path / "blank.tsv", ["text", "label"], [("good", "1"), (" ", "0")])
    with pytest.raises(TaskDataError, match=r"blank\.tsv: row 2 \(line 3\): column 'text' is empty"):
        _task(bert_tok, task="classify", labels=["0", "1"]).encode(read_table(tmp_path / "blank.tsv"))


def test_eval_label_absent_from_training_is_named(tmp_path, bert_tok):
    th.write_tsv(tmp_path / "dev.tsv", ["text", "label"], [("good", "1"), ("meh", "neutral")])
    task = _task(bert_tok, task="classify", labels=["0", "1"])
    with pytest.raises(TaskDataError, match=r"dev\.tsv: row 2 \(line 3\): label 'neutral' does not occur in the "
                                            r"training data \(labels: 0, 1\)"):
        task.encode(read_table(tmp_path / "dev.tsv"))
    th.write_tsv(tmp_path / "reg.tsv", ["text", "label"], [("good", "4.5"), ("bad", "high")])
    with pytest.raises(TaskDataError, match=r"reg\.tsv: row 2 \(line 3\): label 'high' is not a number"):
        _task(bert_tok, task="regress").encode(read_table(tmp_path / "reg.tsv"))


def test_over_long_inputs_are_truncated_with_one_warning_and_a_count(tmp_path, bert_tok, capsys):
    long = " ".join(["good film"] * 30)
    th.write_tsv(tmp_path / "long.tsv", ["text", "label"], [("bad", "0"), (long, "1"), (long, "1")])
    task = _task(bert_tok, task="classify", labels=["0", "1"], max_length=16)
    examples = task.encode(read_table(tmp_path / "long.tsv"))
    err = capsys.readouterr().err
    assert "long.tsv: 2 of 3 rows are longer than 16 tokens and were truncated (first: row 2 (line 3))" in err
    assert [len(e["input_ids"]) for e in examples] == [3, 16, 16]
    sep = bert_tok.token_to_id("[SEP]")
    assert examples[1]["input_ids"][-1] == sep  # the template's end survives the cut


def test_columns_by_task_and_label_map():
    assert TaskSpec(task="tag").columns() == {"text": "tokens", "label": "tags"}
    assert TaskSpec(task="qa").columns() == {"text": "question", "text_pair": "context", "target": "answers"}
    words = {"0": "negative", "1": "positive"}
    for given in ({}, {"label_column": "label"}, {"target_column": "label"}):
        spec = TaskSpec(task="text2text", label_map=words, **given)
        assert spec.columns() == {"text": "text", "label": "label"}, given  # a label map reads labels


def test_loss_average_is_checked():
    with pytest.raises(ConfigError, match="loss_average='sentence' is not one of token, example"):
        TaskSpec(task="seq2seq", loss_average="sentence")
    with pytest.raises(ConfigError, match="only used by the generative tasks"):
        TaskSpec(task="classify", loss_average="example")


def test_label_order_is_numeric_when_labels_are_numbers(tmp_path, bert_tok):
    th.write_tsv(tmp_path / "t.tsv", ["text", "label"], [("a", "10"), ("b", "9"), ("c", "2"), ("d", "9")])
    assert _task(bert_tok, task="classify").label_set(read_table(tmp_path / "t.tsv")) == ["2", "9", "10"]


def test_batches_cover_each_epoch_once_and_resume_exactly():
    data = list(range(23))
    a = ExampleBatches(data, batch_size=5, seed=3)
    epoch0 = [x for b in a for x in b]
    assert sorted(epoch0) == data and epoch0 != data  # shuffled, each example once
    epoch1 = [x for b in a for x in b]
    assert sorted(epoch1) == data and epoch1 != epoch0  # a fresh order per epoch
    b = ExampleBatches(data, batch_size=5, seed=3)
    it = iter(b)
    first_two = [next(it), next(it)]
    state = b.state_dict()
    c = ExampleBatches(data, batch_size=5, seed=3)
    c.load_state_dict(state)
    assert first_two + list(c) == list(ExampleBatches(data, batch_size=5, seed=3))
    with pytest.raises(ValueError, match="seed 3 and batch size 5"):
        ExampleBatches(data, batch_size=4, seed=3).load_state_dict(state)


def test_length_buckets_pad_less_and_keep_every_example():
    examples = [{"input_ids": [0] * n} for n in range(1, 101)]
    plain = ExampleBatches(examples, batch_size=10, seed=0)
    bucketed = ExampleBatches(examples, batch_size=10, seed=0, bucket=5)

    def padded(batches):
        return sum(len(b) * max(len(e["input_ids"]) for e in b) for b in batches)

    got = list(bucketed)
    assert sorted(len(e["input_ids"]) for b in got for e in b) == list(range(1, 101))
    assert padded(got) < 0.7 * padded(list(plain))


def test_mixture_follows_the_rates():
    a, b = [("a", i) for i in range(90)], [("b", i) for i in range(10)]
    batches = ExampleBatches([a, b], batch_size=10, seed=0, rates=[0.5, 0.5])
    epoch = [x for batch in batches for x in batch]
    assert len(epoch) == 100 and sum(1 for t, _ in epoch if t == "b") == 50  # the small set cycles 5 times
    assert len({x for x in epoch if x[0] == "b"}) == 10
