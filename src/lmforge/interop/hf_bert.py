"""BERT and RoBERTa <-> lmforge: post-norm encoders with learned positions, segments and an MLM head.

    HF (BertModel body)                        lmforge
    embeddings.word_embeddings                 embed_tokens
    embeddings.{position,token_type}_embeddings  encoder.embed.{positions,token_types}
    embeddings.LayerNorm                       encoder.embed.norm
    encoder.layer.i.attention.self.{query,key,value}, .output.dense   encoder.layers.i.attn.{q,k,v,o}
    encoder.layer.i.attention.output.LayerNorm encoder.layers.i.attn_norm
    encoder.layer.i.{intermediate,output}.dense, output.LayerNorm     ffn.up, ffn.down, ffn_norm
    pooler.dense                               pooler.dense
    cls.predictions.* (RoBERTa: lm_head.*)     mlm_head.*
    cls.seq_relationship (BertForPreTraining)  nsp_head.classifier   (next sentence prediction, on the pooler)

RoBERTa differs only in its position table, which starts after the padding id (positions ``pad + 1 + i``,
so ``position_offset = pad_token_id + 1``), and in its MLM head, which always uses exact GELU. HF counts
positions over non-pad tokens, lmforge over all tokens: they agree at every real token of a right-padded
batch (the padding-offset positions), not for a pad id inside a sequence.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
    ...     vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64))
    >>> lmforge.from_hf(hf).config.position_offset
    2
"""

from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule, attention_rules, hf_activation

POOLER = (("pooler", "pooler.dense.weight"),)  # BertModel may be saved with or without its pooler
IGNORE = (r"embeddings\.(position_ids|token_type_ids)",)  # index buffers some checkpoints persist


def _from_hf(c: HFConfig, roberta: bool) -> dict:
    c.require("position_embedding_type", ("absolute",), "absolute")
    c.require("is_decoder", (False,), False)
    c.require("add_cross_attention", (False,), False)
    if c("type_vocab_size", 2) < 1:
        raise c.fail("type_vocab_size must be >= 1 (BERT always adds a segment embedding)")
    act = c.activation("hidden_act", "gelu")
    fields = dict(
        arch="encoder", position="learned", norm="layernorm", norm_position="post", final_norm=False,
        embedding_norm=True, bias=True, vocab_size=c("vocab_size", 30522 if not roberta else 50265),
        d_model=c("hidden_size", 768), n_heads=c("num_attention_heads", 12), d_ff=c("intermediate_size", 3072),
        n_layers=c("num_hidden_layers", 12), max_seq_len=c("max_position_embeddings", 512),
        type_vocab_size=c("type_vocab_size", 2), layer_norm_eps=c("layer_norm_eps", 1e-12), activation=act,
        mlm_head_activation=act, dropout=c("hidden_dropout_prob", 0.1),
        attn_dropout=c("attention_probs_dropout_prob", 0.1), initializer_range=c("initializer_range", 0.02),
    )
    if roberta:
        pad = c("pad_token_id", 1)
        if pad is None:
            raise c.fail("pad_token_id is required: RoBERTa's positions start after the padding id")
        fields.update(position_offset=pad + 1, max_seq_len=fields["max_seq_len"] - pad - 1, mlm_head_activation="gelu")
    return fields


def _to_hf(cfg: ModelConfig, roberta: bool) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
        max_position_embeddings=cfg.max_seq_len + (cfg.position_offset if roberta else 0),
        type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.layer_norm_eps,
        hidden_act=hf_activation(cfg.activation), hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attn_dropout, initializer_range=cfg.initializer_range,
        position_embedding_type="absolute",
    )


def _body() -> list[Rule]:
    L, H = "encoder.layers.{i}", "encoder.layer.{i}"
    return [
        Rule("embed_tokens", "embeddings.word_embeddings"),
        Rule("encoder.embed.positions", "embeddings.position_embeddings"),
        Rule("encoder.embed.token_types", "embeddings.token_type_embeddings"),
        Rule("encoder.embed.norm", "embeddings.LayerNorm"),
        *attention_rules(f"{L}.attn", f"{H}.attention", ("self.query", "self.key", "self.value", "output.dense")),
        Rule(f"{L}.attn_norm", f"{H}.attention.output.LayerNorm"),
        Rule(f"{L}.ffn.up", f"{H}.intermediate.dense"),
        Rule(f"{L}.ffn.down", f"{H}.output.dense"),
        Rule(f"{L}.ffn_norm", f"{H}.output.LayerNorm"),
        Rule("pooler.dense", "pooler.dense"),
    ]


def _mlm_head(transform: str, norm: str, out: str) -> list[Rule]:
    return [Rule("mlm_head.dense", f"{transform}.dense"), Rule("mlm_head.norm", f"{transform}.{norm}"),
            Rule("mlm_head.bias", f"{out}.bias"), Rule("mlm_head.decoder", f"{out}.decoder")]


BERT = Family(
    model_type="bert",
    architectures={
        "BertModel": Arch(optional=POOLER),
        "BertForMaskedLM": Arch("mlm", True, POOLER),
        "BertForPreTraining": Arch("mlm", True, POOLER + (("nsp_head", "cls.seq_relationship.weight"),)),
        "BertForSequenceClassification": Arch("none", True, POOLER, task="classifier."),
        "BertForMultipleChoice": Arch("none", True, POOLER, task="classifier."),
    },
    config_from_hf=lambda c, arch: _from_hf(c, roberta=False),
    config_to_hf=lambda cfg: _to_hf(cfg, roberta=False),
    rules=lambda cfg: _body() + _mlm_head("cls.predictions.transform", "LayerNorm", "cls.predictions")
    + [Rule("nsp_head.classifier", "cls.seq_relationship")],
    prefix="bert.",
    embedding="embeddings.word_embeddings.weight",
    output_embedding="cls.predictions.decoder.weight",
    aliases=(("cls.predictions.decoder.bias", "cls.predictions.bias"),),
    ignore=IGNORE,
    tokenizer_family="bert",
)

# BERT's declaration with RoBERTa's names and values: the same fields, filled in twice on purpose.
ROBERTA = Family(
    model_type="roberta",
    architectures={
        "RobertaModel": Arch(optional=POOLER),
        "RobertaForMaskedLM": Arch("mlm", True, POOLER),
        "RobertaForSequenceClassification": Arch("none", True, POOLER, task="classifier."),
        "RobertaForMultipleChoice": Arch("none", True, POOLER, task="classifier."),
    },
    config_from_hf=lambda c, arch: _from_hf(c, roberta=True),
    config_to_hf=lambda cfg: _to_hf(cfg, roberta=True),
    rules=lambda cfg: _body() + _mlm_head("lm_head", "layer_norm", "lm_head"),
    prefix="roberta.",
    embedding="embeddings.word_embeddings.weight",
    output_embedding="lm_head.decoder.weight",
    aliases=(("lm_head.decoder.bias", "lm_head.bias"),),
    ignore=IGNORE,
    tokenizer_family="roberta",
)
