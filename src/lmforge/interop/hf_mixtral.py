"""Mixtral <-> lmforge: Llama (see :mod:`~lmforge.interop.hf_llama`) with a sparse MoE FFN in every layer.

    HF (saved; MixtralModel body)                       lmforge
    layers.i.block_sparse_moe.gate                      decoder.layers.i.ffn.router          (E, D)
    layers.i.block_sparse_moe.experts.e.w1 (gate)       decoder.layers.i.ffn.experts.gate[e]  (F, D)
    layers.i.block_sparse_moe.experts.e.w3 (up)         decoder.layers.i.ffn.experts.up[e]    (F, D)
    layers.i.block_sparse_moe.experts.e.w2 (down)       decoder.layers.i.ffn.experts.down[e]  (D, F)
    everything else                                     as Llama

transformers 5 holds the experts fused in memory (``mlp.gate``, ``mlp.experts.gate_up_proj`` (E, 2F, D) with
the gate rows first, ``mlp.experts.down_proj`` (E, D, F)) and saves the per-expert layout above; both are read,
the saved one is written.

Routing is HF's exactly: softmax over all experts in fp32, top-``num_experts_per_tok``, renormalised; no
capacity limit. ``router_jitter_noise`` (training only) becomes ``moe_jitter``, which jitters the router's input
only (HF also jitters the experts' input). HF's load-balancing loss normalises by tokens, not slots, so
``router_aux_loss_coef`` = ``moe_aux_loss / top_k``; Mixtral has no z-loss. ``sliding_window`` is refused.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(vocab_size=64, hidden_size=32,
    ...     intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
    ...     num_local_experts=4, num_experts_per_tok=2))
    >>> cfg = lmforge.from_hf(hf).config
    >>> cfg.moe_experts, cfg.moe_top_k, cfg.moe_renormalizes
    (4, 2, True)
"""

from __future__ import annotations

import re

import torch

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule
from lmforge.interop.hf_llama import LLAMA

_FUSED = re.compile(r"(?P<layer>.*layers\.\d+\.)mlp\.(?P<what>gate\.weight|experts\.gate_up_proj|experts\.down_proj)$")


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    c.require("sliding_window", (None,))
    k, experts = c("num_experts_per_tok", 2), c("num_local_experts", 8)
    if experts < 1:
        raise c.fail(f"num_local_experts {experts!r} must be positive")
    fields = LLAMA.config_from_hf(c, arch)
    fields.update(
        bias=False,  # Mixtral's projections have no biases (and its config no attention_bias)
        moe_experts=experts, moe_top_k=k, moe_every=1, moe_renormalize=True,
        moe_capacity_factor=None, moe_expert_capacity=None, moe_jitter=float(c("router_jitter_noise", 0.0)),
        moe_aux_loss=float(c("router_aux_loss_coef", 0.001)) * k, moe_z_loss=0.0,
    )
    return fields


def _to_hf(cfg: ModelConfig) -> dict:
    # What Mixtral cannot express (biases, moe_every > 1, capacity, ...) reads back differently, and to_hf then
    # names the first such field.
    hf = {k: v for k, v in LLAMA.config_to_hf(cfg).items() if k not in ("attention_bias", "mlp_bias")}
    hf.update(num_local_experts=cfg.moe_experts, num_experts_per_tok=cfg.moe_top_k, sliding_window=None,
              router_jitter_noise=cfg.moe_jitter, router_aux_loss_coef=cfg.moe_aux_loss / cfg.moe_top_k)
    return hf


def _rules(cfg: ModelConfig) -> list[Rule]:
    L, H = "decoder.layers.{i}", "layers.{i}.block_sparse_moe"
    dense = [r for r in LLAMA.rules(cfg) if ".ffn." not in r.ours]
    return dense + [
        Rule(f"{L}.ffn.router", f"{H}.gate"),
        *(Rule(f"{L}.ffn.experts.{ours}", f"{H}.experts.{{e}}.{theirs}.weight", experts=True)
          for ours, theirs in (("gate", "w1"), ("up", "w3"), ("down", "w2"))),
    ]


def _unfuse(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's in-memory layout -> the saved one."""
    out = {}
    for name, t in tensors.items():
        m = _FUSED.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        moe = m["layer"] + "block_sparse_moe."
        if m["what"] == "gate.weight":
            out[moe + "gate.weight"] = t
            continue
        for e, expert in enumerate(t.unbind(0)):
            if m["what"] == "experts.down_proj":
                out[f"{moe}experts.{e}.w2.weight"] = expert
            else:
                gate, up = expert.chunk(2, dim=0)
                out[f"{moe}experts.{e}.w1.weight"], out[f"{moe}experts.{e}.w3.weight"] = gate, up
    return out


MIXTRAL = Family(
    model_type="mixtral",
    architectures={"MixtralModel": Arch(), "MixtralForCausalLM": Arch("lm", True)},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    prefix="model.",
    embedding="embed_tokens.weight",
    output_embedding="lm_head.weight",
    ignore=LLAMA.ignore,
    tokenizer_family=None,
    tie_default=False,
    unfuse=_unfuse,
)
