"""Multiple choice: HF BertForMultipleChoice / RobertaForMultipleChoice parity both ways, every family trains,
and bad rows are one line naming file and row."""

from __future__ import annotations

import importlib
import json
import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

from lmforge.cli.main import main  # noqa: E402
from lmforge import checkpoint, datasets  # noqa: E402
from lmforge.interop.hf import convert_from_hf, to_hf  # noqa: E402
from lmforge.tasks import build_task, inference  # noqa: E402
from lmforge.tasks.data import TaskDataError, read_table  # noqa: E402
from lmforge.tasks.finetune import finetune  # noqa: E402
from lmforge.tasks.model import build_task_model, load_task_model, to_hf_head  # noqa: E402
from lmforge.tasks.spec import TaskSpec  # noqa: E402
from tests import task_helpers as th  # noqa: E402

V = 200
SHAPE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _hf(kind):
    torch.manual_seed(0)
    if kind == "bert":
        return tf.BertForMultipleChoice(tf.BertConfig(**SHAPE)).eval()
    return tf.RobertaForMultipleChoice(tf.RobertaConfig(**SHAPE, max_position_embeddings=66, pad_token_id=1)).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (2, 4, 9), generator=g)  # (B, C, T)
    mask = torch.ones(2, 4, 9, dtype=torch.long)
    mask[0, 1, 6:] = 0
    mask[1, :, 5:] = 0
    mask[1, 3, 3:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    return ids, mask


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_hf_multiple_choice_heads_convert_both_ways(kind, tmp_path):
    hf = _hf(kind)
    convert_from_hf(hf, tmp_path / "mc")
    model = load_task_model(tmp_path / "mc")
    assert model.spec.task == "multiple-choice"
    ids, mask = _batch()
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, labels=labels)
        ours = model(ids, attention_mask=mask, labels=labels)
    assert ours.logits.shape == (2, 4)
    torch.testing.assert_close(ours.logits, expected.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.loss, expected.loss, atol=1e-4, rtol=0)

    # lmforge -> HF: a freshly built multiple-choice head (not the one read in) is written under HF's names.
    torch.manual_seed(3)
    mine = build_task_model(checkpoint.load(tmp_path / "mc"), TaskSpec(task="multiple-choice", pooling="cls",
                                                                       head_hidden=False)).eval()
    out = to_hf(mine.body, tmp_path / "hf", task_head=to_hf_head(mine))
    back = getattr(tf, f"{'Bert' if kind == 'bert' else 'Roberta'}ForMultipleChoice").from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids, attention_mask=mask).logits,
                                   mine(ids, attention_mask=mask).logits, atol=1e-4, rtol=0)


def test_to_hf_head_round_trips_a_sequence_classifier(tmp_path):
    hf = tf.BertForSequenceClassification(tf.BertConfig(**SHAPE, id2label={0: "neg", 1: "pos"},
                                                        label2id={"neg": 0, "pos": 1})).eval()
    convert_from_hf(hf, tmp_path / "clf")
    model = load_task_model(tmp_path / "clf")
    back = tf.BertForSequenceClassification.from_pretrained(to_hf(model.body, tmp_path / "hf",
                                                                  task_head=to_hf_head(model))).eval()
    ids, mask = _batch()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids[0], attention_mask=mask[0]).logits,
                                   hf(input_ids=ids[0], attention_mask=mask[0]).logits, atol=1e-4, rtol=0)
    assert back.config.id2label == {0: "neg", 1: "pos"}


