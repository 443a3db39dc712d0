"""Llama <-> lmforge: a pre-RMSNorm decoder with RoPE, SwiGLU and grouped-query attention.

    HF (LlamaModel body)                       lmforge
    embed_tokens                               embed_tokens
    layers.i.self_attn.{q,k,v,o}_proj          decoder.layers.i.attn.{q,k,v,o}
    layers.i.input_layernorm                   decoder.layers.i.attn_norm
    layers.i.post_attention_layernorm          decoder.layers.i.ffn_norm
    layers.i.mlp.{gate,up,down}_proj           decoder.layers.i.ffn.{gate,up,down}
    norm                                       decoder.final_norm
    lm_head (untied by default)                lm_head

Both use the "rotate half" RoPE layout (pairs (x[i], x[i + d/2])), so q/k weights need no permutation.
Only the default RoPE is supported; scaled variants (linear, dynamic, yarn, llama3) are refused.

Two more families share this body and this table, and differ only in a few config facts:

    Llama    attention_bias (q/k/v/o), mlp_bias                  ModelConfig qkv_bias = o_bias, bias
    Qwen2    q/k/v biases always, no o or MLP bias               qkv_bias=True, o_bias=False, bias=False
             sliding window on layers >= max_window_layers when use_sliding_window
    Mistral  no biases; sliding_window (default 4096) on every layer          sliding_window

lmforge applies one window to every layer: a Qwen2 config whose layer_types mix sliding and full
attention is refused rather than converted with the wrong mask.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, hidden_size=32,
    ...     intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    >>> lmforge.from_hf(hf).config.n_kv_heads
    2
"""

from __future__ import annotations

import dataclasses

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule, attention_rules, hf_activation


def _rope_theta(c: HFConfig) -> float:
    # transformers >= 5 writes rope_parameters; older configs write rope_theta and rope_scaling.
    params = c("rope_parameters", None) or c("rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise c.fail(f"rope_parameters.rope_type {rope_type!r} is not supported (supported: 'default')")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise c.fail(f"rope_parameters.partial_rotary_factor {params['partial_rotary_factor']!r} is not supported")
    return float(params.get("rope_theta", c("rope_theta", 10000.0)))


def _body(c: HFConfig, vocab: int, d_ff: int, max_len: int, kv_heads: int | None = None) -> dict:
    """The fields every Llama-shaped family reads alike (``vocab``, ``d_ff``, ``max_len``, ``kv_heads``: its HF
    defaults; kv_heads None = num_attention_heads)."""
    d_model, n_heads = c("hidden_size", 4096), c("num_attention_heads", 32)
    return dict(
        arch="decoder", position="rope", norm="rmsnorm", norm_position="pre", final_norm=True,
        vocab_size=c("vocab_size", vocab), d_model=d_model,
        n_heads=n_heads, n_kv_heads=c("num_key_value_heads", kv_heads) or n_heads,
        head_dim=c("head_dim", None) or d_model // n_heads, d_ff=c("intermediate_size", d_ff),
        n_layers=c("num_hidden_layers", 32), max_seq_len=c("max_position_embeddings", max_len),
        layer_norm_eps=c("rms_norm_eps", 1e-6), rope_theta=_rope_theta(c),
        activation=c.activation("hidden_act", "silu", gated=True), attn_dropout=c("attention_dropout", 0.0),
        initializer_range=c("initializer_range", 0.02),
    )


def _body_to_hf(cfg: ModelConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.dim_per_head, hidden_act=hf_activation(cfg.activation), max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.layer_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_dropout=cfg.attn_dropout, initializer_range=cfg.initializer_range,
    )


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    attention_bias = bool(c("attention_bias", False))
    return dict(_body(c, 32000, 11008, 2048), bias=bool(c("mlp_bias", False)), qkv_bias=attention_bias,
                o_bias=attention_bias)


def _to_hf(cfg: ModelConfig) -> dict:
    # attention_bias covers q/k/v and o alike: a config with only one of them round-trips to another family.
    return dict(_body_to_hf(cfg), attention_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias, mlp_bias=cfg.bias)


def _qwen2_window(c: HFConfig) -> int | None:
    """Qwen2's one sliding window, or None; a mix of sliding and full layers is refused."""
    window = c("sliding_window", 4096) if c("use_sliding_window", False) else None
    n_layers, first = c("num_hidden_layers", 32), c("max_window_layers", 28)
    types = c("layer_types", None) or [
        "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n_layers)]
    sliding = [t == "sliding_attention" for t in types]
    if window is None or not any(sliding):
        return None
    if not all(sliding):
        raise c.fail(f"layer_types {types!r} mix sliding-window and full attention (use_sliding_window with "
                     f"max_window_layers={first} of {n_layers} layers); lmforge applies one window to every layer")
    return window


def _qwen2_from_hf(c: HFConfig, arch: Arch) -> dict:
    return dict(_body(c, 151936, 22016, 32768, kv_heads=32), bias=False, qkv_bias=True, o_bias=False,
                sliding_window=_qwen2_window(c))


def _qwen2_to_hf(cfg: ModelConfig) -> dict:
    # Qwen2's q/k/v always carry biases and o never does: other bias settings round-trip elsewhere or not at all.
    windowed = cfg.sliding_window is not None
    return dict(_body_to_hf(cfg), use_sliding_window=windowed, sliding_window=cfg.sliding_window,
                max_window_layers=0 if windowed else cfg.n_layers)


def _mistral_from_hf(c: HFConfig, arch: Arch) -> dict:
    return dict(_body(c, 32000, 14336, 4096 * 32, kv_heads=8), bias=False, sliding_window=c("sliding_window", 4096))


def _mistral_to_hf(cfg: ModelConfig) -> dict:
    return dict(_body_to_hf(cfg), sliding_window=cfg.sliding_window)


def _rules(cfg: ModelConfig) -> list[Rule]:
    L, H = "decoder.layers.{i}", "layers.{i}"
    return [
        Rule("embed_tokens", "embed_tokens"),
        *attention_rules(f"{L}.attn", f"{H}.self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
        Rule(f"{L}.attn_norm", f"{H}.input_layernorm"),
        Rule(f"{L}.ffn_norm", f"{H}.post_attention_layernorm"),
        *(Rule(f"{L}.ffn.{p}", f"{H}.mlp.{p}_proj") for p in ("gate", "up", "down")),
        Rule("decoder.final_norm", "norm"),
        Rule("lm_head.weight", "lm_head.weight"),
    ]


# Same fields as the other families' declarations, with this family's values: a table, not repeated logic.
LLAMA = Family(
    model_type="llama",
    architectures={"LlamaModel": Arch(), "LlamaForCausalLM": Arch("lm", True)},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    prefix="model.",
    embedding="embed_tokens.weight",
    output_embedding="lm_head.weight",
    ignore=(r"(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq",),  # derived RoPE frequencies
    tokenizer_family=None,
    tie_default=False,
)


QWEN2 = dataclasses.replace(
    LLAMA, model_type="qwen2", architectures={"Qwen2Model": Arch(), "Qwen2ForCausalLM": Arch("lm", True)},
    config_from_hf=_qwen2_from_hf, config_to_hf=_qwen2_to_hf,
)

MISTRAL = dataclasses.replace(
    LLAMA, model_type="mistral", architectures={"MistralModel": Arch(), "MistralForCausalLM": Arch("lm", True)},
    config_from_hf=_mistral_from_hf, config_to_hf=_mistral_to_hf,
)
