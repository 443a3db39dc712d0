"""The instruction-tuning demonstration set: held-out examples and phrasings, balance, and its evaluation."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from prompting_helpers import body, tokenizer
from lmforge.prompting.demonstrations import (
    KINDS, build_demonstrations, choice_scores, evaluate_instructions, first_word, generate_responses,
    score_responses, write_jsonl,
)
from lmforge.prompting.instruct import ChatTemplate, alpaca_to_messages, read_instruct_jsonl


@pytest.fixture(scope="module")
def train_rows():
    return build_demonstrations("train", per_kind=400, seed=0)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("demo_tok"), "gpt")


def test_held_out_inputs_and_phrasing_never_occur_in_training(train_rows):
    everything = build_demonstrations("train", per_kind=100_000, seed=0)  # every short training example
    seen_inputs = {r["input"] for r in everything}
    for phrasing in ("seen", "unseen"):
        test = build_demonstrations("test", per_kind=200, phrasing=phrasing, seed=1)
        assert {r["kind"] for r in test} == set(KINDS)
        assert not seen_inputs & {r["input"] for r in test}
        for r in test:
            kind = KINDS[r["kind"]]
            if phrasing == "seen":
                assert r["instruction"] in kind.instructions
            else:
                assert r["instruction"] == kind.unseen
    unseen = {k.unseen for k in KINDS.values()}
    assert not unseen & {r["instruction"] for r in everything}
    # every training phrasing is used, so "seen" means seen
    for name, kind in KINDS.items():
        assert {r["instruction"] for r in train_rows if r["kind"] == name} == set(kind.instructions)


def test_counts_balance_and_length_limit(train_rows):
    counts = Counter(r["kind"] for r in train_rows)
    assert counts == {name: 400 for name in KINDS}
    for name, kind in KINDS.items():
        if kind.answers:
            assert Counter(r["output"] for r in train_rows if r["kind"] == name) == {a: 200 for a in kind.answers}
    odd = build_demonstrations("dev", kinds=["sentiment"], per_kind=7, max_words=12)
    assert Counter(r["output"] for r in odd) == {"negative": 4, "positive": 3}
    assert all(len(r["input"].split()) <= 12 and len(r["output"].split()) <= 12 for r in odd)
    # the limit is per text: a pair's input may hold twice as many words
    pairs = build_demonstrations("dev", kinds=["paraphrase"], per_kind=200, max_words=20)
    assert max(len(r["input"].split()) for r in pairs) > 20
    assert all(len(r["input"].split()) <= 2 * 20 for r in pairs)
    # when an answer is scarce, the others are cut to its count: still balanced
    scarce = build_demonstrations("train", kinds=["paraphrase"], per_kind=100_000, max_words=12)
    counts = Counter(r["output"] for r in scarce)
    assert counts["yes"] == counts["no"] > 0


def test_rows_are_a_function_of_the_seed():
    a = build_demonstrations("dev", per_kind=30, seed=3)
    assert a == build_demonstrations("dev", per_kind=30, seed=3)
    assert a != build_demonstrations("dev", per_kind=30, seed=4)
    per_kind = build_demonstrations("dev", per_kind={"sentiment": 5, "translate": 2}, kinds=["sentiment", "translate"])
    assert Counter(r["kind"] for r in per_kind) == {"sentiment": 5, "translate": 2}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown demonstration kinds"):
        build_demonstrations("train", kinds=["summarise"])
    with pytest.raises(ValueError, match="split must be one of"):
        build_demonstrations("validation")
    with pytest.raises(ValueError, match="phrasing must be one of"):
        build_demonstrations("test", phrasing="new")


def test_jsonl_is_what_instruction_tuning_reads(tmp_path):
    rows = build_demonstrations("dev", per_kind=20, seed=0)
    path = write_jsonl(rows, tmp_path / "demo.jsonl")
    assert read_instruct_jsonl(path) == [alpaca_to_messages(r) for r in rows]
    accented = [r["output"] for r in rows if any(c in r["output"] for c in "áéíóúñ")]
    assert accented and accented[0] in path.read_text(encoding="utf-8")  # written as UTF-8, not \\u escapes


def test_demonstrations_train_through_the_cli(tok, tmp_path):
    """``lmforge finetune --task instruct`` on the written JSONL, without --pack (which once crashed)."""
    from lmforge.cli.main import main

    base = body("gpt-tiny", tok).save(tmp_path / "base", tokenizer=tok)
    train = write_jsonl(build_demonstrations("dev", per_kind=4, max_words=10), tmp_path / "train.jsonl")
    code = main(["finetune", "--task", "instruct", "--model", str(base), "--train", str(train), "--out",
                 str(tmp_path / "run"), "--max-length", "96", "--max-steps", "2", "--batch-size", "4",
                 "--precision", "fp32", "--no-progress", "--no-tensorboard"])
    assert code == 0
    assert (tmp_path / "run" / "model" / "chat_template.json").is_file()


def test_first_word_normalises_a_response():
    assert first_word(" Positive.") == "positive"
    assert first_word("yes, they do") == "yes"
    assert first_word("  ...  ") == ""


def test_scores_per_kind_against_hand_counts():
    verses = ["Y dijo Dios: Sea la luz, y fué la luz.", "Y vió Dios que la luz era buena."]
    rows = [{"kind": "sentiment", "output": "positive"}, {"kind": "sentiment", "output": "negative"},
            {"kind": "sentiment", "output": "negative"}] + [{"kind": "translate", "output": v} for v in verses]
    result = score_responses(rows, ["Positive!", "positive", "maybe so", *verses])
    assert result["sentiment"] == {"accuracy": 1 / 3, "valid": 2 / 3, "majority": 2 / 3, "n": 3}
    assert result["translate"]["bleu"] == pytest.approx(100.0)
    assert result["translate"]["n"] == 2
    wrong = score_responses(rows[3:], ["nada", "nada"])
    assert wrong["translate"]["bleu"] < 1 and wrong["translate"]["chrf"] < result["translate"]["chrf"]
    with pytest.raises(ValueError, match="5 rows but 4 responses"):
        score_responses(rows, ["x"] * 4)


def _rows():
    return [{"instruction": "Is this movie review positive or negative?", "input": text, "output": out,
             "kind": "sentiment"} for text, out in [("the film was good", "positive"), ("a dull plot", "negative"),
                                                    ("really very awful and poor , overall", "negative")]]


@torch.no_grad()
def test_choice_scores_equal_a_full_forward(tok):
    model = body("gpt-tiny", tok)
    rows, answers = _rows(), ["negative", "positive"]
    got = choice_scores(model, tok, rows, answers, batch_size=2)  # batched: left padding, shared cache
    template, eos = ChatTemplate(), tok.token_to_id(tok.special_token("eos"))
    for n, row in enumerate(rows):
        prompt = template.encode(tok, alpaca_to_messages(row)[:1], add_generation_prompt=True)[0]
        for a, answer in enumerate(answers):
            target = tok.encode(answer, add_special_tokens=False) + [eos]
            ids = torch.tensor([prompt + target[:-1]])
            logp = F.log_softmax(model(ids).logits[0, len(prompt) - 1:].float(), -1)  # (L, V)
            expected = logp.gather(-1, torch.tensor(target)[:, None]).sum()
            assert got[n, a] == pytest.approx(float(expected), abs=1e-4)


@torch.no_grad()
def test_responses_are_greedy_continuations_of_the_chat_prompt(tok):
    model = body("gpt-tiny", tok)
    rows = _rows()
    responses = generate_responses(model, tok, rows, max_new_tokens=6, batch_size=2)
    for row, response in zip(rows, responses):
        ids = ChatTemplate().encode(tok, alpaca_to_messages(row)[:1], add_generation_prompt=True)[0]
        new = []
        for _ in range(6):  # greedy by hand, no cache
            nxt = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            new.append(nxt)
            if nxt == model.config.eos_token_id:
                break
        assert response == tok.decode(new).strip()
    metrics, again = evaluate_instructions(model, tok, rows, max_new_tokens=6, batch_size=2)
    assert again == responses
    assert set(metrics["sentiment"]) == {"accuracy", "valid", "majority", "n", "choice_accuracy"}
