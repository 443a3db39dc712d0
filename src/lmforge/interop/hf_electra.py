"""ELECTRA <-> lmforge: BERT's body, factorised embeddings, and the discriminator's or generator's head.

    HF (ElectraModel body, ``electra.`` in head classes)   lmforge
    embeddings.*, encoder.layer.i.*                        as BERT (:mod:`~lmforge.interop.hf_bert`)
    embeddings_project (embedding_size != hidden_size)     encoder.embed.proj (``embedding_dim`` = E)
    discriminator_predictions.dense                        rtd_head.dense           (ElectraForPreTraining)
    discriminator_predictions.dense_prediction             rtd_head.prediction
    generator_predictions.{dense,LayerNorm}                mlm_head.{dense,norm}    (ElectraForMaskedLM)
    generator_lm_head (tied to the word embeddings)        mlm_head.decoder / mlm_head.bias

An ELECTRA embedding is BERT's (word + position + segment, LayerNorm, dropout) at width E = ``embedding_size``,
then ``embeddings_project`` to the hidden size when they differ. lmforge's factorised embeddings
(:class:`~lmforge.nn.embeddings.StackEmbeddings`) are the same computation in the same order (norm, dropout,
then the projection), so ``embedding_dim`` expresses it exactly. The discriminator head uses ``hidden_act``
(lmforge: the model's ``activation``); the generator head's GELU is fixed in HF, whatever ``hidden_act`` says.

Example:
    >>> import torch, transformers, lmforge
    >>> hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(vocab_size=64, embedding_size=16,
    ...     hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)).eval()
    >>> model = lmforge.from_hf(hf)
    >>> model.config.head, model.config.embed_dim, model.config.d_model
    ('rtd', 16, 32)
    >>> ids = torch.randint(0, 64, (2, 6))
    >>> bool((model(ids).logits - hf(ids).logits).abs().max() < 1e-4)
    True
"""

from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.interop.hf_bert import IGNORE, _body as bert_body, _from_hf as bert_from_hf, _to_hf as bert_to_hf
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule


def _from_hf(c: HFConfig) -> dict:
    fields = bert_from_hf(c, roberta=False)
    fields.update(embedding_dim=c("embedding_size", 128), mlm_head_activation="gelu")
    return fields


def _to_hf(cfg: ModelConfig) -> dict:
    return {**bert_to_hf(cfg, roberta=False), "embedding_size": cfg.embed_dim}


def _rules(cfg: ModelConfig) -> list[Rule]:
    return [
        *bert_body(),
        Rule("encoder.embed.proj", "embeddings_project"),
        Rule("rtd_head.dense", "discriminator_predictions.dense"),
        Rule("rtd_head.prediction", "discriminator_predictions.dense_prediction"),
        Rule("mlm_head.dense", "generator_predictions.dense"),
        Rule("mlm_head.norm", "generator_predictions.LayerNorm"),
        Rule("mlm_head.bias", "generator_lm_head.bias"),
        Rule("mlm_head.decoder", "generator_lm_head"),
    ]


ELECTRA = Family(
    model_type="electra",
    architectures={
        "ElectraModel": Arch(),
        "ElectraForPreTraining": Arch("rtd", True),
        "ElectraForMaskedLM": Arch("mlm", True),
    },
    config_from_hf=lambda c, arch: _from_hf(c),
    config_to_hf=_to_hf,
    rules=_rules,
    prefix="electra.",
    embedding="embeddings.word_embeddings.weight",
    output_embedding="generator_lm_head.weight",
    ignore=IGNORE,
    tokenizer_family="bert",
)
