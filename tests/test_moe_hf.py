"""Hugging Face parity for mixture-of-experts models: Mixtral and Switch Transformers, both directions, on tiny
random configs with right-padded batches (Switch with a capacity small enough to drop tokens), and the
refusals of what lmforge cannot express."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

import lmforge  # noqa: E402
from lmforge.interop.hf import HFConversionError  # noqa: E402
from lmforge.models import build_model  # noqa: E402
from lmforge.nn.moe import MoEFeedForward  # noqa: E402
from test_interop_hf_parity import _assert_close, _auto_class, _batch, _hf_out, _ours_out, _perturb  # noqa: E402

V = 97


def _mixtral(**kw):
    return dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64) | kw


def _switch(**kw):
    return dict(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=4, num_decoder_layers=2, num_heads=4,
                num_experts=4, num_sparse_encoder_layers=2, num_sparse_decoder_layers=1, expert_capacity=3,
                decoder_start_token_id=0, relative_attention_num_buckets=8, relative_attention_max_distance=16) | kw


CASES = {
    "mixtral-top2": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**_mixtral())),
    "mixtral-top1-tied": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**_mixtral(
        num_experts_per_tok=1, tie_word_embeddings=True, num_local_experts=3))),
    "mixtral-model-top3": lambda: tf.MixtralModel(tf.MixtralConfig(**_mixtral(num_experts_per_tok=3))),
    # capacity 3 of 9 (padded) source tokens and 4 experts: tokens are dropped
    "switch-lm-drops": lambda: tf.SwitchTransformersForConditionalGeneration(tf.SwitchTransformersConfig(**_switch())),
    "switch-every-layer-gelu": lambda: tf.SwitchTransformersForConditionalGeneration(tf.SwitchTransformersConfig(
        **_switch(num_sparse_encoder_layers=4, num_sparse_decoder_layers=2, dense_act_fn="gelu_new",
                  expert_capacity=64))),
    "switch-model": lambda: tf.SwitchTransformersModel(tf.SwitchTransformersConfig(**_switch(num_experts=2))),
}


def _hf(case: str):
    torch.manual_seed(0)
    return _perturb(CASES[case]()).eval()


def _dropped(model) -> int:
    return sum(int(m.last_dropped) for m in model.modules() if isinstance(m, MoEFeedForward))


@pytest.mark.parametrize("case", CASES)
def test_from_hf_matches_transformers(case):
    hf = _hf(case)
    model = lmforge.from_hf(hf)
    assert model.config.moe_experts == hf.config.num_local_experts if "mixtral" in case else hf.config.num_experts
    inputs, real = _batch(model.config)
    with torch.no_grad():
        theirs, ours = hf(**inputs), model(**inputs)
    _assert_close(_ours_out(ours), _hf_out(theirs), real)
    if case == "switch-lm-drops":
        assert _dropped(model) > 0  # the capacity really bites, in evaluation too


@pytest.mark.parametrize("case", CASES)
def test_to_hf_loads_in_transformers_and_round_trips_exactly(case, tmp_path):
    hf = _hf(case)
    model = lmforge.from_hf(hf)
    path = lmforge.to_hf(model, tmp_path / "hf")
    reloaded, info = _auto_class(type(hf).__name__).from_pretrained(path, output_loading_info=True)
    assert type(reloaded).__name__ == type(hf).__name__
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _assert_close(_hf_out(reloaded.eval()(**inputs)), _hf_out(hf(**inputs)), real)

    again = lmforge.from_hf(path)  # the saved (per-expert) layout, read back bit for bit
    ours, back = model.state_dict(), again.state_dict()
    assert ours.keys() == back.keys() and all(torch.equal(ours[k], back[k]) for k in ours)
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k not in ("name", "extra")}  # noqa: E731
    assert strip(again.config) == strip(model.config)


def test_a_folder_saved_by_transformers_reads_the_same(tmp_path):
    hf = _hf("mixtral-top2")
    hf.save_pretrained(tmp_path / "saved")  # transformers 5 saves experts one by one, holds them fused
    from_memory, from_folder = lmforge.from_hf(hf), lmforge.from_hf(tmp_path / "saved")
    a, b = from_memory.state_dict(), from_folder.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("preset, overrides", [
    ("mixtral-tiny", dict(n_kv_heads=2)),
    ("switch-tiny", dict(head_dim=8, moe_capacity_factor=None, moe_expert_capacity=4)),
])
def test_lmforge_moe_model_to_hf_gives_same_outputs(preset, overrides, tmp_path):
    torch.manual_seed(0)
    model = build_model(preset, d_model=32, n_heads=4, d_ff=48, n_layers=2, max_seq_len=64, vocab_size=V,
                        **overrides).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = lmforge.to_hf(model, tmp_path / "hf")
    hf = _auto_class("ForConditionalGeneration" if model.config.arch == "encoder-decoder" else "ForCausalLM")
    reloaded = hf.from_pretrained(path).eval()
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _assert_close(_hf_out(reloaded(**inputs)), _ours_out(model(**inputs)), real)


@pytest.mark.parametrize("case, config, message", [
    ("switch", _switch(router_bias=True), "router_bias True is not supported"),
    ("switch", _switch(router_dtype="bfloat16"), "router_dtype 'bfloat16' is not supported"),
    ("switch", _switch(num_layers=6, num_sparse_encoder_layers=2), "sparse layers [1, 4] (encoder)"),
    ("mixtral", _mixtral(sliding_window=16), "sliding_window 16 is not supported"),
])
def test_hf_configs_lmforge_cannot_express_are_refused(case, config, message):
    torch.manual_seed(0)
    hf = (tf.SwitchTransformersModel(tf.SwitchTransformersConfig(**config)) if case == "switch" else
          tf.MixtralModel(tf.MixtralConfig(**config)))
    with pytest.raises(HFConversionError, match=None) as err:
        lmforge.from_hf(hf)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("preset, overrides, named", [
    ("gpt-tiny-moe", {}, "moe_"),  # a GPT-2 with experts: no HF family has both
    ("mixtral-tiny", dict(moe_capacity_factor=1.0), "moe_capacity_factor=1.0"),
    ("mixtral-tiny", dict(moe_every=2), "moe_every=2"),
    # Switch's capacity is fixed, not a factor
    ("switch-tiny", dict(head_dim=8), "switch_transformers cannot express moe_capacity_factor=1.25"),
    ("switch-tiny", dict(head_dim=8, moe_capacity_factor=None), "moe_expert_capacity=None (it has 64)"),
    ("switch-tiny", dict(head_dim=8, moe_capacity_factor=None, moe_expert_capacity=4, moe_top_k=2),
     "moe_top_k=2"),
])
def test_to_hf_refuses_moe_models_no_family_expresses(preset, overrides, named, tmp_path):
    model = build_model(preset, d_model=32, n_heads=4, d_ff=48, n_layers=2, vocab_size=V, **overrides)
    with pytest.raises(HFConversionError) as err:
        lmforge.to_hf(model, tmp_path / "hf")
    assert named in str(err.value)
    assert not (tmp_path / "hf").exists()
