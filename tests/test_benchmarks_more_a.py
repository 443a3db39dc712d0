"""ReCoRD, SNLI, SciTail, RACE, SST-5, IMDb and TREC-6 by name: each hand-written fixture in the official layout
reads through the registry into the rows its task takes, its metric equals a reference (sklearn; ReCoRD: the
official script's rule, written out here), and a missing file or a bad row is one line naming it."""

from __future__ import annotations

import collections
import hashlib
import json
import re
import shutil
import string
from pathlib import Path

import pytest
from sklearn import metrics as skm

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.datasets import benchmark_readers as readers
from lmforge.datasets import benchmarks as layouts
from lmforge.evaluation import benchmarks
from lmforge.tasks import metrics
from lmforge.tasks.data import read_table
from tests import task_helpers as th

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"
NAMES = ("superglue/record", "snli/snli", "scitail/scitail", "race/race", "sst/sst5", "imdb/imdb", "trec/trec6")
SOURCES = {"snli": "https://nlp.stanford.edu/projects/snli/", "scitail": "https://allenai.org/data/scitail",
           "race": "https://www.cs.cmu.edu/~glai1/data/race/", "sst": "https://nlp.stanford.edu/sentiment/",
           "imdb": "https://ai.stanford.edu/~amaas/data/sentiment/",
           "trec": "https://cogcomp.seas.upenn.edu/Data/QA/QC/"}


@pytest.fixture(autouse=True)
def no_suite_variables(monkeypatch):
    for env, _ in layouts.SUITES.values():
        monkeypatch.setenv(env, "")  # recorded first, so a --data-dir that sets it is undone at teardown
        monkeypatch.delenv(env)


def _table(name: str, split: str):
    return benchmarks.table(name, split, FIXTURES / layouts.LAYOUTS[name].suite)


def test_names_are_listed_with_their_variables(capsys):
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMES)
    assert all(f"${env}" in out for env, _ in readers.SUITES.values())
    assert main(["tasks", "show", "race/race"]) == 0
    shown = capsys.readouterr().out
    assert "RACE/dev" in shown and "multiple-choice" in shown and "LMFORGE_RACE_DIR" in shown
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "trec/trec6" in helped and "$LMFORGE_IMDB_DIR" in helped
    for name in NAMES:
        assert layouts.SUITES[layouts.LAYOUTS[name].suite][1].startswith(SOURCES.get(name.split("/")[0], "https"))
    assert main(["datasets", "list"]) == 0  # the shipped demo sets, then where the benchmarks are listed
    assert "`lmforge tasks list`" in capsys.readouterr().out


def test_official_layouts_read_as_task_rows():
    snli = _table("snli/snli", "train")  # the row with gold_label "-" (no majority) is dropped
    assert len(snli) == 5 and "-" not in {r["gold_label"] for r in snli.rows}
    assert snli.where(4).endswith("snli_1.0_train.jsonl: row 5 (line 6)")  # line 5 was the "-" row
    assert [r["label"] for r in _table("scitail/scitail", "test").rows] == ["entails", "neutral", "entails"]
    sst = _table("sst/sst5", "train")
    assert [r["label"] for r in sst.rows] == ["4", "0", "2", "3", "1"]
    assert sst.rows[0]["sentence"] == "A lovely little film" and sst.rows[3]["sentence"] == "( quite ) good"
    race = _table("race/race", "train")
    assert [(r["level"], r["label"]) for r in race.rows] == [("middle", 1), ("middle", 2), ("high", 0)]
    assert race.rows[1]["choice2"] == "Tom rides his bike to school ."  # the option fills the blank
    assert race.rows[0]["choice1"] == "What colour is Tom's bike? Red" and race.rows[0]["context"].startswith("Tom")
    record = _table("superglue/record", "val")
    assert [r["id"] for r in record.rows] == ["3-30", "3-31", "4-40"]
    first = record.rows[0]
    start = first["answers"]["answer_start"][0]
    assert first["context"][start:start + len("Leo Grant")] == "Leo Grant" and "@placeholder" in first["question"]
    assert first["entities"] == ["Leo Grant", "Bath"]
    assert _table("superglue/record", "test").rows[0]["answers"] == {"text": [], "answer_start": []}
    trec = _table("trec/trec6", "test")
    assert [r["label"] for r in trec.rows] == ["DESC", "ENTY", "HUM", "LOC", "NUM", "ABBR"]
    assert trec.rows[0] == {"label": "DESC", "fine_label": "DESC:def", "text": "What is gravity ?"}
    imdb = _table("imdb/imdb", "test")  # unsup/ and the url lists are not reviews
    assert sorted(r["id"] for r in imdb.rows) == ["neg/0_1.txt", "neg/1_3.txt", "pos/0_10.txt", "pos/1_8.txt"]
    assert {r["id"]: r["rating"] for r in imdb.rows}["pos/0_10.txt"] == 10


