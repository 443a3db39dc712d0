"""DeBERTa-v2/v3 <-> lmforge: post-norm encoders with disentangled attention (``position="deberta"``).

    HF (DebertaV2Model body)                          lmforge
    embeddings.word_embeddings                        embed_tokens
    embeddings.token_type_embeddings, .LayerNorm      encoder.embed.token_types, encoder.embed.norm
    encoder.rel_embeddings, encoder.LayerNorm         encoder.relative_positions(.norm)
    encoder.layer.i.attention.self.{query,key,value}_proj, .output.dense   encoder.layers.i.attn.{q,k,v,o}
    encoder.layer.i.attention.self.pos_{key,query}_proj                   ...attn.disentangled.pos_{k,q}
    encoder.layer.i.attention.output.LayerNorm        encoder.layers.i.attn_norm
    encoder.layer.i.{intermediate,output}.dense, output.LayerNorm          ffn.up, ffn.down, ffn_norm
    cls.predictions.* (legacy head), or           mlm_head.*
    lm_predictions.lm_head.{dense,LayerNorm,bias} (legacy=False)

Both MLM heads of ``DebertaV2ForMaskedLM`` are BERT's head (dense, activation, LayerNorm, tied decoder
plus bias); HF implements no enhanced mask decoder (the original checkpoints' ``mask_predictions`` are
unused by HF too). Written models use the legacy layout, which HF loads by default.

HF zeroes the embeddings of padding tokens; lmforge does not. Every real token's output is the same,
since a real query never attends to a padding key.

Refused, with the field named: ``relative_attention=False``, ``position_biased_input=True`` (absolute
positions added to the input, as DeBERTa-v1-style configs do), ``conv_kernel_size > 0`` (DeBERTa-v2's
convolution beside the first layer), ``embedding_size != hidden_size``, position terms other than c2p/p2c,
an untied MLM head (``tie_word_embeddings=false``).

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.DebertaV2Model(transformers.DebertaV2Config(
    ...     vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
    ...     relative_attention=True, position_biased_input=False, pos_att_type="p2c|c2p", position_buckets=8,
    ...     max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm"))
    >>> cfg = lmforge.from_hf(hf).config
    >>> cfg.position, cfg.pos_att_type, cfg.position_buckets
    ('deberta', 'p2c|c2p', 8)
"""

from __future__ import annotations

from lmforge.config import DEBERTA_TERMS, ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule, attention_rules, hf_activation


