"""The decoder families users fine-tune: Qwen2 (q/k/v bias), Mistral (sliding-window attention), GPT-2 with
``scale_attn_by_inverse_layer_idx`` and Llama with ``attention_bias`` convert, and decode token-identically to
``transformers``' ``generate`` on left-padded batches longer than the window. Logit parity of each, both ways,
is in ``test_interop_hf_parity.py`` (its CASES); here: native lmforge configs choose the right family, the
window really changes the numbers, the sliding-window KV cache keeps only the window, and what lmforge cannot
express is refused."""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch
from helpers import tiny_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
tf = importlib.import_module("transformers")

import lmforge  # noqa: E402
from lmforge.errors import UserInputError  # noqa: E402
from lmforge.interop.hf import HFConversionError  # noqa: E402
from lmforge.models import build_model  # noqa: E402
from lmforge.nn.kv_cache import KVCache  # noqa: E402

V = 211
N = 12  # new tokens: prompt 7 + 12 spans several windows of 4


def _llama_like(**kw):
    return dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=0) | kw


MODELS = {
    "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**_llama_like())),
    "qwen2-window": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**_llama_like(
        use_sliding_window=True, sliding_window=4, max_window_layers=0))),
    "mistral-window": lambda: tf.MistralForCausalLM(tf.MistralConfig(**_llama_like(sliding_window=4))),
    "llama-attention-bias": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_llama_like(attention_bias=True))),
    "gpt2-inverse-layer-scale": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=V, n_embd=64, n_layer=3, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None,
        scale_attn_by_inverse_layer_idx=True)),
}


@torch.no_grad()
def _hf(name: str):
    torch.manual_seed(0)
    hf = MODELS[name]()
    for p in hf.parameters():
        p.add_(torch.randn_like(p) * 0.3)  # sharp logits: few near-ties
    return hf.eval()


def _prompts():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, V, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding, as generation packs decoder prompts
    mask[2, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_is_token_identical_to_transformers(name):
    hf = _hf(name)
    ours = lmforge.from_hf(hf)
    ids, mask = _prompts()
    config = tf.GenerationConfig(max_new_tokens=N, do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0)
    expected = hf.generate(ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
    got = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True).sequences
    assert len(set(expected.flatten().tolist())) > 5  # a real continuation, not one repeated token
    assert torch.equal(got, expected)
    uncached = ours.generate(ids, mask, max_new_tokens=N, ignore_eos=True, use_cache=False).sequences
    assert torch.equal(uncached, expected)


@pytest.mark.parametrize("name", ["qwen2-window", "mistral-window"])
def test_the_window_changes_the_logits(name):
    hf = _hf(name)
    ours = lmforge.from_hf(hf)
    assert ours.config.sliding_window == 4
    ids, mask = _prompts()
    unwindowed = build_model(ours.config.replace(sliding_window=None)).eval()
    unwindowed.load_state_dict(ours.state_dict())
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask).logits, unwindowed(ids, attention_mask=mask).logits
    torch.testing.assert_close(a[0, :4], b[0, :4])  # the first 4 queries see no further than the window
    assert (a[0, 4:] - b[0, 4:]).abs().max() > 1e-2


@pytest.mark.parametrize("overrides, family, architecture", [
    (dict(sliding_window=5), "mistral", "MistralForCausalLM"),
    (dict(qkv_bias=True, o_bias=False), "qwen2", "Qwen2ForCausalLM"),
    (dict(qkv_bias=True, o_bias=False, sliding_window=5), "qwen2", "Qwen2ForCausalLM"),
    (dict(qkv_bias=True, o_bias=True), "llama", "LlamaForCausalLM"),
])
def test_native_configs_go_to_the_family_that_expresses_them(overrides, family, architecture, tmp_path):
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig.from_preset("llama-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64,
                                          vocab_size=97, **overrides)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = lmforge.to_hf(model, tmp_path / "hf")
    written = json.loads((path / "config.json").read_text())
    assert written["model_type"] == family and written["architectures"] == [architecture]
    hf = tf.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.randint(1, 97, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        diff = (model(ids, attention_mask=mask).logits - hf(ids, attention_mask=mask).logits)[mask.bool()]
    assert diff.abs().max() <= 1e-4


def test_gpt2_inverse_layer_scale_goes_to_gpt2(tmp_path):
    model = build_model(lmforge.ModelConfig.from_preset("gpt-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                                        max_seq_len=64, attn_scale_by_layer=True))
    path = lmforge.to_hf(model, tmp_path / "hf")
    assert json.loads((path / "config.json").read_text())["scale_attn_by_inverse_layer_idx"] is True
    assert [round(layer.attn.scale * 8**0.5 * (i + 1), 6) for i, layer in enumerate(model.decoder.layers)] == [1, 1]


def test_qwen2_with_mixed_sliding_and_full_layers_is_refused(tmp_path):
    hf = tf.Qwen2ForCausalLM(tf.Qwen2Config(**_llama_like(use_sliding_window=True, sliding_window=4,
                                                           max_window_layers=1)))
    hf.save_pretrained(tmp_path / "qwen")
    with pytest.raises(HFConversionError, match="layer_types") as info:
        lmforge.from_hf(tmp_path / "qwen")
    assert "\n" not in str(info.value)


def test_sliding_window_cache_keeps_the_window_and_decodes_like_the_full_forward():
    torch.manual_seed(0)
    model = build_model(tiny_config(arch="decoder", position="rope", norm="rmsnorm", activation="swiglu",
                                    n_kv_heads=2, bias=False, sliding_window=3)).eval()
    ids = torch.randint(1, 97, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        out = model(ids[:, :5], attention_mask=mask[:, :5], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(5, 20):
            out = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            keys, _ = cache.update(0, *(torch.zeros(2, 2, 0, 8),) * 2)  # an empty update reads what is kept
            assert keys.shape[2] == 2 and cache.seq_len() == t + 1 and cache.offset() == t - 1
    real = mask.bool()
    torch.testing.assert_close(torch.cat(steps, 1)[real], full[real], atol=1e-5, rtol=1e-5)


def test_kv_cache_window_unit():
    cache = KVCache(window=3)
    for t in range(6):
        k, _ = cache.update(0, torch.full((1, 1, 1, 1), float(t)), torch.zeros(1, 1, 1, 1))
        assert k.flatten().tolist() == [float(i) for i in range(max(0, t - 2), t + 1)]  # the last 3, itself included
    assert cache.seq_len() == 6 and cache.offset() == 4


def test_compiled_decoding_refuses_a_sliding_window():
    model = build_model(tiny_config(arch="decoder", position="rope", sliding_window=3)).eval()
    with pytest.raises(UserInputError, match="sliding_window=3"):
        model.generate(torch.randint(1, 97, (1, 4)), max_new_tokens=2, compile=True)


def test_flops_count_the_window_not_the_whole_prefix():
    cfg = tiny_config(arch="decoder", position="rope", sliding_window=3)
    windowed, full = build_model(cfg), build_model(cfg.replace(sliding_window=None))
    assert full.flops_per_token(64) - windowed.flops_per_token(64) == cfg.n_layers * 12 * cfg.d_model * (64 - 3)
    assert full.flops_per_token(2) == windowed.flops_per_token(2)  # shorter than the window: nothing changes
