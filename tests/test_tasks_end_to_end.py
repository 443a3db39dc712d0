"""Every task type end to end on tiny models: train a few steps, evaluate, predict, reload, via API and CLI."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.tasks import build_task, inference
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import Recipe, finetune
from lmforge.tasks.model import load_task_model
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toks")
    return {f: th.tokenizer(folder, f) for f in ("bert", "gpt", "t5", "bart")}


def _regress(path, n=32):
    rows = [(t, 4.0 if lbl == "1" else 1.0) for t, lbl in th.sentiment_rows(n)]
    return th.write_tsv(path, ["text", "label"], rows)


def _multilabel(path, n=32):
    rng = random.Random(0)
    rows = []
    for text, label in th.sentiment_rows(n):
        labels = ["pos" if label == "1" else "neg"]
        if rng.random() < 0.5:
            text += " in " + rng.choice(th.CITIES)
            labels.append("place")
        rows.append((text, ",".join(labels)))
    return th.write_tsv(path, ["text", "labels"], rows)


def _data(task, folder):
    """(train file, eval file, spec fields) of a toy version of each task."""
    if task == "classify":
        return th.write_sentiment(folder / "train.tsv", 32), th.write_sentiment(folder / "dev.tsv", 8, seed=1), {}
    if task == "regress":
        return _regress(folder / "train.tsv"), _regress(folder / "dev.tsv", 8), {}
    if task == "multilabel":
        return _multilabel(folder / "train.tsv"), _multilabel(folder / "dev.tsv", 8), {}
    if task == "tag":
        return th.write_conll(folder / "train.conll", 24), th.write_conll(folder / "dev.conll", 6, seed=1), {}
    if task == "qa":
        return th.write_qa(folder / "train.jsonl", 24), th.write_qa(folder / "dev.jsonl", 6, seed=1), {}
    if task == "seq2seq":
        return (th.write_numbers(folder / "train.tsv", 24), th.write_numbers(folder / "dev.tsv", 4, seed=1),
                {"max_target_length": 8, "task_prefix": "numbers: "})
    return (th.write_sentiment(folder / "train.tsv", 32), th.write_sentiment(folder / "dev.tsv", 6, seed=1),
            {"task_prefix": "sst2 sentence: ", "label_map": {"0": "negative", "1": "positive"},
             "max_target_length": 10})


MAIN_METRIC = {"classify": "accuracy", "regress": "spearman", "multilabel": "f1_micro", "tag": "f1", "qa": "f1",
               "seq2seq": "bleu", "text2text": "accuracy"}
PREDICTION_KEY = {"classify": "label", "regress": "score", "multilabel": "labels", "tag": "tags", "qa": "answer",
                  "seq2seq": "output", "text2text": "label"}
CASES = [("classify", "bert"), ("classify", "gpt"), ("classify", "bart"), ("regress", "bert"),
         ("multilabel", "bert"), ("tag", "bert"), ("tag", "t5"), ("qa", "bert"), ("qa", "bart"),
         ("seq2seq", "t5"), ("seq2seq", "gpt"), ("text2text", "t5")]


@pytest.mark.parametrize("task,family", CASES, ids=[f"{t}-{f}" for t, f in CASES])
def test_train_evaluate_predict_reload(task, family, toks, tmp_path):
    tok = toks[family]
    train, dev, fields = _data(task, tmp_path)
    result = finetune(th.body(family, tok), TaskSpec(task=task, **fields), train, dev,
                      config=th.train_config(steps=4, eval_every=4), out=tmp_path / "run", tokenizer=tok)
    assert result.train.step == 4 and result.best["metric"] == MAIN_METRIC[task]
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] > 0 and first["targets"] > 0

    # Reload: the saved folder predicts exactly what the trained model in memory predicts.
    reloaded = load_task_model(tmp_path / "run" / "model")
    t = build_task(reloaded.spec, tok, reloaded.body.config)
    examples = t.encode(read_table(dev))
    mine, scores = t.evaluate(result.model.eval(), examples, batch_size=4)
    theirs, _ = t.evaluate(reloaded, examples, batch_size=4)
    assert mine == theirs
    assert MAIN_METRIC[task] in scores and "loss" in scores

    evaluated = inference.evaluate(tmp_path / "run" / "best", dev)
    assert evaluated["examples"] == len(examples) and math.isfinite(evaluated["loss"])
    rows = inference.predict(tmp_path / "run" / "best", dev, tmp_path / "pred.jsonl")
    assert len(rows) == len(read_table(dev))
    written = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert written == json.loads(json.dumps(rows)) and "prediction" in written[0]
    source = read_table(dev)  # every input column is kept as it was read, the gold one too, then the prediction
    assert [{k: r[k] for k in source.columns} for r in written] == json.loads(json.dumps(source.rows))
    assert list(written[0])[:len(source.columns)] == source.columns
    key = PREDICTION_KEY[task]  # the task's own name for its answer appears only as an input (gold) column
    assert key in source.columns or key not in written[0]
    if task in ("classify", "multilabel", "text2text"):
        probs = written[0]["prediction_probabilities"]
        assert set(probs) == set(reloaded.spec.labels or reloaded.spec.label_map)
        if task != "multilabel":
            assert sum(probs.values()) == pytest.approx(1.0, abs=1e-4)


def test_classification_learns_the_toy_task(toks, tmp_path):
    """Not just 'it runs': 80 steps take a tiny encoder from chance to (nearly) perfect on held-out rows."""
    tok = toks["bert"]
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 64), th.write_sentiment(tmp_path / "dev.tsv", 24, seed=7)
    result = finetune(th.body("bert", tok), TaskSpec(task="classify", pooling="mean"), train, dev,
                      config=th.train_config(steps=80, eval_every=40, lr=3e-3), out=tmp_path / "run", tokenizer=tok,
                      recipe=Recipe(layer_decay=0.9))
    assert result.best["value"] >= 0.9


def test_text2text_mixture_trains_one_model_for_two_tasks(toks, tmp_path):
    tok = toks["t5"]
    mixture = [
        {"name": "sentiment", "train": str(th.write_sentiment(tmp_path / "s.tsv", 24)),
         "eval": str(th.write_sentiment(tmp_path / "sd.tsv", 4, seed=1)), "task_prefix": "sst2 sentence: ",
         "label_map": {"0": "negative", "1": "positive"}},
        {"name": "numbers", "train": str(th.write_numbers(tmp_path / "n.tsv", 12)),
         "eval": str(th.write_numbers(tmp_path / "nd.tsv", 4, seed=1)), "text_column": "source",
         "target_column": "target", "task_prefix": "translate numbers: "},
    ]
    spec = TaskSpec(task="text2text", mixture=mixture, max_target_length=12)
    result = finetune(th.body("t5", tok), spec, None, config=th.train_config(steps=4, eval_every=4),
                      out=tmp_path / "run", tokenizer=tok)
    metrics = result.train.metrics
    assert {"eval_sentiment/accuracy", "eval_numbers/bleu", "eval_score"} <= set(metrics)
    assert result.best["metric"] == "score"
    # Examples-proportional mixing: 24 + 12 examples -> 2:1 in every epoch.
    assert result.counts == {"train": 36, "eval": 8}
    scores = inference.evaluate(tmp_path / "run" / "best", tmp_path / "nd.tsv", subtask="numbers")
    assert "bleu" in scores and "perplexity" in scores
    with pytest.raises(ValueError, match="--subtask"):
        inference.evaluate(tmp_path / "run" / "best", tmp_path / "nd.tsv")


def test_example_averaged_loss_counts_each_example_once(toks, tmp_path):
    """loss_average="example": the batch loss is the mean of each example's own (token-averaged) loss."""
    from lmforge.tasks.model import build_task_model

    tok = toks["t5"]
    body = th.body("t5", tok).eval()
    spec = TaskSpec(task="seq2seq", task_prefix="numbers: ", max_target_length=12, loss_average="example")
    task = build_task(spec, tok, body.config)
    examples = task.encode(read_table(th.write_numbers(tmp_path / "n.tsv", 6)))
    assert len({len(e["target_ids"]) for e in examples}) > 1  # targets of different lengths, or the test is moot
    by_example = build_task_model(body, spec)
    by_token = build_task_model(body, spec.replace(loss_average="token"))
    with torch.no_grad():
        out = by_example(**task.collate(examples))
        singles = [by_token(**task.collate([e])).loss for e in examples]
        pooled = by_token(**task.collate(examples))
    assert out.n_targets == len(examples)
    torch.testing.assert_close(out.loss, torch.stack(singles).mean(), rtol=1e-5, atol=1e-6)
    # Token averaging weighs long targets more, so the two differ on this batch.
    assert not torch.allclose(pooled.loss, out.loss)

    # The Trainer divides by examples too: its logged loss is the example mean, over batch_size targets.
    finetune(body, spec, tmp_path / "n.tsv", config=th.train_config(steps=1, batch_size=6, lr=1e-9),
             out=tmp_path / "run", tokenizer=tok, recipe=Recipe(bucket=0))
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][0]
    assert logged["targets"] == 6
    assert logged["loss"] == pytest.approx(float(out.loss), rel=1e-4)


