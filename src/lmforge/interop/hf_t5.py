"""T5 (v1.0 and v1.1) <-> lmforge: pre-RMSNorm encoder-decoder with bucketed relative position bias.

    HF                                                   lmforge
    shared                                               embed_tokens (encoder and decoder share it)
    {enc,dec}oder.block.0.layer.0.SelfAttention.relative_attention_bias   {enc,dec}oder.rel_bias
    encoder.block.i.layer.0.{layer_norm,SelfAttention}   encoder.layers.i.{attn_norm,attn}
    encoder.block.i.layer.1.{layer_norm,DenseReluDense}  encoder.layers.i.{ffn_norm,ffn}
    decoder.block.i.layer.1.{layer_norm,EncDecAttention} decoder.layers.i.{cross_norm,cross_attn}
    decoder.block.i.layer.2.*                            decoder.layers.i.{ffn_norm,ffn}
    DenseReluDense.wi / wo  (gated: wi_0 = gate, wi_1 = up)   ffn.up / ffn.down (ffn.gate)
    {enc,dec}oder.final_layer_norm                       {enc,dec}oder.final_norm

v1.0: ``feed_forward_proj="relu"``, tied head, decoder output scaled by d_model**-0.5 before it.
v1.1: ``"gated-gelu"``, which HF reads as the *tanh* GELU (``geglu-tanh``), an untied head, no scaling.
T5 folds 1/sqrt(d) into its initialisation, so attention logits are unscaled (``attn_scale=False``).

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.T5Model(transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64,
    ...     num_layers=1, num_heads=4, feed_forward_proj="gated-gelu"))
    >>> lmforge.from_hf(hf).config.activation
    'geglu-tanh'
"""

from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import ACTIVATIONS, GATED, Arch, Family, HFConfig, Rule, hf_activation


def _activation(c: HFConfig) -> str:
    proj = c("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise c.fail(f"feed_forward_proj {proj!r} is not supported (use 'ACT' or 'gated-ACT')")
    # HF's backwards-compatibility rule: "gated-gelu" means the tanh approximation (gelu_new).
    dense = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if c.data.get("is_gated_act", gated) != gated:
        raise c.fail(f"is_gated_act={c.data['is_gated_act']!r} contradicts feed_forward_proj {proj!r}")
    if c.data.get("dense_act_fn", dense) != dense:
        raise c.fail(f"dense_act_fn {c.data['dense_act_fn']!r} contradicts feed_forward_proj {proj!r}")
    if dense not in ACTIVATIONS:
        raise c.fail(f"feed_forward_proj {proj!r} is not supported (activation {dense!r})")
    return GATED[ACTIVATIONS[dense]] if gated else ACTIVATIONS[dense]


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    c.require("is_encoder_decoder", (True,), True)
    n_layers, dropout = c("num_layers", 6), c("dropout_rate", 0.1)
    return dict(
        arch="encoder-decoder", position="t5-bias", norm="rmsnorm", norm_position="pre", final_norm=True, bias=False,
        attn_scale=False, share_embeddings=True, vocab_size=c("vocab_size", 32128), d_model=c("d_model", 512),
        head_dim=c("d_kv", 64), d_ff=c("d_ff", 2048), n_heads=c("num_heads", 8), n_layers=n_layers,
        n_decoder_layers=c("num_decoder_layers", None) or n_layers,
        t5_num_buckets=c("relative_attention_num_buckets", 32),
        t5_max_distance=c("relative_attention_max_distance", 128),
        layer_norm_eps=c("layer_norm_epsilon", 1e-6), activation=_activation(c),
        max_seq_len=c("n_positions", 512),  # T5 has no position table; older configs record 512 here
        dropout=dropout, attn_dropout=dropout, ffn_dropout=dropout,
        # transformers >= 5 saves the flag; older configs imply it by tying (v1.0 tied and scaled, v1.1 neither).
        lm_head_scale=bool(c("scale_decoder_outputs", c("tie_word_embeddings", True))),
    )


def _to_hf(cfg: ModelConfig) -> dict:
    proj = hf_activation(cfg.activation)
    if cfg.gated:  # "gated-gelu" is HF's spelling of the tanh GELU gate (see _activation)
        proj = "gated-gelu" if cfg.activation == "geglu-tanh" else f"gated-{proj}"
    return dict(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.dim_per_head, d_ff=cfg.d_ff, num_heads=cfg.n_heads,
        num_layers=cfg.n_layers, num_decoder_layers=cfg.decoder_layers, feed_forward_proj=proj,
        relative_attention_num_buckets=cfg.t5_num_buckets, relative_attention_max_distance=cfg.t5_max_distance,
        layer_norm_epsilon=cfg.layer_norm_eps, dropout_rate=cfg.dropout, n_positions=cfg.max_seq_len,
        scale_decoder_outputs=cfg.lm_head_scale, is_encoder_decoder=True,
    )


def _rules(cfg: ModelConfig) -> list[Rule]:
    ffn = {"up": "wi_1", "gate": "wi_0", "down": "wo"} if cfg.gated else {"up": "wi", "down": "wo"}
    rules = [Rule("embed_tokens", "shared"), Rule("lm_head.weight", "lm_head.weight")]
    for stack, sublayers in (("encoder", ("attn", "ffn")), ("decoder", ("attn", "cross_attn", "ffn"))):
        L, B = f"{stack}.layers.{{i}}", f"{stack}.block.{{i}}.layer"
        rules += [Rule(f"{stack}.rel_bias", f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"),
                  Rule(f"{stack}.final_norm", f"{stack}.final_layer_norm")]
        for k, sub in enumerate(sublayers):
            norm = {"attn": "attn_norm", "cross_attn": "cross_norm", "ffn": "ffn_norm"}[sub]
            rules.append(Rule(f"{L}.{norm}", f"{B}.{k}.layer_norm"))
            if sub == "ffn":
                rules += [Rule(f"{L}.ffn.{ours}", f"{B}.{k}.DenseReluDense.{hf}") for ours, hf in ffn.items()]
            else:  # T5's projections are already named q, k, v, o
                rules.append(Rule(f"{L}.{sub}", f"{B}.{k}.{'SelfAttention' if sub == 'attn' else 'EncDecAttention'}"))
    return rules


T5 = Family(
    model_type="t5",
    architectures={"T5Model": Arch(), "T5ForConditionalGeneration": Arch("lm")},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    embedding="shared.weight",
    output_embedding="lm_head.weight",
    aliases=(("encoder.embed_tokens.weight", "shared.weight"), ("decoder.embed_tokens.weight", "shared.weight")),
    # Some checkpoints carry a cross-attention bias table that T5 never uses.
    ignore=(r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",),
    tokenizer_family="t5",
)
