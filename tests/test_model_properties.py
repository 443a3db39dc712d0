"""Properties the model core must have: no causal leak, padding invariance, cache == full forward."""

from __future__ import annotations

import pytest
import torch

from lmforge.models import Transformer
from lmforge.nn.kv_cache import KVCache
from tests.helpers import tiny_config

DECODER_POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative", "t5-bias", "deberta", "none"]


def _decoder(position: str, **kw) -> Transformer:
    return Transformer(tiny_config(arch="decoder", position=position, relative_values=True, **kw)).eval()


def _seq2seq(position: str, **kw) -> Transformer:
    return Transformer(tiny_config(arch="encoder-decoder", position=position, relative_values=True, **kw)).eval()


@pytest.mark.parametrize("position", DECODER_POSITIONS)
def test_causal_mask_does_not_leak(position):
    model = _decoder(position)
    ids = torch.randint(1, 97, (2, 12))
    t = 6
    changed = ids.clone()
    changed[:, t + 1 :] = torch.randint(1, 97, (2, 12 - t - 1))
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_encoder_decoder_decoder_does_not_leak():
    model = _seq2seq("t5-bias")
    src, tgt = torch.randint(1, 97, (2, 9)), torch.randint(1, 97, (2, 10))
    changed = tgt.clone()
    changed[:, 6:] = torch.randint(1, 97, (2, 4))
    a = model(src, decoder_input_ids=tgt).logits
    b = model(src, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder-decoder"])
@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "t5-bias", "relative", "sinusoidal", "deberta"])
def test_padding_invariance(arch, position):
    cfg = tiny_config(arch=arch, position=position, relative_values=True, head="mlm" if arch == "encoder" else "lm")
    model = Transformer(cfg).eval()
    lengths = [9, 5, 7]
    seqs = [torch.randint(1, 97, (n,)) for n in lengths]
    batch = torch.zeros(3, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(batch)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
        mask[i, : len(s)] = 1
    if arch == "encoder-decoder":
        tgts = [torch.randint(1, 97, (n,)) for n in (4, 6, 3)]
        dec = torch.zeros(3, 6, dtype=torch.long)
        dec_mask = torch.zeros_like(dec)
        for i, t in enumerate(tgts):
            dec[i, : len(t)] = t
            dec_mask[i, : len(t)] = 1
        padded = model(batch, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).logits
        for i, (s, t) in enumerate(zip(seqs, tgts)):
            alone = model(s[None], decoder_input_ids=t[None]).logits
            torch.testing.assert_close(padded[i, : len(t)], alone[0], atol=1e-5, rtol=0)
    else:
        padded = model(batch, attention_mask=mask).logits
        for i, s in enumerate(seqs):
            alone = model(s[None]).logits
            torch.testing.assert_close(padded[i, : len(s)], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", DECODER_POSITIONS)
@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_kv_cache_matches_full_forward_decoder(position, kv_heads):
    model = _decoder(position, n_kv_heads=kv_heads)
    ids = torch.randint(1, 97, (2, 11))
    full = model(ids).logits
    cache = KVCache()
    steps = [model(ids[:, :4], past_key_values=cache, use_cache=True).logits]  # a prompt, then one by one
    for t in range(4, 11):
        steps.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", ["t5-bias", "learned", "rope", "relative", "deberta"])
def test_kv_cache_matches_full_forward_encoder_decoder(position):
    model = _seq2seq(position)
    src, tgt = torch.randint(1, 97, (2, 8)), torch.randint(1, 97, (2, 9))
    src_mask = torch.ones_like(src)
    src_mask[1, 6:] = 0
    full = model(src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    memory = model.encode(src, src_mask)[0]
    cache = KVCache()
    steps = []
    for t in range(9):
        out = model(
            attention_mask=src_mask, decoder_input_ids=tgt[:, t : t + 1], encoder_hidden_states=memory,
            past_key_values=cache, use_cache=True,
        )
        steps.append(out.logits)
    assert len(cache.cross) == model.config.decoder_layers  # cross K/V computed once and kept
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_hidden_states_and_contract_fields():
    model = Transformer(tiny_config(arch="encoder", head="mlm", pooler=True))
    out = model(torch.randint(1, 97, (2, 5)), output_hidden_states=True)
    assert out.logits.shape == (2, 5, 97)
    assert out.last_hidden_state.shape == (2, 5, 32)
    assert len(out.hidden_states) == 3 and out.pooler_output.shape == (2, 32)


def test_labels_loss_equals_cross_entropy_on_full_logits():
    model = Transformer(tiny_config(arch="encoder", head="mlm")).eval()
    ids = torch.randint(1, 97, (2, 10))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7], labels[1, 2] = 5, 9, 11
    out = model(ids, labels=labels)
    full = model(ids).logits
    expected = torch.nn.functional.cross_entropy(full.view(-1, 97), labels.view(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    assert out.logits.shape == (3, 97) and out.n_targets == 3


def test_albert_style_sharing_and_factorisation():
    shared = Transformer(tiny_config(arch="encoder", head="mlm", share_layers=True, embedding_dim=16, n_layers=4))
    plain = Transformer(tiny_config(arch="encoder", head="mlm", n_layers=4))
    assert len(shared.encoder.layers) == 1 and shared.num_parameters() < plain.num_parameters() / 2
    assert shared.embed_tokens.weight.shape == (97, 16)
    assert shared(torch.randint(1, 97, (1, 6))).logits.shape == (1, 6, 97)


# Mixture-of-experts FFNs (lmforge.nn.moe). Dropless routing makes each token's output its own business, so
# the cache must reproduce the full forward; with a capacity, the first-come-first-served queue still only
# looks backwards, so nothing leaks from the future.
MOE = {"top2-every-layer": dict(moe_experts=4, moe_top_k=2, activation="swiglu"),
       "switch-every-other-shared": dict(moe_experts=4, moe_every=2, moe_shared_experts=1)}


@pytest.mark.parametrize("moe", MOE)
@pytest.mark.parametrize("position", ["rope", "learned", "t5-bias"])
def test_kv_cache_matches_full_forward_moe_decoder(moe, position):
    model = _decoder(position, n_kv_heads=2, **MOE[moe])
    ids = torch.randint(1, 97, (2, 11))
    full = model(ids).logits
    cache = KVCache()
    steps = [model(ids[:, :4], past_key_values=cache, use_cache=True).logits]
    for t in range(4, 11):
        steps.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("moe", MOE)
def test_kv_cache_matches_full_forward_moe_encoder_decoder(moe):
    model = _seq2seq("t5-bias", **MOE[moe])
    src, tgt = torch.randint(1, 97, (2, 8)), torch.randint(1, 97, (2, 9))
    full = model(src, decoder_input_ids=tgt).logits
    memory = model.encode(src)[0]
    cache = KVCache()
    steps = [model(decoder_input_ids=tgt[:, t : t + 1], encoder_hidden_states=memory, past_key_values=cache,
                   use_cache=True).logits for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("capacity", [None, 0.5])
def test_moe_causal_mask_does_not_leak(capacity):
    model = _decoder("rope", moe_experts=4, moe_capacity_factor=capacity)
    ids = torch.randint(1, 97, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(1, 97, (2, 5))
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-6, rtol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_padded_vocabulary_projection_equals_the_plain_one(bias, device):
    """The GPU's padded head (vocab_projection) gives the unpadded logits and gradients; forced on any device."""
    from lmforge.models.heads import vocab_projection

    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 7, 16, generator=g).to(device).requires_grad_()
    w = torch.randn(101, 16, generator=g).to(device).requires_grad_()
    b = torch.randn(101, generator=g).to(device).requires_grad_() if bias else None
    target = torch.randn(5, 7, 101, generator=g).to(device)
    grads = []
    for multiple in (1, 64):
        out = vocab_projection(h, w, b, multiple=multiple)
        assert out.shape == (5, 7, 101)
        (out * target).sum().backward()
        grads.append([out.detach().clone()] + [t.grad.clone() for t in (h, w, b) if t is not None])
        for t in (h, w, b):
            if t is not None:
                t.grad = None
    for plain, padded in zip(*grads):
        torch.testing.assert_close(padded, plain, atol=1e-5, rtol=1e-5)