def _terms(c: HFConfig) -> str:
    value = c("pos_att_type", None) or []
    terms = [t.strip() for t in value.lower().split("|")] if isinstance(value, str) else list(value)
    if not terms or any(t not in DEBERTA_TERMS for t in terms):
        raise c.fail(f"pos_att_type {value!r} is not supported (supported: c2p and/or p2c)")
    return "|".join(terms)


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    if not c("relative_attention", False):
        raise c.fail("relative_attention=False is not supported: lmforge converts DeBERTa's relative "
                     "(disentangled) attention only")
    if c("position_biased_input", True):
        raise c.fail("position_biased_input=True (absolute positions added to the input) is not supported; "
                     "DeBERTa-v2/v3 checkpoints set it to false")
    if (c("conv_kernel_size", 0) or 0) > 0:
        raise c.fail(f"conv_kernel_size={c('conv_kernel_size')} (DeBERTa-v2's convolution beside the first layer) "
                     "is not supported")
    d_model, n_heads = c("hidden_size", 1536), c("num_attention_heads", 24)
    if c("embedding_size", d_model) != d_model:
        raise c.fail(f"embedding_size={c('embedding_size')} differs from hidden_size={d_model}; not supported")
    if c("attention_head_size", d_model // n_heads) != d_model // n_heads:
        raise c.fail(f"attention_head_size={c('attention_head_size')} is not hidden_size / num_attention_heads; "
                     "not supported")
    if arch.head == "mlm" and not c("tie_word_embeddings", True):
        # Untied, HF's legacy head adds cls.predictions.decoder.bias and leaves cls.predictions.bias unused, and
        # the legacy=False head still reads the input embeddings: neither is lmforge's untied MLM head.
        raise c.fail("tie_word_embeddings=false is not supported for DebertaV2ForMaskedLM; lmforge converts "
                     "its tied MLM head only")
    act = c.activation("hidden_act", "gelu")
    max_len = c("max_position_embeddings", 512)
    max_relative = c("max_relative_positions", -1) or -1
    return dict(
        arch="encoder", position="deberta", norm="layernorm", norm_position="post", final_norm=False,
        embedding_norm=True, bias=True, vocab_size=c("vocab_size", 128100), d_model=d_model, n_heads=n_heads,
        d_ff=c("intermediate_size", 6144), n_layers=c("num_hidden_layers", 24), max_seq_len=max_len,
        type_vocab_size=c("type_vocab_size", 0), layer_norm_eps=c("layer_norm_eps", 1e-7), activation=act,
        mlm_head_activation=act, dropout=c("hidden_dropout_prob", 0.1),
        attn_dropout=c("attention_probs_dropout_prob", 0.1), initializer_range=c("initializer_range", 0.02),
        position_buckets=max(c("position_buckets", -1) or 0, 0),
        max_relative_positions=max_relative if max_relative >= 1 else max_len,  # HF: < 1 means the table length
        share_att_key=bool(c("share_att_key", False)), pos_att_type=_terms(c),
        norm_rel_embeddings="layer_norm" in [x.strip() for x in str(c("norm_rel_ebd", "none")).lower().split("|")],
    )


def _to_hf(cfg: ModelConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers, max_position_embeddings=cfg.max_seq_len,
        type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.layer_norm_eps,
        hidden_act=hf_activation(cfg.activation), hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attn_dropout,
        initializer_range=cfg.initializer_range, relative_attention=True, position_biased_input=False,
        position_buckets=cfg.position_buckets or -1, max_relative_positions=cfg.max_relative_positions,
        pos_att_type=cfg.pos_att_type.split("|"), share_att_key=cfg.share_att_key,
        norm_rel_ebd="layer_norm" if cfg.norm_rel_embeddings else "none", legacy=True,
    )


def _rules(cfg: ModelConfig) -> list[Rule]:
    L, H = "encoder.layers.{i}", "encoder.layer.{i}"
    return [
        Rule("embed_tokens", "embeddings.word_embeddings"),
        Rule("encoder.embed.token_types", "embeddings.token_type_embeddings"),
        Rule("encoder.embed.norm", "embeddings.LayerNorm"),
        Rule("encoder.relative_positions.norm", "encoder.LayerNorm"),  # before the table's rule, which it extends
        Rule("encoder.relative_positions.weight", "encoder.rel_embeddings.weight"),
        *attention_rules(f"{L}.attn", f"{H}.attention",
                         ("self.query_proj", "self.key_proj", "self.value_proj", "output.dense")),
        Rule(f"{L}.attn.disentangled.pos_k", f"{H}.attention.self.pos_key_proj"),
        Rule(f"{L}.attn.disentangled.pos_q", f"{H}.attention.self.pos_query_proj"),
        Rule(f"{L}.attn_norm", f"{H}.attention.output.LayerNorm"),
        Rule(f"{L}.ffn.up", f"{H}.intermediate.dense"),
        Rule(f"{L}.ffn.down", f"{H}.output.dense"),
        Rule(f"{L}.ffn_norm", f"{H}.output.LayerNorm"),
        Rule("mlm_head.dense", "cls.predictions.transform.dense"),
        Rule("mlm_head.norm", "cls.predictions.transform.LayerNorm"),
        Rule("mlm_head.bias", "cls.predictions.bias"),
        Rule("mlm_head.decoder", "cls.predictions.decoder"),
    ]


DEBERTA_V2 = Family(
    model_type="deberta-v2",
    architectures={"DebertaV2Model": Arch(), "DebertaV2ForMaskedLM": Arch("mlm", True)},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    prefix="deberta.",
    embedding="embeddings.word_embeddings.weight",
    output_embedding="cls.predictions.decoder.weight",
    aliases=(("cls.predictions.decoder.bias", "cls.predictions.bias"),),
    ignore=(r"embeddings\.position_ids",),
    # legacy=False names the same head differently (its decoder is always the input embedding).
    renames=((r"^lm_predictions\.lm_head\.(dense|LayerNorm)\.", r"cls.predictions.transform.\1."),
             (r"^lm_predictions\.lm_head\.bias$", "cls.predictions.bias")),
)
