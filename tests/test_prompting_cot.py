"""Chain-of-thought few-shot prompting (`prompt generate --cot`) and the arithmetic word problems it is scored on:
demonstrations show their rationale before the answer, the answer scored is the one extracted from the generated
chain, the problems are reproducible and their worked steps are right, and bad input is one line."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from lmforge import checkpoint
from lmforge.align.grpo import arithmetic_prompts
from lmforge.cli.main import main
from lmforge.datasets import arithmetic
from lmforge.errors import LmforgeError
from lmforge.generation import generate_text
from lmforge.prompting import ChainOfThought
from lmforge.prompting import generative
from lmforge.prompting.generative import TASKS, choose, few_shot, few_shot_task, run_few_shot
from lmforge.tasks import metrics
from tests import task_helpers as th

STEP = re.compile(r"^(\d+) (plus|minus) (\d+) is (\d+)$")


def cot_task():
    return few_shot_task({**generative.PROMPT_DEFAULTS, "task": "arithmetic", "cot": True})


def test_a_cot_prompt_shows_each_demonstration_s_rationale_before_its_answer():
    pool = [{"text": "Mia has 3 apples. How many?", "target": "3", "rationale": "She has 3."},
            {"text": "Tom has 2 coins. He gets 4 more. How many?", "target": "6", "rationale": "2 plus 4 is 6."}]
    query = {"text": "Ana has 1 book. How many?", "target": "1"}
    assert cot_task().prompt(pool, [1, 0], query) == (
        "Q: Tom has 2 coins. He gets 4 more. How many?\nA: 2 plus 4 is 6. The answer is 6.\n\n"
        "Q: Mia has 3 apples. How many?\nA: She has 3. The answer is 3.\n\n"
        "Q: Ana has 1 book. How many?\nA:")
    # the layout is ChainOfThought's, and without --cot the same task shows bare answers
    assert cot_task().prompt(pool, [1], query) == ChainOfThought().prompt(
        [((pool[1]["text"],), pool[1]["rationale"], "6")], query["text"])
    assert TASKS["arithmetic"].prompt(pool, [1], query) == (
        "Q: Tom has 2 coins. He gets 4 more. How many?\nA: 6\n\nQ: Ana has 1 book. How many?\nA:")
    assert cot_task().answer(" 1 plus 1 is 2. The answer is 2.\n") == "2" and cot_task().answer(" 2 2") == ""


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    tok = th.tokenizer(folder, "gpt")
    torch.manual_seed(0)
    model = th.body("gpt", tok, max_seq_len=64).eval()
    return model, tok, checkpoint.save(model, folder / "model", tokenizer=tok)


def test_cot_scores_the_answers_extracted_from_the_greedy_chains(gpt):
    model, tok, _ = gpt
    task, pool, queries = cot_task(), arithmetic.split("train")[:20], arithmetic.split("test")[:4]
    result = few_shot(model, tok, task, pool, queries, shots=[2], seeds=[0], max_new_tokens=8, batch_size=2)
    run = result["runs"][0]
    prompts = [task.prompt(pool, idx, q) for idx, q in zip(choose(len(pool), 2, 0, len(queries)), queries)]
    room = model.config.max_seq_len - 8
    by_hand = [generate_text(model, tok, [tok.decode(tok.encode(p)[-room:])], max_new_tokens=8)[0] for p in prompts]
    assert run["outputs"] == [o.split("\n", 1)[0].strip() for o in by_hand]
    extracted = [ChainOfThought().extract(o) or "" for o in run["outputs"]]
    assert run["answers"] == extracted
    assert run["score"] == 100 * metrics.qa(extracted, [[q["target"]] for q in queries])["exact_match"]


def test_the_score_is_exact_match_of_the_extracted_answers_not_of_the_chains(gpt, monkeypatch):
    model, tok, _ = gpt
    queries = arithmetic.split("test")[:4]
    chains = [f"{q['rationale']} The answer is {q['target']}." for q in queries[:2]]  # right, with its steps
    chains += [f"The answer is {int(queries[2]['target']) + 1}.", queries[3]["target"]]  # wrong; no "answer is"
    monkeypatch.setattr(generative, "answers", lambda *args, **kwargs: chains)
    run = few_shot(model, tok, cot_task(), arithmetic.split("train")[:8], queries, [1], [0])["runs"][0]
    assert run["answers"] == [queries[0]["target"], queries[1]["target"], str(int(queries[2]["target"]) + 1), ""]
    assert run["score"] == 50.0  # 2 of 4; the bare right number of the last is not an extracted answer
    standard = few_shot(model, tok, TASKS["arithmetic"], arithmetic.split("train")[:8], queries, [1], [0])
    assert standard["runs"][0]["score"] == 25.0 and "answers" not in standard["runs"][0]  # whole lines scored


def test_arithmetic_problems_are_reproducible_and_their_rationales_add_up():
    train, test = arithmetic.split("train"), arithmetic.split("test")
    assert train == arithmetic.problems(1000, seed=arithmetic.SPLITS["train"][0])  # drawn afresh: the same rows
    assert train[0] == {"text": "Sam has 7 coins. He gives away 2. Then he gets 7 more. How many coins does he have "
                                "now?", "target": "12", "rationale": "7 minus 2 is 5. 5 plus 7 is 12."}
    assert (len(train), len(test)) == (1000, 200) and train[:5] != test[:5]
    keys = {"train": set(), "test": set()}
    for name, rows in (("train", train), ("test", test)):
        for row in rows:
            numbers = [int(w) for w in re.findall(r"\d+", row["text"])]
            steps = [STEP.match(s).groups() for s in row["rationale"].removesuffix(".").split(". ")]
            total = numbers[0]
            for (a, op, b, c), n in zip(steps, numbers[1:]):
                assert int(a) == total and int(b) == n  # each step starts from the last total, takes the next number
                total = total + n if op == "plus" else total - n
                assert int(c) == total >= 0
            assert len(steps) == len(numbers) - 1 == 2 and row["target"] == str(total)
            assert row["text"].count("gives away") == row["rationale"].count("minus")
            keys[name].add((tuple(numbers), tuple(op for _, op, _, _ in steps)))
        assert len(keys[name]) == len(rows)  # no problem twice in a split
    assert not keys["train"] & keys["test"]  # no query is a demonstration
    with pytest.raises(LmforgeError, match="no split 'dev'"):
        arithmetic.split("dev")


def test_grpo_draws_its_sums_with_the_shared_generator_as_before():
    rng = random.Random(3)  # the draw order GRPO's sums have always had: a, b, then the operation
    expected = []
    for k in range(40):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        expected.append({"prompt": f"{a}{op}{b}=", "answer": str(a + b if op == "+" else a - b),
                         "where": f"arithmetic problem {k + 1}"})
    assert arithmetic_prompts(40, seed=3) == expected


def test_prompt_generate_cot_cli_writes_what_run_few_shot_returns(gpt, tmp_path, capsys):
    _, _, folder = gpt
    argv = ["prompt", "generate", "--model", str(folder), "--task", "arithmetic", "--cot", "--shots", "0,1",
            "--seeds", "0,1", "--limit", "3", "--max-new-tokens", "6", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "exact_match (0-100), chain-of-thought" in printed
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["cot"] is True and saved["metric"] == "exact_match" and saved["queries"] == 3
    assert all(len(r["answers"]) == 3 for r in saved["models"][str(folder)]["runs"])
    last = json.loads(printed.strip().splitlines()[-1])
    assert last == {str(folder): {str(row["k"]): row["mean"] for row in saved["models"][str(folder)]["table"]}}
    again = run_few_shot({"model": [str(folder)], "task": "arithmetic", "cot": True, "shots": [0, 1],
                          "seeds": [0, 1], "limit": 3, "max_new_tokens": 6})
    assert again["models"] == saved["models"]


@pytest.mark.parametrize("flags, expected", [
    (["--task", "kjv-rv1909", "--cot"], "--cot: the pool kjv-rv1909:train has no 'rationale' column of rationales"),
    (["--task", "arithmetic", "--cot", "--rationale-column", "why"], "--cot: the pool arithmetic:train has no 'why'"),
    (["--data", "arithmetic:test", "--pool", "arithmetic:train", "--template", "Q: {x}\\nA:", "--input-column",
      "question"], "arithmetic:train: needs columns question and target; missing ['question']"),
    (["--task", "arithmetic", "--shots", "1,x"], "--shots '1,x': expected integers"),
])
def test_bad_input_is_one_line(gpt, flags, expected, capsys):
    _, _, folder = gpt
    assert main(["prompt", "generate", "--model", str(folder), "--limit", "2", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
