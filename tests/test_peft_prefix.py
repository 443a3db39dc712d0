"""Prefix and prompt tuning with the KV cache: token-by-token cached decoding equals the full forward,
and ``generate`` gives the same tokens with and without the cache."""

from __future__ import annotations

import pytest
import torch

from lmforge.nn.kv_cache import KVCache
from lmforge.peft import apply_peft
from peft_helpers import batch, config, perturb, tiny_model

VIRTUAL = ("prefix", "prompt", "mam")


def _decode_token_by_token(model, ids, src=None, src_mask=None):
    """Logits of feeding ``ids`` one token at a time over a KV cache."""
    cache, steps = KVCache(), []
    memory = model.encode(src, src_mask)[0] if src is not None else None
    for t in range(ids.shape[1]):
        kw = dict(past_key_values=cache, use_cache=True)
        if src is not None:
            kw.update(decoder_input_ids=ids[:, t:t + 1], encoder_hidden_states=memory, attention_mask=src_mask)
            steps.append(model(**kw).logits)
        else:
            steps.append(model(ids[:, t:t + 1], **kw).logits)
    return torch.cat(steps, 1), cache


@pytest.mark.parametrize("method", VIRTUAL)
def test_decoder_cached_decoding_equals_full_forward(method):
    model = apply_peft(tiny_model("gpt-tiny"), config(method))
    perturb(model)
    ids = torch.randint(3, 128, (2, 7))
    stepped, cache = _decode_token_by_token(model, ids)
    torch.testing.assert_close(stepped, model(ids).logits, atol=1e-5, rtol=1e-5)
    assert cache.seq_len() == 3 + 7  # the virtual tokens went into the cache once


@pytest.mark.parametrize("arch", ["t5-tiny", "bart-tiny"])
@pytest.mark.parametrize("method", VIRTUAL)
def test_encoder_decoder_cached_decoding_equals_full_forward(arch, method):
    model = apply_peft(tiny_model(arch), config(method))
    perturb(model)
    b = batch(arch)
    full = model(b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=b["decoder_input_ids"]).logits
    stepped, _ = _decode_token_by_token(model, b["decoder_input_ids"], b["input_ids"], b["attention_mask"])
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["prefix", "prompt", "mam", "lora"])
@pytest.mark.parametrize("arch", ["gpt-tiny", "t5-tiny"])
def test_generate_with_cache_equals_without(arch, method):
    plain_base = tiny_model(arch)
    model = apply_peft(tiny_model(arch), config(method))
    perturb(model, scale=0.5)
    prompts = [[5, 6, 7, 8], [9, 10]]  # ragged: left-padded, explicit positions and masks
    run = dict(max_new_tokens=6, ignore_eos=True)
    for settings in (dict(), dict(num_beams=2)):
        cached = model.generate(prompts, **run, **settings)
        uncached = model.generate(prompts, use_cache=False, **run, **settings)
        assert cached.tolist() == uncached.tolist()
        if cached.scores is not None:  # beam scores sum every step's log-probabilities: a sharper check
            torch.testing.assert_close(cached.scores, uncached.scores, atol=1e-5, rtol=1e-5)
    with model.disable_adapters():
        plain = model.generate(prompts, num_beams=2, **run)
    torch.testing.assert_close(plain.scores, plain_base.generate(prompts, num_beams=2, **run).scores)
    assert not torch.allclose(plain.scores, model.generate(prompts, num_beams=2, **run).scores)


def test_folding_the_prefix_keeps_outputs_bit_identical():
    model = apply_peft(tiny_model("bart-tiny"), config("prefix"))
    perturb(model)
    b = batch("bart-tiny")
    before = model(**b).logits
    n = model.parameter_report().trainable
    model.fold_prefix()
    assert torch.equal(model(**b).logits, before)
    assert not model.peft_configs["default"].prefix_projection
    kv = model.prefixes["default"].stacks["decoder"].kv
    assert kv.shape == (2, 2, 4, 3, 16) and kv.requires_grad  # (L, 2, H_kv, P, hd), still trainable
    assert model.parameter_report().trainable < n  # the MLP is gone


def test_prefix_positions_start_after_the_prefix():
    # A P-token prefix shifts the real tokens' learned positions by P, as HF peft does with GPT-2: the
    # prefix model must equal the base model fed the same prefix through a pre-filled cache.
    model = apply_peft(tiny_model("gpt-tiny"), config("prefix", prefix_projection=False))
    perturb(model)
    ids = torch.randint(3, 128, (2, 5))
    kv = model.prefixes["default"].stacks["decoder"]().detach()  # (L, 2, H, P, hd)
    cache = KVCache()
    for layer in range(kv.shape[0]):
        cache.update(layer, kv[layer, 0].expand(2, -1, -1, -1), kv[layer, 1].expand(2, -1, -1, -1))
    with model.disable_adapters():
        manual = model(ids, past_key_values=cache).logits
    torch.testing.assert_close(model(ids).logits, manual, atol=0, rtol=0)


def test_a_cache_started_without_the_prefix_is_refused():
    model = apply_peft(tiny_model("gpt-tiny"), config("prefix"))
    ids = torch.randint(3, 128, (1, 4))
    with model.disable_adapters():
        cache = model(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match="not started with the prefix"):
        model(ids[:, :1], past_key_values=cache, use_cache=True)
