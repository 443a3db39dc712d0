"""Padding-free training forwards (lmforge.nn.unpadding): the packed layers compute what the padded ones do.

Each check runs one model twice on the same padded batch: in train mode, where the stack packs the real tokens,
and in eval mode, where it keeps the padded layout (dropout is 0, so the two modes compute the same function).
The real tokens' states, the loss and every gradient agree; hooks confirm that the packed run's feed-forward
really saw only the N real tokens.
"""

import pytest
import torch

import lmforge
from lmforge.nn.ffn import FeedForward
from lmforge.nn.unpadding import Unpadded
from lmforge.peft import PeftConfig, apply_peft
from lmforge.training.activation_checkpointing import enable_activation_checkpointing

SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50, dropout=0.0, attn_dropout=0.0)


def _batch(B=4, T=40, lengths=(40, 10, 5, 20), seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    return ids, mask


def _ffn_rows(model) -> list[int]:
    """Installs hooks recording the number of token rows each feed-forward call sees."""
    rows = []
    for m in model.modules():
        if isinstance(m, FeedForward):
            m.register_forward_hook(lambda mod, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return rows


def _run(model, train: bool, **batch):
    """Loss, the real tokens' final states and every gradient, from one forward and backward."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same(a, b, atol=1e-5):
    (out_a, grads_a), (out_b, grads_b) = a, b
    assert torch.allclose(out_a.loss, out_b.loss, atol=atol)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=atol), name


@pytest.mark.parametrize("preset", ["bert-tiny", "deberta-tiny"])
def test_encoder_packs_real_tokens_and_matches_the_padded_forward(preset):
    torch.manual_seed(0)
    model = lmforge.build_model(preset, **SMALL)
    ids, mask = _batch()
    labels = torch.where(mask.bool() & (ids % 3 == 0), ids, torch.full_like(ids, -100))
    rows = _ffn_rows(model)
    packed = _run(model, True, input_ids=ids, attention_mask=mask, labels=labels)
    assert rows == [128] * 2  # 75 real tokens of 160 and 53 spare ones (a multiple of 64), in each of the 2 layers
    rows.clear()
    padded = _run(model, False, input_ids=ids, attention_mask=mask, labels=labels)
    assert rows == [ids.numel()] * 2
    _same(packed, padded)
    real = mask.bool()
    assert torch.allclose(packed[0].last_hidden_state[real], padded[0].last_hidden_state[real], atol=1e-5)
    unpacked = torch.zeros(mask.numel(), dtype=torch.bool)
    unpacked[Unpadded.if_worth_it(mask).index] = True
    assert packed[0].last_hidden_state[~unpacked.view_as(real)].abs().max() == 0  # zeros at the unpacked padding


def test_decoder_and_encoder_decoder_with_padding():
    torch.manual_seed(0)
    gpt = lmforge.build_model("gpt-tiny", **SMALL)
    ids, mask = _batch()
    labels = ids.masked_fill(~mask.bool(), -100)
    _same(_run(gpt, True, input_ids=ids, attention_mask=mask, labels=labels),
          _run(gpt, False, input_ids=ids, attention_mask=mask, labels=labels))

    t5 = lmforge.build_model("t5-tiny", **SMALL)
    rows = _ffn_rows(t5)
    tgt, tgt_mask = _batch(lengths=(3, 40, 20, 1), seed=1)
    batch = dict(input_ids=ids, attention_mask=mask, labels=tgt.masked_fill(~tgt_mask.bool(), -100),
                 decoder_attention_mask=tgt_mask)
    packed = _run(t5, True, **batch)
    n_dec = len(rows) - 2
    assert rows == [128] * 2 + [64] * n_dec and n_dec >= 2  # 75 and 64 real tokens, bucketed
    _same(packed, _run(t5, False, **batch))


def test_lora_hidden_states_and_activation_checkpointing_pack_too():
    torch.manual_seed(0)
    model = apply_peft(lmforge.build_model("bert-tiny", **SMALL), PeftConfig(method="lora", r=4, targets=["q", "v"]))
    ids, mask = _batch()
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    _same(_run(model, True, input_ids=ids, attention_mask=mask, labels=labels),
          _run(model, False, input_ids=ids, attention_mask=mask, labels=labels))

    ckpt = lmforge.build_model("bert-tiny", **SMALL)
    enable_activation_checkpointing(ckpt)
    _same(_run(ckpt, True, input_ids=ids, attention_mask=mask, labels=labels),
          _run(ckpt, False, input_ids=ids, attention_mask=mask, labels=labels))

    base = lmforge.build_model("bert-tiny", **SMALL).train()
    packed = base(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    padded = base.eval()(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    real = mask.bool()
    assert len(packed) == len(padded) == 3
    for a, b in zip(packed, padded):
        assert torch.allclose(a[real], b[real], atol=1e-5)


def test_stays_padded_where_packing_cannot_or_does_not_pay():
    torch.manual_seed(0)
    model = lmforge.build_model("bert-tiny", **SMALL)
    rows = _ffn_rows(model)
    ids, mask = _batch()
    with torch.no_grad():  # evaluation in train mode (an eval loss during training)
        model.train()(input_ids=ids, attention_mask=mask)
    model.eval()(input_ids=ids, attention_mask=mask)
    nearly_full = torch.ones_like(mask)
    nearly_full[0, -1] = 0  # 159 of 160 real: over PACK_AT_MOST
    model.train()(input_ids=ids, attention_mask=nearly_full)
    model.train()(input_ids=ids, attention_mask=torch.ones_like(mask))
    assert rows == [ids.numel()] * 8

    moe = lmforge.build_model("bert-tiny", **SMALL, moe_experts=2, moe_top_k=1)
    assert not moe.encoder.padding_free


def test_if_worth_it_threshold_and_spare_rows():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
    assert Unpadded.if_worth_it(mask, multiple=1) is not None  # 9 of 10 real: at the threshold, packed
    assert Unpadded.if_worth_it(mask, at_most=0.8, multiple=1) is None
    assert Unpadded.if_worth_it(mask) is None  # the spare row makes it 10 of 10
    assert Unpadded.of(mask).index.tolist() == list(range(9))
    # spare rows come only from rows with a real token
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    assert sorted(Unpadded.if_worth_it(mask, multiple=4, at_most=1).index.tolist()) == [0, 1, 2, 8]


def test_labelled_rows_are_bucketed_without_changing_the_loss():
    torch.manual_seed(0)
    model = lmforge.build_model("bert-tiny", **SMALL).eval()
    ids, mask = _batch()
    labels = torch.where(mask.bool() & (ids % 3 == 0), ids, torch.full_like(ids, -100))
    shapes = []
    model.mlm_head.register_forward_hook(lambda mod, args, out: shapes.append(out.shape[0]))
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    n = int((labels != -100).sum())
    assert shapes == [64] and out.logits.shape[0] == out.n_targets == n < 64
    h = model(input_ids=ids, attention_mask=mask).logits  # (B, T, V) at every position
    expected = torch.nn.functional.cross_entropy(h[labels != -100], labels[labels != -100])
    assert torch.allclose(out.loss, expected, atol=1e-5)
    assert torch.allclose(out.logits, h[labels != -100], atol=1e-5)
