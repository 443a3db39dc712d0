"""Hugging Face parity: tiny random HF models through from_hf, to_hf and back (no download).

Every HF model is perturbed after init (LayerNorm gains, biases, BART's final_logits_bias are otherwise
ones/zeros, which would hide a swapped or dropped tensor). Batches are right-padded; outputs are
compared at real positions only.
"""

from __future__ import annotations

import importlib

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

import lmforge  # noqa: E402
from lmforge.config import ModelConfig  # noqa: E402
from lmforge.interop.hf import HFConversionError, TaskHead, convert_from_hf, convert_to_hf, load_hf  # noqa: E402
from lmforge.models import build_model  # noqa: E402

V = 97
ATOL = 1e-4


def _bert(**kw):
    return dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64) | kw


def _bart(**kw):
    return dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64) | kw


def _t5(**kw):
    return dict(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
                relative_attention_num_buckets=8, relative_attention_max_distance=16) | kw


def _llama(**kw):
    return dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4) | kw


def _gpt2(**kw):
    return dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64) | kw


def _deberta(**kw):
    return dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, relative_attention=True, position_biased_input=False,
                pos_att_type="p2c|c2p", position_buckets=8, max_relative_positions=16, share_att_key=True,
                norm_rel_ebd="layer_norm") | kw


def _untie_t5(model):
    # transformers 5 always ties T5's head in memory; v1.1 checkpoints store a separate one.
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    return model


# One entry per configuration that changes the mapping or the numerics.
CASES = {
    "bert": lambda: tf.BertModel(tf.BertConfig(**_bert())),
    "bert-mlm-gelu-new": lambda: tf.BertForMaskedLM(tf.BertConfig(**_bert(hidden_act="gelu_new"))),
    "roberta-mlm": lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(**_bert(
        type_vocab_size=1, pad_token_id=1, max_position_embeddings=66, layer_norm_eps=1e-5))),
    "gpt2-lm": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**_gpt2())),
    "gpt2-model-n-inner": lambda: tf.GPT2Model(tf.GPT2Config(**_gpt2(n_inner=48, activation_function="gelu"))),
    "t5-v1.0": lambda: tf.T5ForConditionalGeneration(tf.T5Config(**_t5())),
    "t5-v1.1": lambda: _untie_t5(tf.T5ForConditionalGeneration(tf.T5Config(**_t5(
        d_kv=16, num_decoder_layers=3, feed_forward_proj="gated-gelu", tie_word_embeddings=False)))),
    "t5-model": lambda: tf.T5Model(tf.T5Config(**_t5())),
    "bart-lm": lambda: tf.BartForConditionalGeneration(tf.BartConfig(**_bart())),
    "bart-scaled-uneven": lambda: tf.BartModel(tf.BartConfig(**_bart(
        scale_embedding=True, encoder_layers=1, decoder_layers=3, activation_function="relu"))),
    "mbart-prenorm": lambda: tf.MBartForConditionalGeneration(tf.MBartConfig(**_bart(scale_embedding=True))),
    "llama-gqa-rope": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_llama(
        num_key_value_heads=2, head_dim=16, rope_theta=500.0))),
    "llama-mqa-tied-bias": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_llama(
        num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=True))),
    "llama-attention-bias-only": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_llama(
        num_key_value_heads=2, attention_bias=True, mlp_bias=False))),
    "gpt2-inverse-layer-scale": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**_gpt2(
        scale_attn_by_inverse_layer_idx=True, n_layer=3))),
    "qwen2-qkv-bias": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**_llama(num_key_value_heads=2))),
    "qwen2-sliding-window": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**_llama(
        num_key_value_heads=4, use_sliding_window=True, sliding_window=3, max_window_layers=0))),
    "mistral-sliding-window": lambda: tf.MistralForCausalLM(tf.MistralConfig(**_llama(
        num_key_value_heads=2, sliding_window=3))),  # windows of 3 over 9 positions
    "mistral-model-no-window": lambda: tf.MistralModel(tf.MistralConfig(**_llama(num_key_value_heads=4, sliding_window=None))),
    "deberta-v3": lambda: tf.DebertaV2Model(tf.DebertaV2Config(**_deberta())),
    "deberta-mlm-own-pos-proj": lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**_deberta(
        share_att_key=False, type_vocab_size=2, norm_rel_ebd="none", hidden_act="gelu_new"))),
    "deberta-mlm-c2p-exact-distances": lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**_deberta(
        pos_att_type=["c2p"], position_buckets=-1, max_relative_positions=6))),
    "deberta-mlm-new-head": lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**_deberta(legacy=False))),
}