def test_cli_finetune_evaluate_predict(toks, tmp_path, capsys):
    tok = toks["bert"]
    model_dir = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 32), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    out = tmp_path / "run"
    common = ["--no-progress", "--no-tensorboard", "--precision", "fp32"]
    assert main(["finetune", "--model", str(model_dir), "--task", "classify", "--train", str(train), "--eval",
                 str(dev), "--out", str(out), "--max-steps", "3", "--eval-every", "3", "--lr", "1e-3",
                 "--layer-decay", "0.8", *common]) == 0
    assert "best: accuracy" in capsys.readouterr().out
    # Resume with nothing but --out: the settings come back from OUT/finetune.yaml.
    assert main(["finetune", "--out", str(out), "--resume", "--max-steps", "5", *common]) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 5
    capsys.readouterr()

    assert main(["evaluate", "--model", str(out / "best"), "--data", str(dev)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["metric", "value"]
    scores = json.loads(lines[-1])
    assert scores["examples"] == 8 and 0.0 <= scores["accuracy"] <= 1.0

    predicted = tmp_path / "p.tsv"
    assert main(["predict", "--model", str(out / "model"), "--data", str(dev), "--output", str(predicted)]) == 0
    header, *rows = predicted.read_text().splitlines()
    assert header.split("\t") == ["text", "label", "prediction", "prediction_prob_0", "prediction_prob_1"]
    assert len(rows) == 8


def test_cli_bad_input_is_one_line_naming_file_and_row(toks, tmp_path, capsys):
    tok = toks["bert"]
    model_dir = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    th.write_tsv(tmp_path / "dev.tsv", ["text", "label"], [("good", "1"), ("so so", "2")])
    base = ["finetune", "--model", str(model_dir), "--task", "classify", "--max-steps", "2", "--no-progress",
            "--no-tensorboard"]
    assert main([*base, "--train", str(train), "--eval", str(tmp_path / "dev.tsv"), "--out", str(tmp_path / "a")]) == 2
    assert "dev.tsv: row 2 (line 3): label '2' does not occur in the training data" in capsys.readouterr().err
    assert main([*base, "--train", str(train), "--text-column", "review", "--out", str(tmp_path / "b")]) == 2
    assert "train.tsv: no column 'review'; the columns are: text, label" in capsys.readouterr().err
    (tmp_path / "empty.csv").write_text("")
    assert main([*base, "--train", str(tmp_path / "empty.csv"), "--out", str(tmp_path / "c")]) == 2
    assert "empty.csv: the file is empty" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(model_dir), "--data", str(train)]) == 2
    assert "not a fine-tuned task folder" in capsys.readouterr().err
    assert main([*base, "--train", str(train), "--eval", str(train), "--metric", "bleu",
                 "--out", str(tmp_path / "d")]) == 2
    assert "metric 'bleu' is not computed for task 'classify'; choose one of loss, accuracy" in capsys.readouterr().err
    assert not (tmp_path / "d" / "checkpoints").exists()  # refused before any training


