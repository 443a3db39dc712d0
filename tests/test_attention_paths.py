"""The two ways :class:`~lmforge.nn.attention.Attention` computes attention agree: SDPA, and the written-out
softmax that bf16 training steps on a CPU take (faster there; see ``use_matmul_attention``). Each test runs
a model with the matmul path forced on and forced off and compares outputs and every gradient, in fp32 so
that the comparison is tight, over masks, biases, GQA and cross-attention."""

from __future__ import annotations

import pytest
import torch
from helpers import count_causal_halves, tiny_config

from lmforge.models import Transformer
from lmforge.nn import attention

CASES = {
    "gpt-causal": dict(arch="decoder", position="learned"),
    "llama-gqa-rope": dict(arch="decoder", position="rope", n_kv_heads=2, norm="rmsnorm", activation="swiglu"),
    "alibi": dict(arch="decoder", position="alibi"),
    "bert-padding": dict(arch="encoder", position="learned", head="mlm"),
    "t5-bias-cross": dict(arch="encoder-decoder", position="t5-bias"),
    "shaw-relative": dict(arch="decoder", position="relative", relative_values=True),
}


def _loss_and_grads(model, batch, matmul: bool, monkeypatch) -> tuple[torch.Tensor, dict]:
    monkeypatch.setattr(attention, "use_matmul_attention", lambda q, k, mask: matmul)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(cfg) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, cfg.vocab_size, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding (encoder rows, encoder-decoder sources)
    if cfg.arch == "decoder":
        mask = torch.ones_like(ids)
        mask[2, :4] = 0  # left padding: rows 0..3 of sequence 2 are queries that may see nothing
    labels = ids.masked_fill(mask == 0, -100)
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels)
    if cfg.arch == "encoder-decoder":
        batch["labels"] = torch.randint(1, cfg.vocab_size, (3, 5), generator=g)
    return batch


@pytest.mark.parametrize("name", CASES)
def test_matmul_attention_equals_sdpa(name, monkeypatch):
    torch.manual_seed(0)
    cfg = tiny_config(**CASES[name])
    model = Transformer(cfg).train()
    batch = _batch(cfg)
    logits_a, grads_a = _loss_and_grads(model, batch, True, monkeypatch)
    logits_b, grads_b = _loss_and_grads(model, batch, False, monkeypatch)
    torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=1e-5)  # (N, V): the labelled positions
    assert grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert torch.isfinite(grads_a[n]).all(), n  # padding rows that see nothing must not make NaN
        torch.testing.assert_close(grads_a[n], grads_b[n], atol=1e-5, rtol=1e-4, msg=n)


def test_matmul_attention_under_bf16_autocast_is_finite_and_close():
    # The path as training really takes it: bf16 autocast on the CPU, left-padded rows included.
    torch.manual_seed(0)
    cfg = tiny_config(arch="decoder", position="learned")
    model = Transformer(cfg).train()
    batch = _batch(cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        reference = model(**batch).loss  # fp32, SDPA (no gradients)
    assert abs(loss.item() - reference.item()) < 0.05


def test_which_steps_take_the_matmul_path():
    q = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16)
    assert attention.use_matmul_attention(q, k, None)  # a bf16 training step on the CPU
    assert not attention.use_matmul_attention(q.detach(), k, None)  # inference: SDPA
    with torch.no_grad():
        assert not attention.use_matmul_attention(q, k, None)
    assert not attention.use_matmul_attention(q.float(), k.float(), None)  # fp32: SDPA's kernel is faster
    big = torch.empty(64, 16, 128, 8, dtype=torch.bfloat16, requires_grad=True)
    assert not attention.use_matmul_attention(big, torch.empty(64, 16, 16384, 8), None)  # scores too big to keep


@pytest.mark.parametrize("name", ["gpt-causal", "llama-gqa-rope"])
@pytest.mark.parametrize("seq", [8, 9])  # halves of 4 + 4 and 4 + 5 queries
def test_causal_halves_equal_one_softmax(name, seq, monkeypatch):
    # Compiled training splits causal attention into two query halves; forced on here, eagerly and in
    # fp32, it must give the one-softmax result: logits and every gradient.
    torch.manual_seed(0)
    cfg = tiny_config(**CASES[name])
    model = Transformer(cfg).train()
    ids = torch.randint(1, cfg.vocab_size, (2, seq), generator=torch.Generator().manual_seed(2))
    batch = dict(input_ids=ids, labels=ids)  # no padding: the plain causal mask the halves path serves
    halves = count_causal_halves(monkeypatch)
    monkeypatch.setattr(attention, "split_causal_in_halves", lambda q, k: False)
    logits_a, grads_a = _loss_and_grads(model, batch, True, monkeypatch)
    monkeypatch.setattr(attention, "split_causal_in_halves", lambda q, k: True)
    logits_b, grads_b = _loss_and_grads(model, batch, True, monkeypatch)
    assert len(halves) == cfg.n_layers  # the split path really ran, once per layer
    torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], atol=1e-5, rtol=1e-4, msg=n)


def test_which_steps_split_causal_attention():
    q = torch.randn(1, 2, 128, 8, requires_grad=True)
    assert not attention.split_causal_in_halves(q, q)  # eager: the split's copies cost what it saves
    split = torch.compile(lambda q, k: torch.tensor(attention.split_causal_in_halves(q, k)), backend="eager")
    assert split(q, q)  # traced by torch.compile, self-attention without a cache
    assert not split(q, torch.randn(1, 2, 130, 8))  # keys from a cache: T != S
    assert not split(q[:, :, :32], q[:, :, :32])  # too short to gain


@pytest.mark.parametrize("n_kv_heads", [4, 2])  # plain and grouped-query
@pytest.mark.parametrize("mask", ["none", "bool", "additive"])
def test_one_compiled_row_equals_sdpa(n_kv_heads, mask):
    """A compiled decode step's attention (one query row as broadcasts and sums) against SDPA on the same inputs."""
    torch.manual_seed(0)
    cfg = tiny_config(arch="decoder", position="learned", n_heads=4, n_kv_heads=n_kv_heads)
    attn = Transformer(cfg).decoder.layers[0].attn
    B, H, S, hd = 3, 4, 11, cfg.d_model // 4
    q, k, v = torch.randn(B, H, 1, hd), torch.randn(B, n_kv_heads, S, hd), torch.randn(B, n_kv_heads, S, hd)
    attn_mask = {"none": None, "bool": torch.rand(B, 1, 1, S) > 0.3,
                 "additive": torch.randn(B, 1, 1, S)}[mask]
    if mask == "bool":
        attn_mask[:, ..., 0] = True  # every row sees something, as a decode step's query sees itself
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=attn.scale,
                                                           enable_gqa=n_kv_heads != H)
    torch.testing.assert_close(attn._one_row(q, k, v, attn_mask), ref, atol=1e-5, rtol=1e-5)


def test_which_steps_take_the_one_row_path():
    q = torch.randn(2, 4, 1, 8)
    assert not attention.one_compiled_row(q)  # eager: SDPA
    with torch.no_grad():
        assert torch.compile(attention.one_compiled_row, backend="eager", fullgraph=True)(q)
        assert not torch.compile(attention.one_compiled_row, backend="eager", fullgraph=True)(torch.randn(2, 4, 3, 8))