@pytest.mark.parametrize("name", ["imdb/imdb", "trec/trec6"])
def test_carved_dev_is_a_seeded_tenth_of_each_class(name):
    train, dev = _table(name, "train"), _table(name, "dev")
    # the key: the review's path (IMDb), the question's line number in train_5500.label (TREC)
    keys = ([r["id"] for r in train.rows + dev.rows] if name == "imdb/imdb" else
            [str(n) for n in train.lines + dev.lines])
    labels = [r["label"] for r in train.rows + dev.rows]
    assert len(set(keys)) == len(keys)  # disjoint
    assert len(keys) == {"imdb/imdb": 8, "trec/trec6": 18}[name]  # together, every row of the training split
    expected = set()  # the documented rule: per class, the tenth (>= 1) with the smallest sha256("lmforge-dev-0:KEY")
    for label in set(labels):
        members = sorted((k for k, lab in zip(keys, labels) if lab == label),
                         key=lambda k: hashlib.sha256(f"lmforge-dev-0:{k}".encode()).hexdigest())
        expected.update(members[:max(1, len(members) // 10)] if len(members) > 1 else [])
    assert set(keys[len(train):]) == expected
    if name == "trec/trec6":
        assert "What is the sister city of Malm\xf6 ?" in [r["text"] for r in train.rows + dev.rows]  # Latin-1 byte


@pytest.mark.parametrize("name", [n for n in NAMES if n != "superglue/record"])
def test_accuracy_equals_sklearn(name):
    bench = benchmarks.get(name)
    rows = [r for split in bench.evals for r in _table(name, split).rows]
    gold = [str(r[bench.columns["label"]]) for r in rows]
    options = list(bench.labels) or ["0", "1", "2", "3"]
    pred = [options[(options.index(g) + (k % 2)) % len(options)] for k, g in enumerate(gold)]  # every other wrong
    assert benchmarks.score(name, gold, pred) == {"accuracy": pytest.approx(skm.accuracy_score(gold, pred))}
    assert bench.metrics == ("accuracy",) and set(gold) <= set(options)


# The official ReCoRD evaluation (SuperGLUE's record_evaluation.py, SQuAD v1.1's rule), written out here.
def _official_normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _official_f1(prediction: str, ground_truth: str) -> float:
    p, g = _official_normalize(prediction).split(), _official_normalize(ground_truth).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _official(predictions: dict[str, str], file: Path) -> dict[str, float]:
    """Mean over queries of max over answers of EM and F1, gold answers read from the raw JSONL."""
    em = f1 = n = 0.0
    for line in file.read_text().splitlines():
        for qa in json.loads(line)["qas"]:
            golds = [a["text"] for a in qa["answers"]]
            pred = predictions[str(qa["idx"])]
            em += max(float(_official_normalize(pred) == _official_normalize(g)) for g in golds)
            f1 += max(_official_f1(pred, g) for g in golds)
            n += 1
    return {"exact_match": em / n, "f1": f1 / n}


def test_record_metric_is_the_official_scripts():
    table = _table("superglue/record", "val")
    preds = ["Leo", "bath.", "United Nations"]  # F1 2/3, EM 0; "bath." == "Bath"; article dropped: EM 1
    mine = metrics.qa(preds, [r["answers"]["text"] for r in table.rows])
    official = _official({r["id"].split("-")[1]: p for r, p in zip(table.rows, preds)},
                         FIXTURES / "superglue" / "ReCoRD" / "val.jsonl")
    assert mine == pytest.approx(official)
    assert official == pytest.approx({"exact_match": 2 / 3, "f1": (2 / 3 + 1 + 1) / 3})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


def _copy(suite: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / suite, tmp_path / suite))


def test_a_missing_split_names_the_file_and_the_source(tmp_path, model_dir, capsys):
    with pytest.raises(FileNotFoundError) as err:
        read_table("trec/trec6:test")
    assert str(err.value) == ("$LMFORGE_TREC_DIR/TREC_10.label: not found (pass --data-dir or set LMFORGE_TREC_DIR); "
                              "trec/trec6 is not shipped with lmforge: get the official data from "
                              "https://cogcomp.seas.upenn.edu/Data/QA/QC/ (train_5500.label, TREC_10.label)")
    snli = _copy("snli", tmp_path)
    (snli / "snli_1.0" / "snli_1.0_dev.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{snli}/snli_1.0/snli_1.0_dev.jsonl: not found; snli/snli "
                                                          "is not shipped with lmforge: get the official data from "
                                                          "https://nlp.stanford.edu/projects/snli/")):
        benchmarks.table("snli/snli", "dev", snli)
    race = _copy("race", tmp_path)
    shutil.rmtree(race / "RACE" / "dev" / "high")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{race}/RACE/dev/high: not found (RACE's dev split is "
                                                          "dev/middle/ and dev/high/); get the official data from "
                                                          "https://www.cs.cmu.edu/~glai1/data/race/")):
        benchmarks.table("race/race", "dev", race)
    imdb = _copy("imdb", tmp_path)
    shutil.rmtree(imdb / "aclImdb" / "train" / "neg")
    assert main(["finetune", "--model", str(model_dir), "--task", "imdb/imdb", "--data-dir", str(imdb),
                 "--max-steps", "1", "--out", str(tmp_path / "r")]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].endswith(
        f"{imdb}/aclImdb/train/neg: not found (aclImdb's train/ holds neg/ and pos/); get the official data from "
        "https://ai.stanford.edu/~amaas/data/sentiment/ (aclImdb_v1.tar.gz)"), err_lines
    assert not (tmp_path / "r").exists()  # refused before anything is written


