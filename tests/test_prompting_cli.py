"""``lmforge prompt classify`` end to end on a tiny model folder and tiny data."""

from __future__ import annotations

import json

import pytest

import lmforge
from prompting_helpers import body, sentiment_rows, tokenizer
from lmforge.cli.main import main
from lmforge.cli.prompt import classification_metrics
from lmforge.prompting import Template, Verbalizer, classify
from lmforge.tokenization import Tokenizer

TEMPLATE = "Review: {x} Overall, it was {z}."
VERB = '{"negative": ["bad", "awful"], "positive": ["great", "lovely"]}'


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt_cli")
    tok = tokenizer(root, "gpt")
    folder = lmforge.save(body("gpt-tiny", tok), root / "model", tokenizer=tok)
    names = {"1": "positive", "0": "negative"}
    test = [{**r, "label": names[r["label"]]} for r in sentiment_rows(12, seed=3)]
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test), encoding="utf-8")
    pool = "".join(f"{r['text']}\t{r['label']}\n" for r in sentiment_rows(16))
    (root / "pool.tsv").write_text("text\tlabel\n" + pool, encoding="utf-8")
    return root, folder, test


def _run(capsys, *args):
    rc = main(["prompt", "classify", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("extra", [[], ["--shots", "4", "--selection", "balanced", "--calibrate"],
                                   ["--shots", "2", "--selection", "knn", "--reduction", "mean"]])
def test_classify_prints_metrics_that_match_the_api(capsys, setup, extra):
    root, folder, test = setup
    rc, out, _ = _run(capsys, "--model", str(folder), "--template", TEMPLATE, "--verbalizer", VERB,
                      "--data", str(root / "test.jsonl"), "--pool", str(root / "pool.tsv"), *extra)
    assert rc == 0
    metrics = json.loads(out.strip().splitlines()[-1])
    assert metrics["n"] == 12 and "accuracy:" in out and "macro F1:" in out
    # the same run through the Python API (pool labels 0/1 name the verbalizer's keys in order)
    v = Verbalizer.from_json(VERB)
    pool = [{"text": line.split("\t")[0], "label": v.labels[int(line.split("\t")[1])]}
            for line in (root / "pool.tsv").read_text().splitlines()[1:]]
    shots = int(extra[1]) if extra else 0
    opts = dict(selection=extra[3], calibrate="--calibrate" in extra,
                reduction="mean" if "mean" in extra else "sum") if extra else {}
    result = classify(lmforge.load(folder), Tokenizer.load(folder), Template(TEMPLATE), v, test, pool=pool,
                      shots=shots, **opts)
    expected = classification_metrics([r["label"] for r in test], result.predictions, v.labels)
    assert metrics["accuracy"] == pytest.approx(expected["accuracy"])
    assert metrics["macro_f1"] == pytest.approx(expected["macro_f1"])
    assert metrics["majority_baseline"] == pytest.approx(0.5)


def test_classify_reads_a_shipped_dataset(capsys, setup):
    _, folder, _ = setup
    rc, out, _ = _run(capsys, "--model", str(folder), "--template", TEMPLATE, "--verbalizer",
                      '{"negative": "bad", "positive": "great"}', "--data", "rt-sentiment:test", "--limit", "5")
    assert rc == 0 and json.loads(out.splitlines()[-1])["n"] == 5


def test_user_errors_are_one_line(capsys, setup):
    root, folder, _ = setup
    base = ["--model", str(folder), "--template", TEMPLATE, "--verbalizer", VERB, "--data"]
    rc, _, err = _run(capsys, *base, str(root / "test.jsonl"), "--shots", "2")
    assert rc == 2 and "--pool" in err
    rc, _, err = _run(capsys, *base, "nosuch:test")
    assert rc == 2 and "not a shipped data set" in err
    rc, _, err = _run(capsys, "--model", str(folder), "--template", TEMPLATE, "--verbalizer", '{"a": "b"}',
                      "--data", str(root / "test.jsonl"))
    assert rc == 2 and "verbalizer keys" in err


def test_metrics_formula():
    m = classification_metrics(["a", "a", "a", "b"], ["a", "b", "a", "b"], ["a", "b"])
    assert m["accuracy"] == 0.75 and m["majority_baseline"] == 0.75
    assert m["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prompt", "classify", "--help"])
    assert exc.value.code == 0
    assert "--calibrate" in capsys.readouterr().out
