"""Greedy decoding of converted models is token-identical to ``transformers``' ``generate``.

Our side is a small incremental greedy loop over lmforge's KV cache (the generation issue will add
``model.generate``): it checks the cache path of converted weights, not only the full forward.
"""

from __future__ import annotations

import importlib

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

import lmforge  # noqa: E402
from lmforge.nn.kv_cache import KVCache  # noqa: E402

NEW_TOKENS = 32
V = 211


@torch.no_grad()
def greedy(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, n: int = NEW_TOKENS):
    """(B, T) prompt -> (B, n) greedily chosen ids, one cached forward per new token."""
    cache = KVCache()
    if model.config.arch == "encoder-decoder":
        memory, _ = model.encode(input_ids, attention_mask)  # once; every step cross-attends to it
        step = torch.full((len(input_ids), 1), model.config.decoder_start_token_id)
        kwargs = dict(attention_mask=attention_mask, encoder_hidden_states=memory)
        logits = model(decoder_input_ids=step, past_key_values=cache, use_cache=True, **kwargs).logits
    else:
        kwargs = {}
        logits = model(input_ids, past_key_values=cache, use_cache=True).logits
    chosen = []
    for _ in range(n):
        step = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        chosen.append(step)
        key = "decoder_input_ids" if model.config.arch == "encoder-decoder" else "input_ids"
        logits = model(**{key: step}, past_key_values=cache, use_cache=True, **kwargs).logits
    return torch.cat(chosen, dim=1)


@torch.no_grad()
def _perturbed(model):
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.3)  # sharper logits: fewer near-ties, more varied continuations
    return model.eval()


def _hf_greedy(hf, input_ids, attention_mask=None):
    # No end-of-sequence token, so both sides produce exactly NEW_TOKENS tokens.
    config = tf.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1, eos_token_id=None,
                                 pad_token_id=0, decoder_start_token_id=0)
    return hf.generate(input_ids, attention_mask=attention_mask, generation_config=config)


def test_gpt2_greedy_matches_generate(device):
    torch.manual_seed(0)
    hf = _perturbed(tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                     bos_token_id=None, eos_token_id=None)))
    ours = lmforge.from_hf(hf).to(device)
    hf = hf.to(device)
    prompt = torch.randint(0, V, (2, 6)).to(device)
    expected = _hf_greedy(hf, prompt, torch.ones_like(prompt))[:, prompt.shape[1]:]
    ours = greedy(ours, prompt)
    assert expected.shape == (2, NEW_TOKENS)
    assert len(set(expected.flatten().tolist())) > 3  # a real continuation, not one repeated token
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("feed_forward_proj", ["relu", "gated-gelu"])
def test_t5_greedy_matches_generate(feed_forward_proj):
    torch.manual_seed(0)
    hf = _perturbed(tf.T5ForConditionalGeneration(tf.T5Config(
        vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0,
        eos_token_id=None, feed_forward_proj=feed_forward_proj, tie_word_embeddings=feed_forward_proj == "relu")))
    src = torch.randint(2, V, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])  # right-padded source
    expected = _hf_greedy(hf, src.masked_fill(mask == 0, 0), mask)[:, 1:]  # drop the start token
    ours = greedy(lmforge.from_hf(hf), src.masked_fill(mask == 0, 0), mask)
    assert expected.shape == (2, NEW_TOKENS)
    assert len(set(expected.flatten().tolist())) > 3
    assert torch.equal(ours, expected)
