"""Instruction tuning: chat template, response-only labels, packing without cross-example leakage, the recipe."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from prompting_helpers import body, tokenizer
from lmforge.prompting.instruct import (
    CHAT_TEMPLATE_FILE, ChatTemplate, SFTCollator, build_instruct_dataset, finetune_instruct_from_settings,
    read_instruct_jsonl,
)

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the film was"},
        {"role": "assistant", "content": "good"}, {"role": "user", "content": "and the plot"},
        {"role": "assistant", "content": "really very dull"}]
ALPACA = {"instruction": "review the movie", "input": "the plot", "output": "awful and poor"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("sft_tok"), "gpt")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_labels_cover_exactly_the_response_tokens(tok, tmp_path):
    data = build_instruct_dataset(write_jsonl(tmp_path / "d.jsonl", [{"messages": CHAT}, ALPACA]), tok)
    batch = SFTCollator(tok.pad_id)(data)
    eos = tok.special_token("eos")
    expected = [["good" + eos, "really very dull" + eos], ["awful and poor" + eos]]
    for b, ex in enumerate(data):
        ids, resp = ex["input_ids"], ex["response_mask"]
        labels = batch["labels"][b].tolist()
        kept = [t for t, y in enumerate(labels) if y != -100]
        assert kept == [t - 1 for t in range(1, len(ids)) if resp[t]]  # exactly the response tokens, as targets
        assert all(labels[t] == ids[t + 1] for t in kept)  # aligned: position t predicts token t + 1
        # the labelled tokens spell the responses (each closed by EOS) and nothing else
        spans, run = [], []
        for t in range(len(labels)):
            if labels[t] != -100:
                run.append(labels[t])
            elif run:
                spans.append(tok.decode(run, skip_special_tokens=False)), run.clear()
        assert spans == expected[b]
        assert batch["attention_mask"][b].sum() == len(ids)
    prompt_text = tok.decode([i for i, r in zip(data[1]["input_ids"], data[1]["response_mask"]) if not r])
    assert "review the movie\n\nthe plot" in prompt_text and "awful" not in prompt_text


def test_model_loss_is_mean_cross_entropy_over_response_tokens(tok):
    model = body("gpt-tiny", tok)
    data = build_instruct_dataset([CHAT], tok)
    batch = SFTCollator(tok.pad_id)(data)
    logits = model(batch["input_ids"]).logits[0]  # (T, V)
    ids, resp = data[0]["input_ids"], data[0]["response_mask"]
    targets = [(t - 1, ids[t]) for t in range(1, len(ids)) if resp[t]]
    expected = torch.stack([-F.log_softmax(logits[p], -1)[y] for p, y in targets]).mean()
    torch.testing.assert_close(model(**batch).loss, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_packed_examples_do_not_see_each_other(tok, preset):
    model = body(preset, tok)
    convs = [CHAT, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "superb"}],
             [{"role": "user", "content": "the movie was really"}, {"role": "assistant", "content": "lovely"}]]
    data = build_instruct_dataset(convs, tok)
    length = sum(len(e["input_ids"]) for e in data)
    packed = SFTCollator(tok.pad_id, max_length=length, pack=True)(data)
    assert packed["input_ids"].shape == (1, length)
    logits = model(**{k: v for k, v in packed.items() if k != "labels"}).logits[0]  # (T, V)
    start = 0
    for e in data:
        n = len(e["input_ids"])
        alone = model(torch.tensor([e["input_ids"]])).logits[0]
        torch.testing.assert_close(logits[start:start + n], alone, atol=1e-4, rtol=1e-4)
        single = SFTCollator(tok.pad_id)([e])["labels"][0]
        assert packed["labels"][0, start:start + n].tolist() == single.tolist()  # no label crosses a boundary
        start += n
    padded = SFTCollator(tok.pad_id)(data)
    torch.testing.assert_close(model(**packed).loss, model(**padded).loss, atol=1e-5, rtol=1e-5)
    # with a shorter row, examples spill into a second row and its padding stays unlabelled
    two = SFTCollator(tok.pad_id, max_length=length - 1, pack=True)(data)
    assert two["input_ids"].shape[0] == 2
    assert int((two["labels"] != -100).sum()) == int((packed["labels"] != -100).sum())


def test_chat_template_round_trips_through_the_model_folder(tmp_path, tok):
    custom = ChatTemplate(user="### User: {content}\n", assistant="### Bot: {content}{eos}\n")
    custom.save(tmp_path)
    assert (tmp_path / CHAT_TEMPLATE_FILE).exists()
    assert ChatTemplate.load(tmp_path) == custom
    assert ChatTemplate.load(tmp_path / "missing") == ChatTemplate()
    ids, resp = custom.encode(tok, CHAT[1:2], add_generation_prompt=True)
    assert tok.decode(ids) == "### User: the film was\n### Bot: " and not any(resp)
    with pytest.raises(ValueError, match="content"):
        ChatTemplate(user="no placeholder")


def test_jsonl_errors_name_the_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [ALPACA, {"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ValueError, match="bad.jsonl:2: .*assistant"):
        read_instruct_jsonl(bad)
    with pytest.raises(ValueError, match=":1: .*instruction"):
        read_instruct_jsonl(write_jsonl(tmp_path / "b2.jsonl", [{"prompt": "x"}]))


def _response_loss(model, tok, data) -> float:
    with torch.no_grad():
        return float(model.eval()(**SFTCollator(tok.pad_id)(data)).loss)


def test_finetune_instruct_lowers_the_response_loss_and_stores_the_chat_template(tmp_path, tok):
    import lmforge

    template = ChatTemplate(user="### User: {content}\n", assistant="### Bot: {content}{eos}\n")
    folder = lmforge.save(body("gpt-tiny", tok), tmp_path / "base", tokenizer=tok)
    template.save(folder)  # a template stored with the model is what fine-tuning uses
    rows = [ALPACA, {"messages": CHAT}] * 4
    data = build_instruct_dataset([CHAT], tok, template)
    before = _response_loss(lmforge.load(folder), tok, data)
    settings = {"model": str(folder), "tokenizer": None, "random_init": False,
                "train": str(write_jsonl(tmp_path / "train.jsonl", rows)), "eval": None, "out": str(tmp_path / "run"),
                "task": {"task": "instruct", "max_length": 64},
                "trainer": dict(max_steps=8, batch_size=4, lr=3e-3, eval_every=8, save_every=8, progress=False,
                                tensorboard=False, precision="fp32", schedule="constant", weight_decay=0.0)}
    result = finetune_instruct_from_settings(settings, pack=True)
    assert result.step == 8 and result.model_dir is not None
    assert ChatTemplate.load(result.model_dir) == template
    after = _response_loss(lmforge.load(result.model_dir), tok, data)
    assert after < before - 0.5, (before, after)
