"""BART and mBART <-> lmforge: encoder-decoders with learned positions offset by 2 and an embedding norm.

    HF (BartModel body)                          lmforge
    shared                                       embed_tokens (encoder and decoder share it)
    {enc,dec}oder.embed_positions                {enc,dec}oder.embed.positions  (position_offset=2)
    {enc,dec}oder.layernorm_embedding            {enc,dec}oder.embed.norm
    *.layers.i.self_attn.{q,k,v,out}_proj        *.layers.i.attn.{q,k,v,o}
    *.layers.i.self_attn_layer_norm              *.layers.i.attn_norm
    decoder.layers.i.encoder_attn(_layer_norm)   decoder.layers.i.cross_attn (cross_norm)
    *.layers.i.fc1, fc2, final_layer_norm        *.layers.i.ffn.up, ffn.down, ffn_norm
    {enc,dec}oder.layer_norm (mBART only)        {enc,dec}oder.final_norm
    final_logits_bias (1, V)                     lm_head.bias (V,)

BART is post-norm; mBART is pre-norm with a final LayerNorm per stack. ``scale_embedding`` multiplies
token vectors by sqrt(d_model) before the positions are added. ``final_logits_bias`` is a buffer
that is zero unless a fine-tune trained it; lmforge keeps it as ``lm_head.bias`` whenever it is stored.
BART's LayerNorms use torch's default eps (1e-5); its config has no field for it.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.BartModel(transformers.BartConfig(vocab_size=64, d_model=32, encoder_layers=1,
    ...     decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    ...     decoder_ffn_dim=64, max_position_embeddings=64))
    >>> lmforge.from_hf(hf).config.position_offset
    2
"""

from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule, attention_rules, hf_activation

PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def _from_hf(c: HFConfig, pre_norm: bool) -> dict:
    # Keys of older BART/mBART configs, when present, must describe the architecture of this family.
    c.require("normalize_before", (pre_norm,), pre_norm)
    c.require("add_final_layer_norm", (pre_norm,), pre_norm)
    c.require("normalize_embedding", (True,), True)
    c.require("static_position_embeddings", (False,), False)
    c.require("extra_pos_embeddings", (2,), 2)
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if c(key, 0.0):
            c.notes.append(f"{key}={c(key)} dropped: lmforge has no LayerDrop (it only affects training)")
    heads = c.same("encoder_attention_heads", "decoder_attention_heads", 16)
    return dict(
        arch="encoder-decoder", position="learned", position_offset=2, norm="layernorm",
        norm_position="pre" if pre_norm else "post", final_norm=pre_norm, embedding_norm=True, bias=True,
        share_embeddings=True, layer_norm_eps=1e-5, scale_embeddings=bool(c("scale_embedding", False)),
        vocab_size=c("vocab_size", 50265), d_model=c("d_model", 1024), n_heads=heads,
        d_ff=c.same("encoder_ffn_dim", "decoder_ffn_dim", 4096), n_layers=c("encoder_layers", 12),
        n_decoder_layers=c("decoder_layers", 12), max_seq_len=c("max_position_embeddings", 1024),
        activation=c.activation("activation_function", "gelu"), dropout=c("dropout", 0.1),
        attn_dropout=c("attention_dropout", 0.0), ffn_dropout=c("activation_dropout", 0.0),
        initializer_range=c("init_std", 0.02),
    )


def _to_hf(cfg: ModelConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.decoder_layers, max_position_embeddings=cfg.max_seq_len,
        scale_embedding=cfg.scale_embeddings, activation_function=hf_activation(cfg.activation),
        dropout=cfg.dropout, attention_dropout=cfg.attn_dropout, activation_dropout=cfg.ffn_dropout,
        init_std=cfg.initializer_range, is_encoder_decoder=True,
    )


def _rules(cfg: ModelConfig) -> list[Rule]:
    rules = [Rule("embed_tokens", "shared"), Rule("lm_head.bias", "final_logits_bias", flat=True),
             Rule("lm_head.weight", "lm_head.weight")]
    for s in ("encoder", "decoder"):
        L = f"{s}.layers.{{i}}"
        rules += [
            Rule(f"{s}.embed.positions", f"{s}.embed_positions"),
            Rule(f"{s}.embed.norm", f"{s}.layernorm_embedding"),
            Rule(f"{s}.final_norm", f"{s}.layer_norm"),
            *attention_rules(f"{L}.attn", f"{L}.self_attn", PROJ),
            Rule(f"{L}.attn_norm", f"{L}.self_attn_layer_norm"),
            *attention_rules(f"{L}.cross_attn", f"{L}.encoder_attn", PROJ),
            Rule(f"{L}.cross_norm", f"{L}.encoder_attn_layer_norm"),
            Rule(f"{L}.ffn.up", f"{L}.fc1"),
            Rule(f"{L}.ffn.down", f"{L}.fc2"),
            Rule(f"{L}.ffn_norm", f"{L}.final_layer_norm"),
        ]
    return rules


def _family(model_type: str, cls: str, pre_norm: bool, tokenizer_family: str | None) -> Family:
    return Family(
        model_type=model_type,
        architectures={
            f"{cls}Model": Arch(),
            f"{cls}ForConditionalGeneration": Arch("lm", True, (("lm_head_bias", "final_logits_bias"),)),
        },
        config_from_hf=lambda c, arch: _from_hf(c, pre_norm),
        config_to_hf=_to_hf,
        rules=_rules,
        prefix="model.",
        embedding="shared.weight",
        output_embedding="lm_head.weight",
        aliases=(("encoder.embed_tokens.weight", "shared.weight"), ("decoder.embed_tokens.weight", "shared.weight")),
        ignore=(r"(encoder|decoder)\.version",),  # fairseq bookkeeping in older checkpoints
        tokenizer_family=tokenizer_family,
    )


BART = _family("bart", "Bart", pre_norm=False, tokenizer_family="bart")
# mBART's tokenizer starts decoding from a language code, not BART's </s>: let its roles be guessed.
MBART = _family("mbart", "MBart", pre_norm=True, tokenizer_family=None)
