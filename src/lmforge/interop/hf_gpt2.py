"""GPT-2 <-> lmforge: a pre-norm decoder with learned positions, tanh-GELU and a tied LM head.

    HF (GPT2Model body)        lmforge
    wte, wpe                   embed_tokens, decoder.embed.positions
    h.i.ln_1, h.i.ln_2         decoder.layers.i.attn_norm, .ffn_norm
    h.i.attn.c_attn            decoder.layers.i.attn.{q,k,v}   (fused: split in three, transposed)
    h.i.attn.c_proj            decoder.layers.i.attn.o         (transposed)
    h.i.mlp.c_fc, .c_proj      decoder.layers.i.ffn.up, .down  (transposed)
    ln_f                       decoder.final_norm

GPT-2 computes its projections with ``Conv1D``, which stores the weight as (in, out) so the layer is
``x @ W + b``; ``nn.Linear`` stores (out, in). Every 2-D projection weight is therefore transposed, and
``c_attn``'s (D, 3D) output columns are the query, key and value projections side by side.

``scale_attn_by_inverse_layer_idx`` (Mistral's GPT-2 runs, for fp16 stability) divides layer i's logits by
i + 1 on top of 1/sqrt(hd): ModelConfig ``attn_scale_by_layer``.

Example:
    >>> import transformers, lmforge
    >>> hf = transformers.GPT2Model(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> lmforge.from_hf(hf).config.activation
    'gelu-tanh'
"""

from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.interop.hf_family import Arch, Family, HFConfig, Rule, hf_activation


def _from_hf(c: HFConfig, arch: Arch) -> dict:
    c.require("scale_attn_weights", (True,), True)
    c.require("add_cross_attention", (False,), False)
    d_model = c("n_embd", 768)
    return dict(
        arch="decoder", position="learned", norm="layernorm", norm_position="pre", final_norm=True, bias=True,
        vocab_size=c("vocab_size", 50257), d_model=d_model, n_heads=c("n_head", 12), n_layers=c("n_layer", 12),
        d_ff=c("n_inner", None) or 4 * d_model, max_seq_len=c("n_positions", 1024),
        layer_norm_eps=c("layer_norm_epsilon", 1e-5), activation=c.activation("activation_function", "gelu_new"),
        dropout=c("resid_pdrop", 0.1), attn_dropout=c("attn_pdrop", 0.1),
        initializer_range=c("initializer_range", 0.02),
        attn_scale_by_layer=bool(c("scale_attn_by_inverse_layer_idx", False)),
    )


def _to_hf(cfg: ModelConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_head=cfg.n_heads, n_layer=cfg.n_layers, n_inner=cfg.d_ff,
        n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.layer_norm_eps,
        activation_function=hf_activation(cfg.activation), resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.attn_dropout, initializer_range=cfg.initializer_range,
        scale_attn_by_inverse_layer_idx=cfg.attn_scale_by_layer,
    )


def _rules(cfg: ModelConfig) -> list[Rule]:
    L, H = "decoder.layers.{i}", "h.{i}"
    return [
        Rule("embed_tokens", "wte"),
        Rule("decoder.embed.positions", "wpe"),
        Rule(f"{L}.attn_norm", f"{H}.ln_1"),
        *(Rule(f"{L}.attn.{p}", f"{H}.attn.c_attn", conv1d=True, part=(k, 3)) for k, p in enumerate("qkv")),
        Rule(f"{L}.attn.o", f"{H}.attn.c_proj", conv1d=True),
        Rule(f"{L}.ffn_norm", f"{H}.ln_2"),
        Rule(f"{L}.ffn.up", f"{H}.mlp.c_fc", conv1d=True),
        Rule(f"{L}.ffn.down", f"{H}.mlp.c_proj", conv1d=True),
        Rule("decoder.final_norm", "ln_f"),
        Rule("lm_head.weight", "lm_head.weight"),
    ]


# Same fields as the other families' declarations, with this family's values: a table, not repeated logic.
GPT2 = Family(
    model_type="gpt2",
    architectures={"GPT2Model": Arch(), "GPT2LMHeadModel": Arch("lm", True)},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    rules=_rules,
    prefix="transformer.",
    embedding="wte.weight",
    output_embedding="lm_head.weight",
    ignore=(r"h\.\d+\.attn\.(bias|masked_bias)",),  # causal-mask buffers of older checkpoints
    tokenizer_family="gpt",
)
