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

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, hidden_size=32,
    ...     intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    >>> lmforge.from_hf(hf).config.n_kv_heads
    2
"""

from __future__ import annotations

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


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    d_model, n_heads = c("hidden_size", 4096), c("num_attention_heads", 32)
    return dict(
        arch="decoder", position="rope", norm="rmsnorm", norm_position="pre", final_norm=True,
        bias=bool(c.same("attention_bias", "mlp_bias", False)), vocab_size=c("vocab_size", 32000), d_model=d_model,
        n_heads=n_heads, n_kv_heads=c("num_key_value_heads", None) or n_heads,
        head_dim=c("head_dim", None) or d_model // n_heads, d_ff=c("intermediate_size", 11008),
        n_layers=c("num_hidden_layers", 32), max_seq_len=c("max_position_embeddings", 2048),
        layer_norm_eps=c("rms_norm_eps", 1e-6), rope_theta=_rope_theta(c),
        activation=c.activation("hidden_act", "silu", gated=True), attn_dropout=c("attention_dropout", 0.0),
        initializer_range=c("initializer_range", 0.02),
    )


def _to_hf(cfg: ModelConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.dim_per_head, hidden_act=hf_activation(cfg.activation), max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.layer_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=cfg.bias, mlp_bias=cfg.bias, attention_dropout=cfg.attn_dropout,
        initializer_range=cfg.initializer_range,
    )


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