def test_plain_lm_is_evaluated_zero_shot_on_a_generative_task(toks, tmp_path):
    tok = toks["t5"]
    model_dir = checkpoint.save(th.body("t5", tok), tmp_path / "lm", tokenizer=tok)
    scores = inference.evaluate(model_dir, th.write_numbers(tmp_path / "n.tsv", 4), task="seq2seq",
                                overrides={"max_target_length": 4})
    assert {"bleu", "rougeL", "perplexity"} <= set(scores) and scores["perplexity"] > 1.0
    assert torch.isfinite(torch.tensor(scores["loss"]))


def test_cli_text2text_mixture_and_label_maps(toks, tmp_path, capsys):
    from lmforge.cli.finetune import parse_label_map

    assert parse_label_map("0=negative, 1=positive") == {"0": "negative", "1": "positive"}
    assert parse_label_map('{"0": "no", "1": "yes"}') == {"0": "no", "1": "yes"}
    (tmp_path / "map.yaml").write_text("0: bad\n1: good\n")
    assert parse_label_map(str(tmp_path / "map.yaml")) == {"0": "bad", "1": "good"}

    tok = toks["t5"]
    model_dir = checkpoint.save(th.body("t5", tok), tmp_path / "base", tokenizer=tok)
    th.write_sentiment(tmp_path / "s.tsv", 16)
    th.write_numbers(tmp_path / "n.tsv", 8)
    (tmp_path / "tasks.yaml").write_text(
        "- {name: sentiment, train: s.tsv, eval: s.tsv, task_prefix: 'sst2 sentence: ',\n"
        "   label_map: {0: negative, 1: positive}}\n"
        "- {name: numbers, train: n.tsv, eval: n.tsv, text_column: source, target_column: target}\n")
    out = tmp_path / "run"
    mixture = str(tmp_path / "tasks.yaml")
    assert main(["finetune", "--model", str(model_dir), "--task", "text2text", "--mixture", mixture, "--out", str(out),
                 "--max-steps", "2", "--eval-every", "2", "--max-target-length", "12", "--no-progress",
                 "--no-tensorboard", "--precision", "fp32", "--loss-average", "example"]) == 0
    assert "best: score" in capsys.readouterr().out
    assert load_task_model(out / "best").spec.loss_average == "example"
    assert main(["evaluate", "--model", str(out / "best"), "--data", str(tmp_path / "s.tsv"), "--subtask",
                 "sentiment"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