def write_mc(path, n=24, seed=0):
    """Context names a city; the right choice repeats it, the others name other cities."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        person, city = rng.choice(th.PEOPLE), rng.choice(th.CITIES)
        others = [c for c in th.CITIES if c != city]
        label = rng.randrange(4)
        choices = others[:label] + [city] + others[label:]
        rows.append((f"{person} lives in {city}", *[f"{person} likes {c}" for c in choices], label))
    return th.write_tsv(path, ["context", "choice0", "choice1", "choice2", "choice3", "label"], rows)


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toks")
    return {f: th.tokenizer(folder, f) for f in ("bert", "gpt", "bart")}


@pytest.mark.parametrize("family", ["bert", "gpt", "bart"])
def test_every_family_trains_evaluates_and_reloads(family, toks, tmp_path):
    tok = toks[family]
    train, dev = write_mc(tmp_path / "train.tsv"), write_mc(tmp_path / "dev.tsv", 6, seed=1)
    body = th.body(family, tok, **({"pooler": True} if family == "bert" else {}))  # BERT's pooler: HF's MC head
    result = finetune(body, TaskSpec(task="multiple-choice"), train, dev,
                      config=th.train_config(steps=3, eval_every=3, batch_size=4), out=tmp_path / "run",
                      tokenizer=tok)
    assert result.best["metric"] == "accuracy"
    reloaded = load_task_model(tmp_path / "run" / "model")
    task = build_task(reloaded.spec, tok, reloaded.body.config)
    examples = task.encode(read_table(dev))
    assert len(examples[0]["input_ids"]) == 4
    mine, scores = task.evaluate(result.model.eval(), examples, batch_size=4)
    theirs, _ = task.evaluate(reloaded, examples, batch_size=4)
    assert mine == theirs and 0.0 <= scores["accuracy"] <= 1.0
    assert sum(mine[0]["probabilities"]) == pytest.approx(1.0, abs=1e-4)
    rows = inference.predict(tmp_path / "run" / "best", dev, tmp_path / "pred.jsonl")
    assert len(rows) == 6 and rows[0]["prediction"] in range(4)
    if family == "bert":  # the fine-tuned folder converts to BertForMultipleChoice with the same scores
        assert main(["convert", "to-hf", str(tmp_path / "run" / "model"), str(tmp_path / "hf")]) == 0
        hf = tf.BertForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
        batch = task.collate(examples[:3])
        with torch.no_grad():
            torch.testing.assert_close(hf(**{k: v for k, v in batch.items() if k != "labels"}).logits,
                                       reloaded(**{k: v for k, v in batch.items() if k != "labels"}).logits,
                                       atol=1e-4, rtol=0)


def test_choices_may_be_a_list_column(toks, tmp_path):
    tok = toks["bert"]
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"context": "mary lives in rome", "choice": ["rome", "lima"], "label": 0}) + "\n")
    task = build_task(TaskSpec(task="multiple-choice"), tok, th.body("bert", tok).config)
    (ex,) = task.encode(read_table(path))
    assert ex["gold"] == 0 and len(ex["input_ids"]) == 2


@pytest.mark.parametrize("cell,label,message", [
    ("", "0", "dev.tsv: row 2 (line 3): choice 1 (column 'choice1') is missing (empty)"),
    ("b", "4", "dev.tsv: row 2 (line 3): label '4' is not a choice index (0 to 3)"),
    ("b", "x", "dev.tsv: row 2 (line 3): label 'x' is not a choice index (0 to 3)"),
])
def test_bad_rows_name_file_and_row(cell, label, message, toks, tmp_path, capsys):
    tok = toks["bert"]
    header = ["context", "choice0", "choice1", "choice2", "choice3", "label"]
    dev = th.write_tsv(tmp_path / "dev.tsv", header, [("c", "a", "b", "c", "d", "1"), ("c", "a", cell, "c", "d", label)])
    task = build_task(TaskSpec(task="multiple-choice"), tok, th.body("bert", tok).config)
    with pytest.raises(TaskDataError) as err:
        task.encode(read_table(dev))
    assert str(err.value) == message
    # The CLI says the same in one line, before anything is written.
    model_dir = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = write_mc(tmp_path / "train.tsv", 8)
    assert main(["finetune", "--model", str(model_dir), "--task", "multiple-choice", "--train", str(train),
                 "--eval", str(dev), "--max-steps", "1", "--no-progress", "--no-tensorboard",
                 "--out", str(tmp_path / "run")]) == 2
    err_text = capsys.readouterr().err.strip().splitlines()
    assert err_text[-1].endswith(message) and not (tmp_path / "run" / "checkpoints").exists()


def test_shipped_next_verse_task_reads_by_name(toks, tmp_path):
    tok = toks["bert"]
    spec = TaskSpec(task="multiple-choice", max_length=48)
    task = build_task(spec, tok, th.body("bert", tok).config)
    table = read_table("bible-next-verse:dev")
    assert len(table) == 1453
    table.rows, table.lines = table.rows[:40], table.lines[:40]
    examples = task.encode(table)
    assert {e["gold"] for e in examples} == {0, 1, 2, 3} and all(len(e["input_ids"]) == 4 for e in examples)
    header = ["context", "choice0", "choice1", "choice2", "choice3", "label"]
    for split, n in (("train", 16), ("dev", 8)):
        th.write_tsv(tmp_path / f"{split}.tsv", header, [[r[c] for c in header] for r in datasets.load(
            "bible-next-verse", split)[:n]])
    result = finetune(th.body("bert", tok), spec, tmp_path / "train.tsv", tmp_path / "dev.tsv",
                      config=th.train_config(steps=2, eval_every=2, batch_size=4), out=tmp_path / "run",
                      tokenizer=tok)
    assert 0.0 <= result.best["value"] <= 1.0
