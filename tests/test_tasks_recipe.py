"""Heads, input formats and the fine-tuning recipe: properties checked against their definitions."""

from __future__ import annotations

import itertools

import pytest
import torch

from lmforge.tasks import build_task
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import (FinetuneTrainer, Recipe, ScaledAdamW, build_finetune_optimizer, finetune,
                                    layer_groups)
from lmforge.tasks.heads import SequenceHead, pool
from lmforge.tasks.model import build_task_model
from lmforge.tasks.qa import best_span
from lmforge.tasks.spec import TaskSpec
from lmforge.tasks.tagging import align_labels
from tests import task_helpers as th


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toks")
    return {f: th.tokenizer(folder, f) for f in ("bert", "gpt", "bart")}


def test_pooling_ignores_padding():
    h = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.allclose(pool(h, mask, "mean")[0], h[0, :2].mean(0))
    assert torch.allclose(pool(h, mask, "max")[0], h[0, :2].amax(0))
    assert torch.equal(pool(h, mask, "last"), torch.stack([h[0, 1], h[1, 3]]))
    assert torch.equal(pool(h, mask, "cls"), h[:, 0])
    padded = h.clone()
    padded[0, 2:] = 1e4  # what sits under padding must not matter
    for mode in ("mean", "max", "last"):
        assert torch.equal(pool(padded, mask, mode), pool(h, mask, mode))


