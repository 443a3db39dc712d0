"""The training step: token-normalised gradient accumulation, AdamW parameter groups, activation checkpointing,
precision choice, and evaluation."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import tiny_config
from lmforge.models import Transformer
from lmforge.objectives import build_objective
from lmforge.objectives.base import pad, pad_labels
from lmforge.training import TrainConfig, Trainer, build_optimizer, enable_activation_checkpointing, param_groups
from lmforge.training.precision import native_bf16, resolve_precision

V = 97


def ragged_examples(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, labels) pairs of lengths 6..24 with MLM-style labels: ~30% targets, so counts differ per example."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 25, (), generator=g))
        ids = torch.randint(5, V, (length,), generator=g)
        chosen = torch.rand(length, generator=g) < 0.3
        chosen[0] = True  # at least one target per example
        out.append((ids, torch.where(chosen, ids, -100)))
    return out


def collate(examples) -> dict[str, torch.Tensor]:
    """A fixed 'objective': pads precomputed (ids, labels) pairs, so both batchings see the same targets."""
    ids, real = pad([e[0] for e in examples], 0)
    return {"input_ids": ids, "attention_mask": real.long(), "labels": pad_labels([e[1] for e in examples])}


def train_cfg(**kw) -> TrainConfig:
    base = dict(max_steps=2, lr=1e-3, weight_decay=0.01, eval_every=0, save_every=0, precision="fp32",
                progress=False, tensorboard=False, schedule="constant", device="cpu")
    return TrainConfig(**{**base, **kw})


def encoder() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(arch="encoder", head="mlm", type_vocab_size=2, embedding_norm=True))


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")
def test_grad_accumulation_4x2_equals_batch_8(tmp_path):
    examples = ragged_examples(16, seed=1)  # two optimizer steps of 8 examples
    counts = [int((lab != -100).sum()) for _, lab in examples[:8]]
    assert len(set(sum(counts[i:i + 2]) for i in range(0, 8, 2))) > 1  # micro-batches hold different counts
    micro = [examples[i:i + 2] for i in range(0, 16, 2)]  # 4 x 2 per step
    whole = [examples[i:i + 8] for i in range(0, 16, 8)]  # 1 x 8 per step

    # The gradient itself: the mean over all targets of the accumulated batch.
    a, b = encoder(), encoder()
    ta = Trainer(a, collate, micro, train_cfg(grad_accum=4, batch_size=2), out=tmp_path / "a")
    tb = Trainer(b, collate, whole, train_cfg(grad_accum=1, batch_size=8), out=tmp_path / "b")
    stats_a = ta.accumulate([collate(m) for m in micro[:4]])
    stats_b = tb.accumulate([collate(whole[0])])
    assert stats_a["targets"] == stats_b["targets"] == sum(counts)
    assert stats_a["loss"] == pytest.approx(stats_b["loss"], rel=1e-6)
    ga, gb = grads(a), grads(b)
    for name in gb:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-5, atol=1e-7, msg=name)
    # Averaging the micro-batch means instead would weight a target by 1/its micro-batch's count: different.
    a.zero_grad()
    for m in micro[:4]:
        (a(**collate(m)).loss / 4).backward()
    assert max(float((p.grad - gb[n]).abs().max()) for n, p in a.named_parameters() if n in gb) > 1e-4

    # Parameters after optimizer steps (AdamW, clipping, weight decay), through the real loop.
    a, b = encoder(), encoder()
    Trainer(a, collate, micro, train_cfg(grad_accum=4, batch_size=2), out=tmp_path / "c").fit()
    Trainer(b, collate, whole, train_cfg(grad_accum=1, batch_size=8), out=tmp_path / "d").fit()
    with torch.no_grad():
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert float((pa - pb).abs().max()) <= 1e-6, name
        assert any(float((pa - p0).abs().max()) > 1e-4 for pa, p0 in zip(a.parameters(), encoder().parameters()))


def test_param_groups_exclude_biases_norms_and_embeddings():
    model = Transformer(tiny_config(arch="encoder", head="mlm", type_vocab_size=2, embedding_norm=True))
    decay, keep = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert all(n.endswith("weight") and "norm" not in n and "embed" not in n for n in decay["names"])
    for name in ("embed_tokens.weight", "encoder.embed.positions.weight", "encoder.embed.token_types.weight",
                 "encoder.embed.norm.weight", "encoder.layers.0.attn_norm.weight", "encoder.layers.0.ffn.up.bias"):
        assert name in keep["names"], name
    assert "encoder.layers.0.ffn.up.weight" in decay["names"]
    # Every trainable tensor exactly once (the tied MLM decoder is the token table).
    unique = {id(p) for p in model.parameters()}
    assert len(decay["params"]) + len(keep["params"]) == len(unique)

    nothing_excluded = param_groups(model, 0.1, no_decay=())
    assert not nothing_excluded[1]["params"]
    only_bias = param_groups(model, 0.1, no_decay=("bias",))
    assert all(n.endswith("bias") for n in only_bias[1]["names"])

    t5 = Transformer(tiny_config(arch="encoder-decoder", position="t5-bias", norm="rmsnorm", bias=False,
                                 tie_embeddings=False))
    decay, keep = param_groups(t5, 0.1)
    assert "encoder.rel_bias.weight" in keep["names"] and "encoder.final_norm.weight" in keep["names"]
    assert "lm_head.weight" in decay["names"]  # an untied output projection is a weight matrix


def test_optimizer_is_fused_when_available():
    opt = build_optimizer(encoder(), lr=1e-3)
    assert opt.defaults["fused"] or opt.defaults["foreach"]
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4):  # fused AdamW on CPU: torch 2.4+
        assert opt.defaults["fused"]


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = Transformer(tiny_config(dropout=0.1, attn_dropout=0.1))  # dropout: masks must be recomputed alike
    ckpt = copy.deepcopy(plain)
    assert enable_activation_checkpointing(ckpt) == 2
    ids = torch.randint(0, V, (3, 12))
    for model in (plain, ckpt):
        torch.manual_seed(1)
        model.train()(ids, labels=ids).loss.backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert ckpt.state_dict().keys() == plain.state_dict().keys()  # names (and checkpoints) unchanged


def test_precision_choice():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) is None
    assert resolve_precision("auto", cpu) == (torch.bfloat16 if native_bf16(cpu) else None)
    if native_bf16(cpu):
        assert resolve_precision("bf16", cpu) is torch.bfloat16
    else:
        with pytest.warns(UserWarning, match="emulated"):
            assert resolve_precision("bf16", cpu) is torch.bfloat16
    with pytest.raises(ValueError, match="precision='fp16'"):
        resolve_precision("fp16", cpu)


def test_bf16_step_keeps_fp32_weights(tmp_path, recwarn):
    model = encoder()
    trainer = Trainer(model, collate, [ragged_examples(4, seed=2)], train_cfg(precision="bf16", max_steps=1),
                      out=tmp_path)
    record = trainer.train_step()
    assert torch.isfinite(torch.tensor(record["loss"])) and record["loss"] > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in trainer.optimizer.state.values())


def test_evaluation_is_repeatable_and_does_not_touch_training_randomness(tmp_path):
    mlm = build_objective("mlm", vocab_size=V, mask_token_id=4, pad_token_id=0, seed=0)
    raw = [[list(range(5, 5 + n)) for n in (10, 14, 9, 12)]]
    trainer = Trainer(encoder(), mlm, raw * 3, train_cfg(eval_batches=2), out=tmp_path, eval_data=raw * 2)
    before = mlm.state_dict()["generator"].clone()
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second and set(first) == {"eval_loss", "eval_ppl", "eval_accuracy"}
    assert torch.equal(mlm.state_dict()["generator"], before)
    assert first["eval_ppl"] == pytest.approx(torch.tensor(first["eval_loss"]).exp().item())

    # Accuracy is the argmax hit rate at the labelled positions, computed here independently.
    trainer.eval_objective.load_state_dict(trainer._eval_objective_state)
    hits = total = 0
    with torch.no_grad():
        for batch in (trainer.eval_objective(r) for r in raw * 2):
            logits = trainer.model.eval()(batch["input_ids"], batch["attention_mask"]).logits  # (B, T, V)
            chosen = batch["labels"] != -100
            hits += int((logits[chosen].argmax(-1) == batch["labels"][chosen]).sum())
            total += int(chosen.sum())
    assert first["eval_accuracy"] == pytest.approx(hits / total)