BAD = [  # (suite, file under the suite's folder, its new text, name, split, the error's tail)
    ("sst", "trees/dev.txt", "(3 (2 A) (3 fine) (2 film))\n(7 (2 Bad) (2 label))\n", "sst/sst5", "dev",
     "dev.txt: line 2: not a sentiment tree '(LABEL (LABEL word) ...)' with labels 0-4: '(7 (2 Bad) (2 label))'"),
    ("sst", "trees/test.txt", "(3 (2 A) (3 fine)\n", "sst/sst5", "test", "test.txt: line 1: not a sentiment tree"),
    ("trec", "TREC_10.label", "DESC:def What is a star ?\nNUM:date\nWHAT:x Is this ?\n", "trec/trec6", "test",
     "TREC_10.label: line 2: expected 'COARSE:fine question' with COARSE one of ABBR, DESC, ENTY, HUM, LOC, NUM"),
    ("superglue", "ReCoRD/val.jsonl", None, "superglue/record", "val", "val.jsonl: line 2: not valid JSON"),
    ("superglue", "ReCoRD/train.jsonl", "moved", "superglue/record", "train",
     "train.jsonl: line 1: not a ReCoRD record (passage.text, passage.entities, qas[].query, qas[].answers, idx): "
     "answer 'Ana Lopez' is not the passage's characters 1..9 ('na Lopez ')"),
    ("scitail", "SciTailV1.1/tsv_format/scitail_1.0_dev.tsv", "a\tb\tentails\nonly two\tfields\n", "scitail/scitail",
     "dev", "scitail_1.0_dev.tsv: row 2 (line 2): 2 fields, but the layout has 3 (premise, hypothesis, label)"),
    ("race", "RACE/test/high/6.txt", '{"article": "A.", "questions": ["Q?"], "options": [["a", "b", "c"]], '
     '"answers": ["A"]}', "race/race", "test", "6.txt: question 1: expected 4 options and an answer A-D, got 3 "
     "options and 'A'"),
    ("imdb", "aclImdb/test/pos/7.txt", "A review without a rating.", "imdb/imdb", "test",
     "7.txt: not a review file name ID_RATING.txt (aclImdb's layout)"),
]


@pytest.mark.parametrize("suite,file,text,name,split,tail", BAD, ids=[f"{b[3]}:{b[1]}" for b in BAD])
def test_a_bad_row_names_the_file_and_the_line(suite, file, text, name, split, tail, tmp_path):
    root = _copy(suite, tmp_path)
    target = root / file
    if text is None:  # a broken second line
        target.write_text(target.read_text().splitlines()[0] + "\n{not json\n")
    elif text == "moved":  # an answer whose offsets miss its text by one character
        row = json.loads(target.read_text().splitlines()[0])
        row["qas"][0]["answers"][0]["start"] += 1
        row["qas"][0]["answers"][0]["end"] += 1
        target.write_text(json.dumps(row) + "\n")
    else:
        target.write_text(text)
    with pytest.raises(ValueError) as err:
        benchmarks.table(name, split, root)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(root)) and tail in message, message


def test_the_docs_table_lists_every_benchmark():
    page = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|", page, re.M)
    assert set(rows) >= set(layouts.LAYOUTS), sorted(set(layouts.LAYOUTS) - set(rows))
    assert all(f"`${env}`" in page for env, _ in layouts.SUITES.values())