AUTO = {"ForMaskedLM": "AutoModelForMaskedLM", "LMHeadModel": "AutoModelForCausalLM",
        "ForCausalLM": "AutoModelForCausalLM", "ForConditionalGeneration": "AutoModelForSeq2SeqLM",
        "ForSequenceClassification": "AutoModelForSequenceClassification"}


def _auto_class(architecture: str):
    name = next((auto for suffix, auto in AUTO.items() if architecture.endswith(suffix)), "AutoModel")
    return getattr(tf, name)


@torch.no_grad()
def _perturb(model):
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.1)
    for name, b in model.named_buffers():
        if name.endswith("final_logits_bias"):
            b.normal_(0, 0.1)
    return model


def _hf(case: str):
    torch.manual_seed(0)
    return _perturb(CASES[case]()).eval()


def _batch(cfg: ModelConfig, B: int = 3, T: int = 9, T_dec: int = 7) -> tuple[dict, torch.Tensor]:
    """Right-padded inputs (HF argument names) and the mask of real output positions."""
    g = torch.Generator().manual_seed(1)
    pad = cfg.pad_token_id or 0

    def padded(length: int, lengths: list[int]):
        ids = torch.randint(3, cfg.vocab_size, (B, length), generator=g)  # ids >= 3 avoid pad/bos/eos
        mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()
        return ids.masked_fill(mask == 0, pad), mask

    ids, mask = padded(T, [T, T - 3, 4])
    inputs = {"input_ids": ids, "attention_mask": mask}
    if cfg.type_vocab_size > 1:
        inputs["token_type_ids"] = (torch.arange(T)[None] >= torch.tensor([[5], [3], [2]])).long() * mask
    if cfg.arch == "encoder-decoder":
        dec, dec_mask = padded(T_dec, [T_dec, 5, 2])
        inputs.update(decoder_input_ids=dec, decoder_attention_mask=dec_mask)
        return inputs, dec_mask.bool()
    return inputs, mask.bool()


def _hf_out(out) -> torch.Tensor:
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _ours_out(out) -> torch.Tensor:
    return out.logits if out.logits is not None else out.last_hidden_state


def _assert_close(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> None:
    assert a.shape == b.shape
    diff = (a - b)[real].abs().max().item()
    assert diff <= ATOL, f"max abs diff {diff:.3g} at real positions"


def _pair_on(case: str, device: str):
    """The perturbed HF model of ``case``, its conversion, their padded batch and its real positions, on ``device``."""
    hf = _hf(case)
    model = lmforge.from_hf(hf)
    hf, model = hf.to(device), model.to(device)
    inputs, real = _batch(model.config)
    return hf, model, {k: v.to(device) for k, v in inputs.items()}, real.to(device)


@pytest.mark.parametrize("case", CASES)
def test_from_hf_matches_transformers(case, device):
    hf, model, inputs, real = _pair_on(case, device)
    with torch.no_grad():
        theirs, ours = hf(**inputs), model(**inputs)
    _assert_close(_ours_out(ours), _hf_out(theirs), real)
    if getattr(theirs, "pooler_output", None) is not None:
        _assert_close(ours.pooler_output, theirs.pooler_output, torch.ones(len(real), dtype=torch.bool, device=device))


# In bf16 neither side equals the fp32 function, and the two round differently (fused kernels, the order of
# reductions), so an absolute tolerance between them would be arbitrary. The stated tolerance: lmforge's bf16
# output is as close to the fp32 reference as transformers' own bf16 output is, within a factor of 2 plus
# 1e-2 (a few bf16 ulps at these magnitudes). A wrong mapping or a missed cast is off by far more.
BF16_FACTOR, BF16_SLACK = 2.0, 1e-2


@pytest.mark.parametrize("case", CASES)
def test_from_hf_in_bf16_is_as_close_to_fp32_as_transformers(case, device):
    hf, model, inputs, real = _pair_on(case, device)
    with torch.no_grad():
        reference = _hf_out(hf(**inputs)).float()
        theirs = _hf_out(hf.to(torch.bfloat16)(**inputs)).float()
        ours = _ours_out(model.to(torch.bfloat16)(**inputs)).float()
    assert ours.dtype == theirs.dtype and torch.isfinite(ours[real]).all()
    err_theirs = (theirs - reference)[real].abs().max().item()
    err_ours = (ours - reference)[real].abs().max().item()
    assert err_ours <= BF16_FACTOR * err_theirs + BF16_SLACK, (
        f"bf16 error {err_ours:.3g} vs transformers' {err_theirs:.3g}")


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

    again = lmforge.from_hf(path)  # from_hf(to_hf(x)) is bit-exact
    ours, back = model.state_dict(), again.state_dict()
    assert ours.keys() == back.keys()
    assert all(torch.equal(ours[k], back[k]) for k in ours)
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k not in ("name", "extra")}  # noqa: E731
    assert strip(again.config) == strip(model.config)


