"""SQuAD 2.0: unanswerable rows (the [CLS] span), the no-answer threshold and its search, the official metrics
on hand-computed cases, and answers that are not where their offset says."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lmforge.cli.main import main
from lmforge import checkpoint
from lmforge.tasks import build_task, inference
from lmforge.tasks.data import TaskDataError, read_table
from lmforge.tasks.finetune import finetune
from lmforge.tasks import metrics
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th


def test_normalisation_is_the_official_one():
    assert metrics.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert metrics.normalize_answer("an Apple, a day") == "apple day"
    assert metrics.normalize_answer("A") == ""


def test_squad_v2_scores_and_threshold_search_by_hand():
    # q1, q2 answerable; q3, q4 not. Spans are each question's best non-null answer.
    spans = ["the Denver Broncos", "Panthers", "Santa Clara", "Levi's Stadium"]
    golds = [["Denver Broncos", "Broncos"], ["Carolina Panthers"], [], ["", "a"]]  # q4: golds normalise to nothing
    diffs = [-3.0, 0.5, 2.0, -1.0]
    m = metrics.squad_v2(spans, golds, diffs, threshold=0.0)
    # At tau = 0: q1 answered (EM 1), q2 null (0), q3 null (right: 1), q4 answered (wrong: 0).
    assert m["exact_match"] == m["f1"] == 0.5
    assert m["HasAns_exact"] == m["HasAns_f1"] == 0.5 and m["NoAns_exact"] == m["NoAns_f1"] == 0.5
    assert m["HasAns_total"] == m["NoAns_total"] == 2.0
    # Search: start all-null = 2 right; by rising diff: q1 +1 (3, tau=-3), q4 -1 (2), q2 +2/3 F1 / +0 EM, q3 -1.
    assert m["best_f1"] == 0.75 and m["best_f1_thresh"] == -3.0
    assert m["best_exact"] == 0.75 and m["best_exact_thresh"] == -3.0
    # A threshold of 1 answers q2 ("Panthers" vs "Carolina Panthers": P=1, R=1/2, F1=2/3).
    m = metrics.squad_v2(spans, golds, diffs, threshold=1.0)
    assert m["HasAns_exact"] == 0.5 and m["HasAns_f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert m["f1"] == pytest.approx((1 + 2 / 3 + 1 + 0) / 4)


def test_search_prefers_answering_when_answers_are_right():
    m = metrics.squad_v2(["x", "y"], [["x"], ["y"]], [5.0, 7.0])
    assert m["exact_match"] == 0.0 and "NoAns_exact" not in m  # tau = 0: both abstain, both wrong
    assert m["best_exact"] == 1.0 and m["best_exact_thresh"] == 7.0
    m = metrics.squad_v2(["x"], [[]], [-5.0])
    assert m["best_f1"] == 1.0 and m["best_f1_thresh"] == -6.0  # abstaining on everything: below every diff


def _squad2(path, n=24, seed=0):
    import random

    rng = random.Random(seed)
    lines = []
    for k in range(n):
        city, person = rng.choice(th.CITIES), rng.choice(th.PEOPLE)
        context = f"{person} lives in {city} and likes the film"
        if k % 3 == 2:  # unanswerable: asks about someone else
            other = next(p for p in th.PEOPLE if p != person)
            lines.append({"question": f"where does {other} live ?", "context": context,
                          "answers": {"text": [], "answer_start": []}})
        else:
            lines.append({"question": f"where does {person} live ?", "context": context,
                          "answers": {"text": [city], "answer_start": [context.index(city)]}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return th.tokenizer(tmp_path_factory.mktemp("tok"), "bert")


def test_unanswerable_rows_train_at_cls_and_switch_the_threshold_on(tok, tmp_path):
    train, dev = _squad2(tmp_path / "train.jsonl"), _squad2(tmp_path / "dev.jsonl", 9, seed=1)
    task = build_task(TaskSpec(task="qa"), tok, th.body("bert", tok).config)
    examples = task.encode(read_table(train))
    assert examples[2]["gold"] == [] and examples[2]["labels"] == [0, 0]
    assert examples[0]["gold"] and examples[0]["labels"][0] > 0
    result = finetune(th.body("bert", tok), TaskSpec(task="qa"), train, dev,
                      config=th.train_config(steps=3, eval_every=3, batch_size=4), out=tmp_path / "run", tokenizer=tok)
    assert result.model.spec.null_threshold == 0.0
    scores = inference.evaluate(tmp_path / "run" / "best", dev)
    for key in ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_f1",
                "best_f1_thresh"):
        assert key in scores
    # Predicting with the threshold tuned on dev reproduces the search's best F1.
    tuned = inference.evaluate(tmp_path / "run" / "best", dev,
                               overrides={"null_threshold": scores["best_f1_thresh"]})
    assert tuned["f1"] == pytest.approx(scores["best_f1"])
    rows = inference.predict(tmp_path / "run" / "best", dev, tmp_path / "p.jsonl")
    assert all("prediction_null_score_diff" in r and "prediction_span" in r for r in rows)
    # BERT's recipe: tune tau on dev and keep it in the folder; the folder then scores the search's best F1.
    assert main(["evaluate", "--model", str(tmp_path / "run" / "best"), "--data", str(dev),
                 "--tune-null-threshold"]) == 0
    spec = json.loads((tmp_path / "run" / "best" / "task.json").read_text())["spec"]
    assert spec["null_threshold"] == pytest.approx(scores["best_f1_thresh"])
    assert inference.evaluate(tmp_path / "run" / "best", dev)["f1"] == pytest.approx(scores["best_f1"])


def test_prediction_abstains_above_the_threshold(tok, tmp_path):
    dev = _squad2(tmp_path / "dev.jsonl", 1)
    cfg = th.body("bert", tok).config
    for tau, abstains in ((0.5, True), (1.5, False)):
        task = build_task(TaskSpec(task="qa", null_threshold=tau), tok, cfg)
        (ex,) = task.encode(read_table(dev))
        T = len(ex["input_ids"])
        i = ex["context_tokens"][3]
        logits = torch.zeros(1, T, 2)
        logits[0, 0] = torch.tensor([2.0, 2.0])   # s_null = 4
        logits[0, i] = torch.tensor([1.5, 1.5])   # s_best = 3: diff 1
        (pred,) = task.predict(None, [ex], None, SimpleNamespace(logits=logits))
        assert pred["null_score_diff"] == 1.0 and (pred["answer"] == "") == abstains
        assert pred["span"] == ex["context"][ex["offsets"][i][0]:ex["offsets"][i][1]]


def test_v1_data_keeps_v1_scores(tok, tmp_path):
    dev = th.write_qa(tmp_path / "dev.jsonl", 4)
    task = build_task(TaskSpec(task="qa"), tok, th.body("bert", tok).config)
    examples = task.encode(read_table(dev))
    preds = [{"answer": g["gold"][0], "null_score_diff": 9.0} for g in examples]
    assert task.score(examples, preds) == {"exact_match": 1.0, "f1": 1.0}


def test_answer_not_at_its_offset_is_one_line_naming_file_and_row(tok, tmp_path, capsys):
    bad = tmp_path / "train.jsonl"
    rows = [{"question": "where ?", "context": "ana lives in rome", "answers": {"text": ["rome"], "answer_start": [13]}},
            {"question": "where ?", "context": "ana lives in rome", "answers": {"text": ["rome"], "answer_start": [4]}}]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    task = build_task(TaskSpec(task="qa"), tok, th.body("bert", tok).config)
    with pytest.raises(TaskDataError, match=r"^train.jsonl: row 2 \(line 2\): answer 'rome' is not in the context "
                                            r"at character 4$"):
        task.encode(read_table(bad))
    model_dir = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    assert main(["finetune", "--model", str(model_dir), "--task", "qa", "--train", str(bad), "--max-steps", "1",
                 "--no-progress", "--no-tensorboard", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("train.jsonl: row 2 (line 2): answer 'rome' is not in the context at character 4")
    assert not (tmp_path / "run" / "checkpoints").exists()
