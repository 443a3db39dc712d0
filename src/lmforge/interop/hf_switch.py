"""Switch Transformers <-> lmforge: T5 v1.0 (see :mod:`~lmforge.interop.hf_t5`) with top-1 MoE FFNs in some layers.

    HF                                                          lmforge
    {enc,dec}oder.block.i.layer.k.mlp.{wi,wo}   (dense layers)  {enc,dec}oder.layers.i.ffn.{up,down}
    {enc,dec}oder.block.i.layer.k.mlp.router.classifier         {enc,dec}oder.layers.i.ffn.router     (E, D)
    ....mlp.experts.expert_e.wi / .wo           (sparse layers) ....ffn.experts.up[e] (F, D) / .down[e] (D, F)
    everything else                                             as T5 (k = 1 in the encoder, 2 in the decoder)

HF's sparse layers: with ``step = num_layers // num_sparse_*_layers``, layer i is sparse when ``i % step == 1``
(every layer when step is 1). lmforge's ``moe_every`` k makes layers k-1, 2k-1, ... sparse in both stacks: the
two agree for steps 1 and 2 (every released checkpoint); other placements are refused.

Exact evaluation-mode conditions (logit parity): the router is a bias-free linear layer computed in fp32
(``router_bias=False``, ``router_dtype="float32"``, others refused); top-1 with the raw, unrenormalised
probability as the gate; a fixed ``expert_capacity`` per sequence and expert, filled in sequence order, and
tokens over it are dropped in evaluation too (they pass through the residual only; padding tokens take
capacity as well); ``router_jitter_noise`` only acts in training (lmforge's ``moe_jitter`` jitters the router's
input; HF's in-place jitter of an fp32 input also reaches the experts). ``router_ignore_padding_tokens`` is
stored but unused by HF's forward, so it is not read. The decoder output is rescaled by d_model**-0.5 before a
tied head, as in T5 v1.0. The coefficients ``router_aux_loss_coef``/``router_z_loss_coef`` become
``moe_aux_loss``/``moe_z_loss``.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.SwitchTransformersModel(transformers.SwitchTransformersConfig(vocab_size=64, d_model=32,
    ...     d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4,
    ...     num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, expert_capacity=8))
    >>> cfg = lmforge.from_hf(hf).config
    >>> cfg.moe_experts, cfg.moe_every, cfg.moe_expert_capacity
    (4, 2, 8)
"""

from __future__ import annotations

import dataclasses

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule
from lmforge.interop.hf_t5 import T5


def _sparse_layers(n_layers: int, n_sparse: int) -> list[int]:
    """The layers HF's SwitchTransformersStack makes sparse (its formula, edge cases included)."""
    step = n_layers // n_sparse if n_sparse > 0 else n_layers
    return [i for i in range(n_layers) if step > 0 and (step == 1 or i % step == 1)]


def _moe_every(c: HFConfig, n_enc: int, n_dec: int) -> int | None:
    enc = _sparse_layers(n_enc, c("num_sparse_encoder_layers", 3))
    dec = _sparse_layers(n_dec, c("num_sparse_decoder_layers", 3))
    if not enc and not dec:
        return None
    for k in range(1, max(n_enc, n_dec) + 1):
        ours = ([i for i in range(n) if (i + 1) % k == 0] for n in (n_enc, n_dec))
        if list(ours) == [enc, dec]:
            return k
    raise c.fail(f"sparse layers {enc} (encoder) and {dec} (decoder) are not expressible: lmforge's moe_every k "
                 "puts experts in layers k-1, 2k-1, ... of both stacks")


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    c.require("router_dtype", ("float32",), "float32")
    c.require("router_bias", (False,), False)
    act = c("dense_act_fn", "relu")
    c.activation("dense_act_fn", "relu")  # refuses what HF's DenseActDense cannot run either (gated names)
    tied = c("tie_word_embeddings", True)
    fields = T5.config_from_hf(HFConfig({**c.data, "feed_forward_proj": act, "scale_decoder_outputs": tied},
                                              c.source), arch)
    every = _moe_every(c, fields["n_layers"], fields["n_decoder_layers"])
    if every is None:
        return {**fields, "moe_experts": 0}
    capacity = c("expert_capacity", 64)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise c.fail(f"expert_capacity {capacity!r} must be a positive integer")
    fields.update(
        moe_experts=c("num_experts", 8), moe_top_k=1, moe_every=every, moe_renormalize=False,
        moe_capacity_factor=None, moe_expert_capacity=capacity, moe_jitter=float(c("router_jitter_noise", 0.01)),
        moe_aux_loss=float(c("router_aux_loss_coef", 0.001)), moe_z_loss=float(c("router_z_loss_coef", 0.001)),
    )
    return fields


def _to_hf(cfg: ModelConfig) -> dict:
    # What Switch cannot express (top-2, a capacity factor, shared experts, ...) reads back differently, and to_hf
    # then names the first such field.
    t5 = T5.config_to_hf(cfg)
    proj = t5.pop("feed_forward_proj")
    del t5["scale_decoder_outputs"]  # implied by tying
    return dict(
        t5, dense_act_fn=proj,
        # HF's default where lmforge has a factor or no limit: it reads back as a difference, named by to_hf
        num_experts=cfg.moe_experts, expert_capacity=cfg.moe_expert_capacity or 64,
        num_sparse_encoder_layers=sum(cfg.moe_layer(i) for i in range(cfg.n_layers)),
        num_sparse_decoder_layers=sum(cfg.moe_layer(i) for i in range(cfg.decoder_layers)),
        router_bias=False, router_dtype="float32", router_jitter_noise=cfg.moe_jitter,
        router_aux_loss_coef=cfg.moe_aux_loss, router_z_loss_coef=cfg.moe_z_loss,
    )


def _rules(cfg: ModelConfig) -> list[Rule]:
    rules = [dataclasses.replace(r, theirs=r.theirs.replace("DenseReluDense", "mlp")) for r in T5.rules(cfg)]
    for stack, k in (("encoder", 1), ("decoder", 2)):
        L, M = f"{stack}.layers.{{i}}.ffn", f"{stack}.block.{{i}}.layer.{k}.mlp"
        rules += [Rule(f"{L}.router", f"{M}.router.classifier"),
                  Rule(f"{L}.experts.up", f"{M}.experts.expert_{{e}}.wi.weight", experts=True),
                  Rule(f"{L}.experts.down", f"{M}.experts.expert_{{e}}.wo.weight", experts=True)]
    return rules


SWITCH = Family(
    model_type="switch_transformers",
    architectures={"SwitchTransformersModel": Arch(), "SwitchTransformersForConditionalGeneration": Arch("lm")},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    embedding="shared.weight",
    output_embedding="lm_head.weight",
    aliases=T5.aliases,
    ignore=T5.ignore,
    tokenizer_family="t5",
)