SMALL = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64)
NATIVE = {
    "gpt-tiny": {},
    "llama-tiny": {"rope_theta": 1000.0},
    "bert-tiny": {},
    "roberta-base": {},
    "t5-tiny": {"head_dim": 8, "n_decoder_layers": 3},
    "bart-tiny": {"n_decoder_layers": 1, "lm_head_bias": True, "scale_embeddings": True},
    "deberta-tiny": {"position_buckets": 8, "max_relative_positions": 16},
}


@pytest.mark.parametrize("preset", NATIVE)
def test_lmforge_model_to_hf_gives_same_outputs(preset, tmp_path):
    torch.manual_seed(0)
    model = _perturb(build_model(ModelConfig.from_preset(preset, **SMALL, **NATIVE[preset]))).eval()
    path = lmforge.to_hf(model, tmp_path / "hf")
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    hf, info = _auto_class(architecture).from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _assert_close(_ours_out(model(**inputs)), _hf_out(hf.eval()(**inputs)), real)


def test_to_hf_names_the_field_no_family_expresses(tmp_path):
    model = build_model(ModelConfig.from_preset("gpt-tiny", **SMALL, position="alibi"))
    with pytest.raises(HFConversionError, match=r"position='alibi'"):
        lmforge.to_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("cls", ["BertForSequenceClassification", "RobertaForSequenceClassification"])
def test_sequence_classifier_is_kept_aside_and_restored(cls, tmp_path):
    torch.manual_seed(0)
    config_cls = tf.BertConfig if cls.startswith("Bert") else tf.RobertaConfig
    labels = {0: "neg", 1: "neu", 2: "pos"}
    extra = {} if cls.startswith("Bert") else dict(pad_token_id=1, max_position_embeddings=66)
    hf = _perturb(getattr(tf, cls)(config_cls(**_bert(**extra), id2label=labels,
                                              label2id={v: k for k, v in labels.items()}))).eval()
    hf.save_pretrained(tmp_path / "src")
    convert_from_hf(tmp_path / "src", tmp_path / "lm")
    assert (tmp_path / "lm" / "head.safetensors").is_file()
    model, head = lmforge.load(tmp_path / "lm"), TaskHead.load(tmp_path / "lm")
    assert head.architecture == cls and head.config["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}

    inputs, _ = _batch(model.config)
    with torch.no_grad():
        out, expected = model(**inputs), hf(**inputs).logits
        t = head.tensors
        if cls.startswith("Bert"):  # classifier(pooler(h))
            logits = out.pooler_output @ t["classifier.weight"].T + t["classifier.bias"]
        else:  # out_proj(tanh(dense(h[:, 0])))
            x = torch.tanh(out.last_hidden_state[:, 0] @ t["classifier.dense.weight"].T + t["classifier.dense.bias"])
            logits = x @ t["classifier.out_proj.weight"].T + t["classifier.out_proj.bias"]
    _assert_close(logits, expected, torch.ones(len(logits), dtype=torch.bool))

    convert_to_hf(tmp_path / "lm", tmp_path / "back")
    back = tf.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == cls and back.config.id2label == labels
    with torch.no_grad():
        _assert_close(back(**inputs).logits, expected, torch.ones(len(logits), dtype=torch.bool))


def test_checkpoint_formats_bf16_sharded_and_bin(tmp_path):
    hf = _hf("gpt2-lm")
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert lmforge.from_hf(tmp_path / "bf16").embed_tokens.weight.dtype == torch.bfloat16  # precision is kept
    hf.float().save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model = lmforge.from_hf(tmp_path / "sharded")
    assert torch.equal(model.decoder.final_norm.weight, hf.transformer.ln_f.weight)
    # A pytorch_model.bin is read with torch.load(weights_only=True).
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "bf16" / "config.json").read_text())
    torch.save({"transformer." + k: v for k, v in hf.transformer.state_dict().items()},
               tmp_path / "bin" / "pytorch_model.bin")
    conv = load_hf(tmp_path / "bin")
    assert conv.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(conv.model.embed_tokens.weight, hf.transformer.wte.weight)
