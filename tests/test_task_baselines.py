"""The baselines of tag, regress, qa, multiple-choice and seq2seq tasks, each against its reference library or a
hand computation; their folders read back by evaluate/predict; a baseline that does not fit its task refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lmforge.errors import UserInputError
from lmforge.evaluation import baselines, crf_tagger, qa_window
from lmforge.tasks.data import Table, read_table
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig

FIXTURES = Path(__file__).parent / "fixtures"
NER = FIXTURES / "tiny_ner.conll"


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{**baselines.NEURAL_DEFAULTS, "progress": False, "tensorboard": False, "eval_every": 0,
                          "save_every": 0, **kw})


# ------------------------------------------------------------------------------------------- tagging
def test_crf_predicts_as_sklearn_crfsuite_on_the_same_features_and_scores_with_seqeval(tmp_path):
    sklearn_crfsuite = pytest.importorskip("sklearn_crfsuite")
    seqeval = pytest.importorskip("seqeval.metrics")
    table = read_table(NER)
    run = baselines.train_baseline("crf", TaskSpec(task="tag"), table, table, out=tmp_path / "run",
                                   options=baselines.BaselineOptions(max_iterations=50))
    ours = [r["prediction"] for r in baselines.predict(run["model_dir"], table)]

    words = [r["tokens"] for r in table.rows]
    direct = sklearn_crfsuite.CRF(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=50, all_possible_transitions=True)
    direct.fit([crf_tagger.features(s) for s in words], [r["tags"] for r in table.rows])
    assert ours == [list(t) for t in direct.predict([crf_tagger.features(s) for s in words])]
    gold = [r["tags"] for r in table.rows]
    assert run["eval"]["f1"] == pytest.approx(seqeval.f1_score(gold, ours))
    assert (Path(run["model_dir"]) / crf_tagger.MODEL_FILE).is_file()


def test_bilstm_tagger_learns_the_fixture_and_scores_with_seqeval(tmp_path):
    seqeval = pytest.importorskip("seqeval.metrics")
    table = read_table(NER)
    run = baselines.train_baseline("bilstm-tagger", TaskSpec(task="tag"), table, table, out=tmp_path / "run",
                                   config=_config(max_steps=60, lr=1e-2, batch_size=4),
                                   options=baselines.BaselineOptions(embed_dim=16, hidden=16, dropout=0.0))
    rows = baselines.predict(run["model_dir"], table)
    pred = [r["prediction"] for r in rows]
    gold = [r["tags"] for r in table.rows]
    assert [len(p) for p in pred] == [len(g) for g in gold]
    assert run["eval"]["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
    assert run["eval"]["accuracy"] > 0.9  # 34 words, seen 60 times over: it fits them


def test_bilstm_tagger_gives_a_sentence_the_same_logits_alone_or_padded():
    import torch

    from lmforge.evaluation.bilstm_tagger import BiLSTMTagger

    torch.manual_seed(0)
    model = BiLSTMTagger(10, 3, embed_dim=4, hidden=5, dropout=0.0).eval()
    alone = model(torch.tensor([[4, 5]])).logits
    padded = model(torch.tensor([[4, 5, 0, 0], [6, 7, 8, 9]])).logits
    assert torch.allclose(alone[0], padded[0, :2], atol=1e-6)


# ------------------------------------------------------------------------------------------- regression
def test_tfidf_ridge_equals_sklearn_ridge_on_the_same_tfidf(tmp_path):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge
    from scipy.stats import pearsonr

    train, test = read_table("rt-sentiment:train").head(400), read_table("rt-sentiment:test").head(100)
    spec = TaskSpec(task="regress", label_column="score")
    run = baselines.train_baseline("tfidf-ridge", spec, train, test, out=tmp_path / "run",
                                   options=baselines.BaselineOptions(alpha=0.5))
    ours = np.array([r["prediction"] for r in baselines.predict(run["model_dir"], test)])

    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    x = vec.fit_transform([r["text"] for r in train.rows])
    ridge = Ridge(alpha=0.5).fit(x, [float(r["score"]) for r in train.rows])
    direct = ridge.predict(vec.transform([r["text"] for r in test.rows]))
    np.testing.assert_allclose(ours, direct, atol=1e-6)  # predictions are rounded to 6 places
    gold = [float(r["score"]) for r in test.rows]
    assert run["eval"]["pearson"] == pytest.approx(pearsonr(gold, direct)[0], abs=1e-5)
    assert run["eval"]["mse"] == pytest.approx(np.mean((np.array(gold) - direct) ** 2), abs=1e-5)


# ------------------------------------------------------------------------------------------- QA
def test_qa_window_picks_the_span_whose_window_holds_the_rarest_question_words():
    # Question words: where, did, the, cat, sit. Context counts: the x2, cat x1, sat x1, dog x1 ...
    # "on the mat" cannot be an answer (it holds "the"); "mat" (i=6)'s window of 2 is "on the" | ". the":
    # only "the" (IC = log(1 + 1/4)). "sat" (i=2)'s window "the cat" | "on the": cat (log 2) + the.
    context = "The cat sat on the mat. The dog ran to the cat."
    text, start, end = qa_window.answer("Where did the cat sit?", context, window=2, max_words=1)
    assert (text, context[start:end]) == ("sat", "sat")
    # Two words allowed: "sat on" has the same window words as "sat" ("the cat" | "the mat"), and loses the tie.
    assert qa_window.answer("Where did the cat sit?", context, window=2, max_words=2)[0] == "sat"


def test_qa_window_baseline_folder_scores_squad_em_and_f1(tmp_path):
    rows = [{"question": "Who wrote Hamlet?", "context": "In 1600 Shakespeare wrote Hamlet.",
             "answers": {"text": ["Shakespeare"], "answer_start": [8]}},
            {"question": "What did the dog chase?", "context": "The dog chased a red ball in the park.",
             "answers": {"text": ["a red ball"], "answer_start": [15]}}]
    table = Table("qa", rows, ["question", "context", "answers"])
    run = baselines.train_baseline("qa-window", TaskSpec(task="qa"), table, table, out=tmp_path / "run",
                                   options=baselines.BaselineOptions(window=2, max_answer_words=3))
    pred = [r["prediction"] for r in baselines.predict(run["model_dir"], table)]
    # Row 2 ("chase" is not "chased"): "chased" sees "the dog" on its left, the (IC log(1 + 1/2)) + dog (log 2);
    # "a" (and "a red", "a red ball") sees "dog chased": dog alone. The wrong answer scores EM 0, F1 0.
    assert pred == ["Shakespeare", "chased"]
    assert run["eval"]["exact_match"] == 0.5 and run["eval"]["f1"] == 0.5


# ------------------------------------------------------------------------------------------- multiple choice
def test_tfidf_mc_picks_the_most_similar_choice_by_hand(tmp_path):
    rows = [{"context": "the cat sat", "choice0": "birds fly south", "choice1": "a cat sat down", "label": "1"},
            {"context": "birds fly", "choice0": "the cat sat", "choice1": "birds sing", "label": "0"}]
    table = Table("mc", rows, ["context", "choice0", "choice1", "label"])
    run = baselines.train_baseline("tfidf-mc", TaskSpec(task="multiple-choice"), table, table, out=tmp_path / "run")
    out = baselines.predict(run["model_dir"], table)
    # Row 1 shares "cat sat" with choice 1, nothing with choice 0; row 2 shares "birds" with choice 1 only.
    assert [r["prediction"] for r in out] == [1, 1] and run["eval"]["accuracy"] == 0.5
    assert out[0]["prediction_scores"][0] == 0.0
    # The cosine by hand: idf over the 6 training texts (smooth: ln(7 / (1 + df)) + 1), sublinear tf of 1 is 1.
    texts = ["the cat sat", "birds fly", "birds fly south", "a cat sat down", "the cat sat", "birds sing"]
    vocab = sorted({w for t in texts for w in t.split() if len(w) > 1})  # the default token pattern: 2+ letters
    idf = {w: math.log(7 / (1 + sum(w in t.split() for t in texts))) + 1 for w in vocab}

    def vec(text):
        v = np.array([idf[w] if w in text.split() else 0.0 for w in vocab])
        return v / np.linalg.norm(v)

    assert out[0]["prediction_scores"][1] == pytest.approx(float(vec("the cat sat") @ vec("a cat sat down")),
                                                           abs=1e-6)


# ------------------------------------------------------------------------------------------- seq2seq
def test_lead_3_is_the_first_three_sentences_and_scores_with_rouge(tmp_path):
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    source = "Storms hit the coast. Power is out. Schools close! Officials said more rain comes? It did."
    rows = [{"source": source, "target": "Storms hit the coast and schools close."}]
    table = Table("sum", rows, ["source", "target"])
    run = baselines.train_baseline("lead-3", TaskSpec(task="seq2seq"), table, table, out=tmp_path / "run")
    pred = baselines.predict(run["model_dir"], table)[0]["prediction"]
    assert pred == "Storms hit the coast. Power is out. Schools close!"
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    assert run["eval"]["rouge1"] == pytest.approx(scorer.score(rows[0]["target"], pred)["rouge1"].fmeasure)


# ------------------------------------------------------------------------------------------- fitting the task
def test_a_baseline_that_does_not_fit_the_task_is_refused_naming_those_that_do(tmp_path):
    table = read_table(NER)
    with pytest.raises(UserInputError, match=r"--baseline tfidf-logreg does not train --task tag; for tag choose: "
                                             r"crf, bilstm-tagger$"):
        baselines.train_baseline("tfidf-logreg", TaskSpec(task="tag"), table, out=tmp_path / "a")
    with pytest.raises(UserInputError, match="for classify choose: tfidf-logreg, ngram-svm, bilstm, cnn"):
        baselines.train_baseline("crf", TaskSpec(task="classify"), table, out=tmp_path / "b")
    with pytest.raises(UserInputError, match="no baseline trains reward"):
        baselines.train_baseline("lead-3", TaskSpec(task="reward"), table, out=tmp_path / "c")
    assert not any(tmp_path.iterdir())


def test_every_baseline_name_has_its_tasks():
    assert set(baselines.fits()) == set(baselines.BASELINES)


def test_cli_trains_a_task_baseline_and_evaluate_and_predict_read_its_folder(tmp_path, capsys):
    from lmforge.cli.main import main

    data = tmp_path / "sum.tsv"
    data.write_text("source\ttarget\nA one. A two. A three. A four.\tA one.\nB. C. D. E. F.\tB.\n")
    assert main(["finetune", "--baseline", "lead-3", "--task", "seq2seq", "--train", str(data), "--eval", str(data),
                 "--out", str(tmp_path / "run")]) == 0
    assert main(["predict", "--model", str(tmp_path / "run" / "model"), "--data", str(data),
                 "--output", str(tmp_path / "pred.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == ["A one. A two. A three.", "B. C. D."]
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "run" / "model"), "--data", str(data)]) == 0
    assert "rouge1" in capsys.readouterr().out
    assert main(["finetune", "--baseline", "crf", "--task", "seq2seq", "--train", str(data),
                 "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "for seq2seq choose: lead-3" in err and not (tmp_path / "bad").exists()
