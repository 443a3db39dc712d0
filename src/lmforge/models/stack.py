"""A stack of Transformer layers: the encoder, or the decoder (causal, optionally cross-attending).

The stack turns token vectors into contextual vectors. It builds the positional signals and the
attention mask once per forward and hands them to every layer through an AttentionContext:

    tokens (B, T, E) -> embeddings -> layer_1 ... layer_N -> final norm -> (B, T, D)

A training forward of a padded batch runs the layers padding-free (:mod:`lmforge.nn.unpadding`): on the
(N, D) real tokens only, laid out as (B, T, ...) inside attention alone.

With ``share_layers`` (ALBERT) one layer's weights serve every depth (of the encoder, the decoder or both). Adding ``step_embeddings`` makes it
the Universal Transformer's recurrence in depth (Dehghani et al. 2019): before step t the stack adds a
sinusoidal signal of t (the paper's timestep coordinate embedding), so the one shared layer knows how
deep it is. The paper's adaptive computation time (a halting unit per position) is not included: every
position takes ``n_layers`` steps.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10, n_layers=2)
    >>> stack = TransformerStack(cfg, n_layers=2, causal=True)
    >>> h, _ = stack(torch.randn(2, 5, 32))
    >>> h.shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.attention import AttentionContext
from lmforge.nn.block import Block
from lmforge.nn.embeddings import StackEmbeddings
from lmforge.nn.evolved import evolved_block
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.masks import build_mask
from lmforge.nn.moe import MoEFeedForward
from lmforge.nn.norms import build_norm
from lmforge.nn.positions.alibi import ALiBi
from lmforge.nn.positions.deberta import RelativeEmbeddings
from lmforge.nn.positions.rope import RotaryEmbedding
from lmforge.nn.positions.sinusoidal import sinusoidal_table
from lmforge.nn.positions.t5_bias import T5RelativeBias
from lmforge.nn.transparent_attention import TransparentMix
from lmforge.nn.unpadding import Unpadded


class TransformerStack(nn.Module):
    def __init__(self, cfg: ModelConfig, n_layers: int, causal: bool, cross: bool = False):
        super().__init__()
        self.causal = causal
        self.window = cfg.sliding_window if causal else None  # Mistral: each query sees its last W keys
        self.n_layers = n_layers
        self.position = cfg.position
        self.embed = StackEmbeddings(cfg)
        self.rel_bias = (
            T5RelativeBias(cfg.n_heads, not causal, cfg.t5_num_buckets, cfg.t5_max_distance)
            if cfg.position == "t5-bias"
            else None
        )
        self.alibi = ALiBi(cfg.n_heads) if cfg.position == "alibi" else None
        # DeBERTa's relative-position table: one per stack, read by every layer.
        self.relative_positions = RelativeEmbeddings(cfg) if cfg.position == "deberta" else None
        self.rope = (
            RotaryEmbedding(cfg.dim_per_head, cfg.rope_theta, int(cfg.dim_per_head * cfg.rotary_pct))
            if cfg.position == "rope"
            else None
        )
        shared = cfg.layers_shared("decoder" if causal else "encoder")
        layer = evolved_block if cfg.block == "evolved" else Block  # So et al. 2019's searched layers (C1)
        self.layers = nn.ModuleList(layer(cfg, cross, moe=cfg.moe_layer(i), pkm=cfg.pkm_layer(i), causal=causal)
                                    for i in range(1 if shared else n_layers))
        # Expert capacity counts every token the router sees, padding included: packing would change it.
        self.padding_free = not any(isinstance(block.ffn, MoEFeedForward) for block in self.layers)
        if cfg.attn_scale_by_layer:  # GPT-2's scale_attn_by_inverse_layer_idx: layer i's logits / (i + 1)
            for i, block in enumerate(self.layers):
                block.attn.scale /= i + 1
        self.register_buffer(  # (L, D): the Universal Transformer's timestep signal, added before each step
            "step_signal", torch.empty(n_layers, cfg.d_model) if cfg.step_embeddings else None, persistent=False
        )
        self.reset_buffers()
        # Transparent attention (Bapna et al. 2018): each decoder layer's own mix of the encoder's N + 1 states.
        self.transparent = TransparentMix(cfg.n_layers + 1, n_layers) if cross and cfg.transparent_attention else None
        self.final_norm = build_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.bias) if cfg.final_norm else None

    def reset_buffers(self) -> None:
        """Recompute the derived step signal (checkpoints do not store it)."""
        if self.step_signal is not None and not self.step_signal.is_meta:  # meta: materialise() fills it
            self.step_signal.copy_(sinusoidal_table(*self.step_signal.shape))

    def packing(self, padding: torch.Tensor | None) -> Unpadded | None:
        """How a training forward (gradients on, no cache, not compiled) lays out the layers' rows for this (B, T)
        padding mask: packed (:mod:`lmforge.nn.unpadding`), or None for the padded (B, T)."""
        if not (self.padding_free and self.training and isinstance(padding, torch.Tensor) and padding.dim() == 2):
            return None
        return Unpadded.if_worth_it(padding)

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        output_hidden_states: bool = False,
        attentions: list[torch.Tensor] | None = None,
        cross_attentions: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Contextualise token vectors.

        Args:
            tokens: (B, T, E) token embeddings (looked up by the model).
            attention_mask: (B, T) or (B, S) with 1 for real tokens, or a complete (B, T, S) bool mask.
            token_type_ids: (B, T) segment ids, for models with segment embeddings.
            position_ids: (B, T) absolute positions; default: cached length + 0..T-1.
            memory: (B, S_src, D) encoder output, for cross-attention; (B, S_src, N + 1, D), every encoder
                state, with ``transparent_attention`` (:mod:`lmforge.nn.transparent_attention`).
            memory_mask: (B, S_src) with 1 for real source tokens.
            cache: KV cache to read and extend (incremental decoding).
            output_hidden_states: also return the input of every layer and the final output.
            attentions, cross_attentions: lists to append each layer's attention weights (B, H, T, S) to.

        Returns:
            (B, T, D) hidden states, and the list of N+1 hidden states when asked.
        """
        B, T, _ = tokens.shape
        device = tokens.device
        past = cache.seq_len() if cache is not None else 0
        S = past + T
        offset = cache.offset() if cache is not None else 0  # a sliding-window cache keeps positions offset.. only
        if position_ids is None:
            position_ids = torch.arange(past, S, device=device)[None]  # (1, T)
        x = self.embed(tokens, position_ids, token_type_ids)  # (B, T, D)

        explicit = attention_mask if attention_mask is not None and attention_mask.dim() == 3 else None
        padding = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        bias = q_pos = k_pos = rel_index = rel_embeddings = None
        logit_terms = self.position in ("relative", "deberta")  # relative schemes whose bias each layer computes
        if self.rel_bias is not None or self.alibi is not None or logit_terms:
            # Only relative schemes need these; skipping them keeps the one-token decode step short.
            q_pos, k_pos = torch.arange(past, S, device=device), torch.arange(offset, S, device=device)
        if self.rel_bias is not None:
            bias = self.rel_bias(q_pos, k_pos)  # (1, H, T, S)
        elif self.alibi is not None:
            bias = self.alibi(q_pos, k_pos)
        if self.position == "relative":
            rel_index = self.layers[0].attn.relative.indices(q_pos, k_pos)
        elif self.relative_positions is not None:
            rel_embeddings, rel_index = self.relative_positions(q_pos, k_pos)  # (2k, D), (T, S)
        has_bias = bias is not None or logit_terms
        windowed = self.window is not None and S - offset > self.window
        plain_causal = self.causal and explicit is None and T == S and not has_bias and not windowed
        no_padding = padding is None or (not torch.compiler.is_compiling() and bool(padding.bool().all()))
        if plain_causal and no_padding:
            mask, is_causal = None, True  # SDPA's built-in causal kernel, no mask tensor at all
        else:
            mask = build_mask(T, S - offset, self.causal, padding, explicit, device, window=self.window)
            is_causal = False
        unpadded = None
        if (explicit is None and cache is None and torch.is_grad_enabled() and not torch.compiler.is_compiling()
                and not no_padding):
            unpadded = self.packing(padding)  # the layers skip the padding (lmforge.nn.unpadding)
        ctx = AttentionContext(
            mask=mask,
            is_causal=is_causal,
            bias=bias,
            rope=self.rope(position_ids) if self.rope is not None else None,
            rel_index=rel_index,
            rel_embeddings=rel_embeddings,
            cache=cache,
            cross_mask=memory_mask.bool()[:, None, None, :] if memory_mask is not None else None,
            attentions=attentions,
            cross_attentions=cross_attentions,
            unpadded=unpadded,
        )

        hidden = [x] if output_hidden_states else None
        if unpadded is not None:
            x = unpadded.pack(x)  # (N, D)
        run = getattr(cache, "run_layer", None)  # a compiled step's one compiled layer (StaticKVCache)
        for i in range(self.n_layers):
            layer = self.layers[0 if len(self.layers) == 1 else i]
            if self.step_signal is not None:
                x = x + self.step_signal[i].to(x.dtype)
            layer_memory = memory
            if self.transparent is not None and not (cache is not None and i in cache.cross):  # else K, V cached
                layer_memory = self.transparent(memory, i)  # (B, S, N + 1, D) -> (B, S, D)
            x = layer(x, ctx, layer_memory, layer=i) if run is None else run(layer, x, ctx, i)
            if hidden is not None:
                hidden.append(ctx.padded(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden is not None:
                hidden[-1] = ctx.padded(x)
        return ctx.padded(x), hidden