def test_sequence_head_losses_follow_their_formulas():
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.5]])
    single = SequenceHead(4, 2, problem="single")
    loss, n = single.loss(logits, torch.tensor([0, 1]))
    expected = -(torch.log_softmax(logits, -1)[0, 0] + torch.log_softmax(logits, -1)[1, 1]) / 2
    assert n == 2 and torch.allclose(loss, expected)
    multi = SequenceHead(4, 2, problem="multi")
    loss, n = multi.loss(logits, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    p = torch.sigmoid(logits)
    bce = -(torch.log(p[0, 0]) + torch.log(1 - p[0, 1]) + torch.log(1 - p[1, 0]) + torch.log(p[1, 1])) / 4
    assert n == 4 and torch.allclose(loss, bce)
    reg = SequenceHead(4, 1, problem="regression")
    loss, n = reg.loss(torch.tensor([[1.0], [3.0]]), torch.tensor([2.0, 2.0]))
    assert n == 2 and loss.item() == pytest.approx(1.0)


def test_decoder_format_is_start_text_delimiter_pair_extract(toks, tmp_path):
    tok = toks["gpt"]
    th.write_tsv(tmp_path / "p.tsv", ["a", "b", "label"], [("good film", "bad plot", "1")])
    body = th.body("gpt", tok)
    spec = TaskSpec(task="classify", text_column="a", text_pair_column="b", labels=["0", "1"])
    task = build_task(spec, tok, body.config)
    ids = task.encode(read_table(tmp_path / "p.tsv"))[0]["input_ids"]
    eos = tok.special_token_ids()["eos_token_id"]
    a, b = tok.encode("good film", add_special_tokens=False), tok.encode("bad plot", add_special_tokens=False)
    assert ids == [eos] + a + [eos] + b + [eos]  # GPT-2 family: bos = delimiter = extract = <|endoftext|>
    model = build_task_model(body, task.spec).eval()
    batch = task.collate(task.encode(read_table(tmp_path / "p.tsv")) * 2)
    batch["input_ids"][1, :-1] = 5  # change everything before the extract token: a causal model's head must see it
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    assert not torch.allclose(logits[0], logits[1])


def test_bart_head_reads_the_decoder_state_of_the_final_eos(toks, tmp_path):
    tok = toks["bart"]
    body = th.body("bart", tok)
    spec = TaskSpec(task="classify", labels=["0", "1"])
    task = build_task(spec, tok, body.config)
    th.write_tsv(tmp_path / "s.tsv", ["text", "label"], [("good film", "1"), ("a very dull and poor plot", "0")])
    examples = task.encode(read_table(tmp_path / "s.tsv"))
    eos = tok.special_token_ids()["eos_token_id"]
    assert all(e["input_ids"][-1] == eos for e in examples)
    model = build_task_model(body, spec).eval()
    batch = task.collate(examples)
    h, _ = model.features(batch["input_ids"], batch["attention_mask"])
    last = batch["attention_mask"].sum(1) - 1
    expected = model.head.out(torch.tanh(model.head.dense(h[torch.arange(2), last])))
    assert torch.allclose(model(batch["input_ids"], batch["attention_mask"]).logits, expected, atol=1e-6)


def test_tag_labels_sit_on_first_subtokens(toks):
    tok = toks["bert"]
    words = ["superb", "filmplot", "film"]  # "filmplot" is unseen: it splits into several pieces
    enc = tok.encode_batch([words], is_split_into_words=True, return_word_ids=True)
    word_ids = enc["word_ids"][0]
    labels = align_labels(word_ids, [7, 8, 9])
    assert labels.count(8) == 1 and word_ids.count(1) > 1
    firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
    assert [labels[i] for i in firsts] == [7, 8, 9]
    assert all(lbl == -100 for i, lbl in enumerate(labels) if i not in firsts)


def test_best_span_is_the_brute_force_argmax():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        start, end = torch.randn(12, generator=g), torch.randn(12, generator=g)
        allowed = sorted(torch.randperm(12, generator=g)[:8].tolist())
        pairs = [(i, j) for i, j in itertools.product(allowed, allowed) if 0 <= j - i < 4]
        expected = max(pairs, key=lambda ij: float(start[ij[0]] + end[ij[1]]))
        assert best_span(start, end, allowed, max_len=4) == expected


def test_layer_groups_order_encoder_decoder_stacks(toks):
    body = th.body("bart", toks["bart"])
    groups = layer_groups(build_task_model(body, TaskSpec(task="classify", labels=["0", "1"])))
    assert groups["body.embed_tokens.weight"] == 0
    assert groups["body.encoder.layers.1.attn.q.weight"] == 2
    assert groups["body.decoder.layers.0.attn.q.weight"] == 3  # decoder layers sit above the encoder's
    assert groups["head.out.weight"] == 5


def test_layer_decay_scales_each_groups_update(toks):
    """One ScaledAdamW step with lr_scale s moves a parameter exactly as AdamW with lr * s."""
    body = th.body("bert", toks["bert"])
    model = build_task_model(body, TaskSpec(task="classify", labels=["0", "1"]))
    config = th.train_config(lr=1e-2, weight_decay=0.1)
    opt = build_finetune_optimizer(model, config, layer_decay=0.5)
    scales = {g["layer_group"]: g["lr_scale"] for g in opt.param_groups}
    assert scales == {0: 0.125, 1: 0.25, 2: 0.5, 3: 1.0}
    reference = torch.nn.Parameter(model.body.encoder.layers[0].ffn.up.weight.detach().clone())
    ref_opt = torch.optim.AdamW([reference], lr=1e-2 * 0.25, weight_decay=0.1)
    loss = model(torch.randint(5, 100, (2, 6)), labels=torch.tensor([0, 1])).loss
    loss.backward()
    reference.grad = model.body.encoder.layers[0].ffn.up.weight.grad.clone()
    opt.step()
    ref_opt.step()
    assert torch.allclose(model.body.encoder.layers[0].ffn.up.weight, reference, atol=1e-7)
    assert all(g["lr"] == 1e-2 for g in opt.param_groups)  # the scale never leaks into the schedule's LR
    assert isinstance(opt, ScaledAdamW)


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_gradual_unfreezing_thaws_from_the_top(toks, tmp_path):
    tok = toks["bert"]
    data = th.write_sentiment(tmp_path / "train.tsv", 32)
    body = th.body("bert", tok)
    before = _snapshot(body)
    # 2 layers: groups 0..3; one more group thaws every 2 steps, so after 4 steps groups 2 and 3 trained.
    result = finetune(body, TaskSpec(task="classify"), data, config=th.train_config(steps=4), out=tmp_path / "run",
                      recipe=Recipe(unfreeze_every=2), tokenizer=tok)
    after = result.model.body.state_dict()
    groups = layer_groups(result.model)
    for name, value in after.items():
        changed = not torch.equal(value, before[name])
        if f"body.{name}" in groups:
            assert changed == (groups[f"body.{name}"] >= 2), name


def test_frozen_body_is_a_probe(toks, tmp_path):
    tok = toks["bert"]
    data = th.write_sentiment(tmp_path / "train.tsv", 32)
    body = th.body("bert", tok, dropout=0.1)
    before = _snapshot(body)
    result = finetune(body, TaskSpec(task="classify", pooling="mean"), data, config=th.train_config(steps=3),
                      out=tmp_path / "run", recipe=Recipe(freeze_body=True), tokenizer=tok)
    assert all(torch.equal(v, before[k]) for k, v in result.model.body.state_dict().items())
    assert result.train.metrics["loss"] is not None


def test_finetuning_resumes_exactly(toks, tmp_path):
    tok = toks["bert"]
    data = th.write_sentiment(tmp_path / "train.tsv", 40)

    def run(out, steps=None, resume=False):
        torch.manual_seed(1)
        body = th.body("bert", tok, dropout=0.1)  # dropout: the RNG stream must resume too
        cfg = th.train_config(steps=6, batch_size=4, save_every=3, eval_every=3, resume=resume)
        task = build_task(TaskSpec(task="classify", labels=["0", "1"]), tok, body.config)
        from lmforge.tasks.data import ExampleBatches

        examples = task.encode(read_table(data))
        trainer = FinetuneTrainer(build_task_model(body, task.spec), task, ExampleBatches(examples, 4, seed=0), cfg,
                                  Recipe(layer_decay=0.7, unfreeze_every=2), out=out, eval_examples=examples[:8],
                                  tokenizer=tok)
        trainer.fit(steps=steps)
        return trainer

    straight = run(tmp_path / "a")
    run(tmp_path / "b", steps=3)
    resumed = run(tmp_path / "b", resume=True)
    assert resumed.step == 6
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.best == straight.best


def test_load_body_takes_folders_modules_and_presets(toks, tmp_path):
    from lmforge import checkpoint
    from lmforge.config import ConfigError
    from lmforge.checkpoint import load_body

    tok = toks["bert"]
    folder = tok.save(tmp_path / "tok")
    body, loaded = load_body(th.body("bert", tok), tokenizer=folder)  # a module and a tokenizer path
    assert loaded.vocab_size == tok.vocab_size
    saved = checkpoint.save(body, tmp_path / "model", tokenizer=tok)
    again, _ = load_body(saved)  # a model folder brings its own tokenizer
    assert torch.equal(again.embed_tokens.weight, body.embed_tokens.weight)
    fresh, _ = load_body(saved, random_init=True)  # same architecture, new weights: the scratch baseline
    assert fresh.config == body.config and not torch.equal(fresh.embed_tokens.weight, body.embed_tokens.weight)
    with pytest.raises(ConfigError, match="no tokenizer found beside the model; pass one"):
        load_body("bert-tiny")


def test_the_same_seed_gives_the_same_model_whatever_ran_before(toks, tmp_path):
    """The new head, a from-scratch body and PEFT weights are drawn after seeding with ``config.seed``, so
    two runs of one command agree even when the process's random streams were used differently before."""
    from lmforge.peft import PeftConfig

    tok = toks["bert"]
    data = th.write_sentiment(tmp_path / "train.tsv", 16)
    body = th.body("bert", tok)
    body.save(tmp_path / "body", tokenizer=tok)

    def run(out, noise):
        torch.manual_seed(noise)  # whatever happened earlier in the process
        torch.rand(noise + 1)
        return finetune(str(tmp_path / "body"), TaskSpec(task="classify"), data, out=tmp_path / out,
                        config=th.train_config(steps=2), random_init=True,
                        peft=PeftConfig(method="lora", r=2, targets=["q", "v"]))

    a, b = run("a", 0), run("b", 7)
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y), name
