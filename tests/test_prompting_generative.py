"""Generative few-shot: prompts are the template filled with seeded demonstrations; answers are the greedy
continuation to the end of the line; scores are the metric of those answers; k beyond the pool is refused; the
CLI writes the table and GPT-3's plot."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.generation import generate_text
from lmforge.prompting.generative import TASKS, GenerativeTask, answers, choose, few_shot
from lmforge.tasks import metrics
from tests import task_helpers as th

POOL = [{"en": e, "es": s} for e, s in th.NUMBERS.items()]


def test_prompts_follow_the_template_and_the_seed():
    task = TASKS["kjv-rv1909"]
    assert task.prompt(POOL, [], {"en": "six"}) == "English: six\nSpanish:"
    assert task.prompt(POOL, [0, 2], {"en": "six"}) == ("English: one\nSpanish: uno\n\nEnglish: three\nSpanish: "
                                                          "tres\n\nEnglish: six\nSpanish:")
    a, b = choose(5, 2, seed=0, n_queries=20), choose(5, 2, seed=1, n_queries=20)
    assert a == choose(5, 2, seed=0, n_queries=20) and a != b  # seeded, and the seed matters
    assert all(len(set(c)) == 2 for c in a)  # no demonstration twice in one prompt
    with pytest.raises(UserInputError, match="--shots 6 is more than the 5 demonstrations in the pool"):
        choose(5, 6, 0, 1)
    with pytest.raises(UserInputError, match="needs one {x}"):
        GenerativeTask("no slot", "en", "es")


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    tok = th.tokenizer(folder, "gpt")
    torch.manual_seed(0)
    return th.body("gpt", tok, max_seq_len=64).eval(), tok, folder


def test_answers_are_greedy_continuations_cut_at_the_line_end(gpt):
    model, tok, _ = gpt
    prompts = [TASKS["kjv-rv1909"].prompt(POOL, [1], {"en": e}) for e in ("one", "four")]
    got = answers(model, tok, prompts, max_new_tokens=12, batch_size=1)
    expected = [generate_text(model, tok, [p], max_new_tokens=12)[0].split("\n", 1)[0].strip() for p in prompts]
    assert got == expected and all("\n" not in a for a in got)


def test_scores_are_the_metric_of_the_answers(gpt):
    model, tok, _ = gpt
    task = GenerativeTask("English: {x}\nSpanish:", "en", "es", "f1")
    queries = POOL[:3]
    result = few_shot(model, tok, task, POOL, queries, shots=[0, 2], seeds=[0, 1], max_new_tokens=8)
    assert [(r["k"], r["seed"]) for r in result["runs"]] == [(0, 0), (2, 0), (2, 1)]  # k = 0 has no draw to repeat
    for run in result["runs"]:
        gold = [[q["es"]] for q in queries]
        assert run["score"] == pytest.approx(100 * metrics.qa(run["outputs"], gold)["f1"])
    two = [r["score"] for r in result["runs"] if r["k"] == 2]
    assert result["table"][1]["mean"] == pytest.approx(sum(two) / 2) and result["table"][1]["seeds"] == 2
    bleu = GenerativeTask("{x} =", "en", "es", "bleu")
    verse = "en el principio crió Dios los cielos y la tierra"
    assert bleu.score([verse], [verse]) == pytest.approx(100.0)  # sacrebleu corpus BLEU, 0-100


def test_prompt_generate_cli(gpt, tmp_path, capsys):
    model, tok, folder = gpt
    saved = checkpoint.save(model, folder / "model", tokenizer=tok)
    data = th.write_tsv(tmp_path / "q.tsv", ["en", "es"], list(th.NUMBERS.items()))
    argv = ["prompt", "generate", "--model", str(saved), "--data", str(data), "--pool", str(data), "--template",
            "English: {x}\\nSpanish:", "--input-column", "en", "--target-column", "es", "--metric", "exact_match",
            "--shots", "0,2", "--seeds", "0,1", "--max-new-tokens", "6", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last[str(saved)]) == {"0", "2"}
    assert (tmp_path / "out" / "fewshot.png").read_bytes()[:4] == b"\x89PNG"
    assert "k=0 | k=2" in (tmp_path / "out" / "table.md").read_text()
    assert main(argv[:-2] + ["--shots", "9"]) == 2
    assert "--shots 9 is more than the 5 demonstrations in the pool" in capsys.readouterr().err
