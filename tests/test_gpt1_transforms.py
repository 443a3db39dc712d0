"""GPT-1's input transformations: the layouts by hand, the similarity's two-order sum, multiple choice as one
sequence per choice, new tokens learned in fine-tuning and saved with the task folder, refusals."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.tasks import build_task
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import finetune
from lmforge.tasks.gpt1_transforms import TOKENS, add_transform_tokens, grow_token_embeddings
from lmforge.tasks.heads import pool
from lmforge.tasks.model import build_task_model, load_task_model
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import Tokenizer
from tests import task_helpers as th

PAIRS = [("mary lives in rome", "mary lives in paris", "0"), ("john was good", "john was great", "1"),
         ("the film was dull", "the plot was poor", "1"), ("ana lives in lima", "omar was awful", "0")]


@pytest.fixture
def tok(tmp_path):
    return th.tokenizer(tmp_path, "gpt")


def _pairs(path, rows=PAIRS):
    return th.write_tsv(path, ["premise", "hypothesis", "label"], rows)


def _words(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_entailment_layout_by_hand(tok, tmp_path):
    V = tok.vocab_size
    assert add_transform_tokens(tok) == (V, V + 1, V + 2) == tuple(tok.token_to_id(t) for t in TOKENS)
    assert add_transform_tokens(tok) == (V, V + 1, V + 2) and tok.vocab_size == V + 3  # added once
    spec = TaskSpec(task="classify", text_column="premise", text_pair_column="hypothesis", labels=["0", "1"],
                    input_transform="gpt1")
    body = th.body("gpt", tok)
    (ex, *_) = build_task(spec, tok, body.config).encode(read_table(_pairs(tmp_path / "nli.tsv")))
    premise, hypothesis = _words(tok, PAIRS[0][0]), _words(tok, PAIRS[0][1])
    assert ex["input_ids"] == [V] + premise + [V + 1] + hypothesis + [V + 2]
    # the plain decoder format reuses the tokenizer's own ids instead
    plain = build_task(spec.replace(input_transform="plain"), tok, body.config).encode(read_table(tmp_path / "nli.tsv"))
    assert plain[0]["input_ids"][-1] != V + 2 and V not in plain[0]["input_ids"]


def test_similarity_runs_both_orders_and_adds_their_extract_states(tok, tmp_path):
    V = tok.vocab_size
    add_transform_tokens(tok)
    spec = TaskSpec(task="regress", text_column="premise", text_pair_column="hypothesis",
                    input_transform="gpt1-similarity")
    torch.manual_seed(0)
    model = build_task_model(th.body("gpt", tok), spec)
    grow_token_embeddings(model.body, tok.vocab_size)
    model.eval()
    task = build_task(spec, tok, model.body.config)
    examples = task.encode(read_table(_pairs(tmp_path / "sts.tsv")))
    a, b = _words(tok, PAIRS[1][0]), _words(tok, PAIRS[1][1])
    assert examples[1]["input_ids"] == [[V] + a + [V + 1] + b + [V + 2], [V] + b + [V + 1] + a + [V + 2]]
    batch = task.collate(examples)
    assert batch["input_ids"].shape[:2] == (4, 2)
    with torch.no_grad():
        out = model(**batch)
        # by hand: each order alone through the body, its last real state, summed, then the linear layer
        want = []
        for ab, ba in (e["input_ids"] for e in examples):
            h = [pool(model.body(torch.tensor([ids])).last_hidden_state, None, "last") for ids in (ab, ba)]
            want.append(model.head.out(h[0] + h[1]))
        torch.testing.assert_close(out.logits, torch.cat(want), atol=1e-5, rtol=0)
        # so the score does not depend on which text comes first
        swapped = th.write_tsv(tmp_path / "swapped.tsv", ["premise", "hypothesis", "label"],
                               [(h, p, y) for p, h, y in PAIRS])
        again = model(**task.collate(task.encode(read_table(swapped))))
        torch.testing.assert_close(again.logits, out.logits, atol=1e-5, rtol=0)
        # while one order alone would not be
        one = model.head(model.body(batch["input_ids"][:, 0], batch["attention_mask"][:, 0]).last_hidden_state,
                         batch["attention_mask"][:, 0])
        other = model.head(model.body(batch["input_ids"][:, 1], batch["attention_mask"][:, 1]).last_hidden_state,
                           batch["attention_mask"][:, 1])
        assert not torch.allclose(one, other, atol=1e-4)


def test_multiple_choice_is_one_sequence_per_choice(tok, tmp_path):
    V = tok.vocab_size
    add_transform_tokens(tok)
    path = th.write_tsv(tmp_path / "mc.tsv", ["context", "choice0", "choice1", "choice2", "label"],
                        [("mary lives in", "rome", "the film", "good", "0")])
    spec = TaskSpec(task="multiple-choice", input_transform="gpt1")
    (ex,) = build_task(spec, tok, th.body("gpt", tok).config).encode(read_table(path))
    ctx = _words(tok, "mary lives in")
    assert ex["input_ids"] == [[V] + ctx + [V + 1] + _words(tok, c) + [V + 2] for c in ("rome", "the film", "good")]


def test_the_new_tokens_are_learned_and_saved_with_the_task(tok, tmp_path):
    V = tok.vocab_size
    rows = [(t, "it was", y) for t, y in th.sentiment_rows(48)]
    train = th.write_tsv(tmp_path / "train.tsv", ["premise", "hypothesis", "label"], rows)
    initial = []

    def keep_initial(model):  # called on the assembled task model, before training
        initial.append(model.body.embed_tokens.weight.detach().clone())
        return model

    spec = TaskSpec(task="classify", text_column="premise", text_pair_column="hypothesis", input_transform="gpt1")
    result = finetune(th.body("gpt", tok), spec, train, train, out=tmp_path / "run", tokenizer=tok, wrap=keep_initial,
                      config=th.train_config(steps=8, eval_every=8, batch_size=8))
    trained = result.model.body.embed_tokens.weight.detach()
    assert trained.shape[0] == initial[0].shape[0] == V + 3 and result.model.body.config.vocab_size == V + 3
    assert initial[0][V:].std() > 0  # drawn like the initialisation, not zeros
    # the rows of [start], [delim] and [extract] changed in training (every example reads them)
    assert (trained[V:] - initial[0][V:]).abs().sum(-1).gt(1e-4).all()
    saved_tok = Tokenizer.load(tmp_path / "run" / "model")
    assert [saved_tok.token_to_id(t) for t in TOKENS] == [V, V + 1, V + 2]
    reloaded = load_task_model(tmp_path / "run" / "model")
    assert reloaded.spec.input_transform == "gpt1"
    task = build_task(reloaded.spec, saved_tok, reloaded.body.config)
    examples = task.encode(read_table(train))
    assert examples[0]["input_ids"][0] == V and examples[0]["input_ids"][-1] == V + 2
    mine, _ = task.evaluate(result.model.eval(), examples[:8])
    theirs, _ = task.evaluate(reloaded, examples[:8])
    assert mine == theirs


def test_the_special_rows_train(tok, tmp_path):
    """An optimizer step moves the three new rows: they are parameters of the body, not constants."""
    add_transform_tokens(tok)
    spec = TaskSpec(task="classify", text_column="premise", text_pair_column="hypothesis", labels=["0", "1"],
                    input_transform="gpt1")
    model = build_task_model(th.body("gpt", tok), spec)
    grow_token_embeddings(model.body, tok.vocab_size)
    task = build_task(spec, tok, model.body.config)
    batch = task.collate(task.encode(read_table(_pairs(tmp_path / "nli.tsv"))))
    model(**batch).loss.backward()
    grad = model.body.embed_tokens.weight.grad
    assert grad[-3:].abs().sum(-1).gt(0).all()


@pytest.mark.parametrize("family,spec,message", [
    ("bert", TaskSpec(task="classify", input_transform="gpt1"), "writes inputs for a decoder; this model has "
                                                                "arch='encoder'"),
    ("gpt", TaskSpec(task="classify", input_transform="gpt1-similarity"), "name the second text's column"),
    ("gpt", TaskSpec(task="multiple-choice", input_transform="gpt1-similarity"), "does not fit task "
                                                                                 "'multiple-choice'"),
    ("gpt", TaskSpec(task="tag", input_transform="gpt1"), "does not fit task 'tag'"),
])
def test_refusals_name_the_setting(family, spec, message, tmp_path):
    tok = th.tokenizer(tmp_path, family)
    with pytest.raises(LmforgeError, match=message):
        build_task(spec, tok, th.body(family, tok).config)
    with pytest.raises(Exception, match="input_transform='gpt2' is not one of plain, gpt1, gpt1-similarity"):
        TaskSpec(task="classify", input_transform="gpt2")


def test_cli_flag(capsys):
    from lmforge.cli.main import main

    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    help_text = capsys.readouterr().out
    assert "--input-transform" in help_text and "gpt1-similarity" in help_text
