"""Simple baselines: the linear ones are the scikit-learn pipelines they claim to be (same predictions, also after
a round trip through their folder); the neural ones train through the Trainer, read padding-free, and write run
folders that `lmforge evaluate` and `predict` read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC

from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.evaluation import baselines
from lmforge.evaluation.bilstm_classifier import BiLSTMClassifier
from lmforge.evaluation.cnn_classifier import CNNClassifier
from lmforge.evaluation.word_vocab import WordVocab
from lmforge.tasks.data import read_table
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th

QUIET = ["--no-progress", "--no-tensorboard"]


def _texts_labels(source):
    table = read_table(source)
    return [r["text"] for r in table.rows], [str(r["label"]) for r in table.rows]


def test_tfidf_baseline_equals_the_sklearn_pipeline(tmp_path, capsys):
    out = tmp_path / "tfidf"
    assert main(["finetune", "--baseline", "tfidf-logreg", "--task", "rt-sentiment", "--out", str(out)]) == 0
    train_x, train_y = _texts_labels("rt-sentiment:train")
    test_x, test_y = _texts_labels("rt-sentiment:test")
    direct = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                           LogisticRegression(max_iter=1000)).fit(train_x, train_y)
    expected = direct.predict(test_x)
    # Through the run folder, as a user reads it: predict and evaluate.
    assert main(["predict", "--model", str(out), "--data", "rt-sentiment:test",
                 "--output", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == expected.tolist()
    probs = np.array([[r["prediction_probabilities"]["0"], r["prediction_probabilities"]["1"]] for r in rows])
    np.testing.assert_allclose(probs, direct.predict_proba(test_x), atol=1e-6)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", "rt-sentiment:test"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["accuracy"] == pytest.approx(accuracy_score(test_y, expected))
    assert scores["examples"] == len(test_y) and scores["accuracy"] > 0.7  # a real baseline, not chance
    run = json.loads((out / "baseline.json").read_text())
    assert run["eval_data"] == "rt-sentiment:dev" and run["baseline"] == "tfidf-logreg"
    # A task by name scores it too, with the task's leaderboard metric on its evaluation split.
    assert main(["tasks", "evaluate", "rt-sentiment", "--model", str(out)]) == 0
    dev_x, dev_y = _texts_labels("rt-sentiment:dev")
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reported == {"accuracy": pytest.approx(accuracy_score(dev_y, direct.predict(dev_x)))}


def test_ngram_svm_equals_the_sklearn_pipeline_after_its_folder(tmp_path):
    path = th.write_sentiment(tmp_path / "train.tsv", n=80)
    test = th.write_sentiment(tmp_path / "test.tsv", n=40, seed=3)
    run = baselines.train_baseline("ngram-svm", TaskSpec(task="classify"), str(path), out=tmp_path / "svm")
    x, y = _texts_labels(str(path))
    tx, _ = _texts_labels(str(test))
    direct = make_pipeline(CountVectorizer(ngram_range=(1, 2), binary=True), LinearSVC(random_state=0)).fit(x, y)
    rows = baselines.predict(run["model_dir"], str(test))
    assert [r["prediction"] for r in rows] == direct.predict(tx).tolist()
    margins = np.array([r["prediction_scores"]["1"] for r in rows])
    np.testing.assert_allclose(margins, direct.decision_function(tx), atol=1e-6)  # written to 6 places


def test_labels_keep_the_spec_order_and_an_unseen_class_is_never_predicted(tmp_path):
    rows = [("good film", "10"), ("bad film", "9"), ("great", "10"), ("awful", "9")]
    train = th.write_tsv(tmp_path / "t.tsv", ["text", "label"], rows)
    spec = TaskSpec(task="classify", labels=["2", "9", "10"])  # "2" never occurs in training
    run = baselines.train_baseline("tfidf-logreg", spec, str(train), str(train), out=tmp_path / "r")
    assert run["eval"]["accuracy"] == 1.0
    preds = baselines.predict(run["model_dir"], str(train))
    assert [p["prediction"] for p in preds] == ["10", "9", "10", "9"]
    assert all(p["prediction_probabilities"]["2"] == 0 for p in preds)
    assert [p["label"] for p in preds] == [label for _, label in rows]  # the gold column, as it was


@pytest.mark.parametrize("name", ["bilstm", "cnn"])
def test_neural_baselines_learn_a_toy_task_and_write_run_folders(name, tmp_path, capsys):
    train = th.write_sentiment(tmp_path / "train.tsv", n=256)  # fewer, and the CNN memorises the filler words
    dev = th.write_sentiment(tmp_path / "dev.tsv", n=32, seed=5)
    out = tmp_path / name
    assert main(["finetune", "--baseline", name, "--task", "classify", "--train", str(train), "--eval", str(dev),
                 "--max-steps", "60", "--batch-size", "16", "--eval-every", "60", "--lr", "0.01",
                 "--baseline-option", "embed_dim=16", "--baseline-option", "hidden=8", "--baseline-option",
                 "filters=8", "--baseline-option", "dropout=0", "--precision", "fp32", *QUIET, "--out", str(out)]) == 0
    assert "done: " + name in capsys.readouterr().out
    assert (out / "checkpoints").is_dir() and (out / "metrics.jsonl").is_file()  # the Trainer's run folder
    assert not list((out / "model").glob("*.pkl")) and (out / "model" / "baseline.safetensors").is_file()
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["step"] == 60 and logged[-1]["eval_accuracy"] == 1.0  # one polar word decides the label
    assert main(["evaluate", "--model", str(out), "--data", str(dev)]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["accuracy"] == 1.0 and scores["loss"] == pytest.approx(logged[-1]["eval_loss"], rel=1e-5)


@pytest.mark.parametrize("module", [BiLSTMClassifier(30, 3, embed_dim=8, hidden=5, dropout=0.0),
                                    CNNClassifier(30, 3, embed_dim=8, filters=4, dropout=0.0)])
def test_a_text_scores_the_same_alone_and_in_a_padded_batch(module):
    torch.manual_seed(0)
    texts = [[4, 9, 11, 2, 7, 8, 3], [5, 6], [12, 13, 14, 15]]
    batch = torch.zeros(3, 7, dtype=torch.long)
    for i, ids in enumerate(texts):
        batch[i, :len(ids)] = torch.tensor(ids)
    together = module(batch).logits
    for i, ids in enumerate(texts):
        torch.testing.assert_close(module(torch.tensor([ids])).logits[0], together[i], atol=1e-6, rtol=0)


def test_pairs_read_both_texts(tmp_path):
    rows = [(f"{a} film", f"{b} film", str(int(a == b))) for a in ("good", "bad", "dull") for b in ("good", "bad")]
    train = th.write_tsv(tmp_path / "pairs.tsv", ["s1", "s2", "label"], rows * 4)
    spec = TaskSpec(task="classify", text_column="s1", text_pair_column="s2")
    run = baselines.train_baseline("tfidf-logreg", spec, str(train), out=tmp_path / "r",
                                   options=baselines.BaselineOptions(C=100.0))
    preds = baselines.predict(run["model_dir"], str(train))
    assert preds[0]["s1"] == "good film" and preds[0]["s2"] == "good film"
    assert baselines.texts_of(read_table(str(train)), spec)[1] == "good film [SEP] bad film"


def test_word_vocab_and_word2vec_start():
    vocab = WordVocab.build(["the good film", "the bad film", "the end"], min_count=2)
    assert vocab.words == ["<pad>", "<unk>", "the", "film"] and vocab.encode("The odd film") == [2, 1, 3]
    random_start = vocab.vectors("random", 6, ["x"], seed=0)
    w2v = vocab.vectors("word2vec", 6, ["the good film", "the bad film", "the end"] * 5, seed=0)
    assert float(w2v[0].abs().sum()) == 0.0 and not torch.equal(w2v[2], random_start[2])
    torch.testing.assert_close(w2v[1], random_start[1])  # <unk> is not a word word2vec knows: it stays random


def test_bad_input_is_one_line(tmp_path, capsys):
    train = th.write_sentiment(tmp_path / "train.tsv", n=8)
    out = str(tmp_path / "r")
    for argv, message in [
        (["--baseline", "cnn", "--model", "bert-tiny", "--task", "classify", "--train", str(train)],
         "--baseline trains its own small model: drop --model"),
        (["--baseline", "cnn", "--task", "regress", "--train", str(train)],
         "does not train --task regress; for regress choose: tfidf-ridge"),
        (["--baseline", "cnn", "--task", "classify", "--train", str(train), "--baseline-option", "size=3"],
         "--baseline-option 'size=3': expected KEY=VALUE with KEY one of C, embed_dim"),
        (["--baseline", "cnn", "--task", "classify", "--train", str(train), "--baseline-option", "vectors=glove"],
         "vectors='glove': choose one of random, word2vec"),
    ]:
        assert main(["finetune", *argv, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not Path(out).exists()  # nothing half-written
    dev = th.write_tsv(tmp_path / "dev.tsv", ["text", "label"], [("good", "1"), ("odd", "7")])
    with pytest.raises(Exception, match=r"dev.tsv: row 2 \(line 3\): label '7' does not occur"):
        baselines.train_baseline("tfidf-logreg", TaskSpec(task="classify"), str(train), str(dev), out=out)
    assert not (Path(out) / "model").exists()
    run = baselines.train_baseline("tfidf-logreg", TaskSpec(task="classify"), str(train), out=out)
    with pytest.raises(UserInputError, match="already holds a trained model"):
        baselines.train_baseline("tfidf-logreg", TaskSpec(task="classify"), str(train), out=out)
    from lmforge.tasks import inference
    with pytest.raises(UserInputError, match="a tfidf-logreg baseline's folder"):
        inference.evaluate(run["model_dir"], str(train))
