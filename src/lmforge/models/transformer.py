"""The lmforge Transformer: encoder-only, decoder-only or encoder-decoder, from one ModelConfig.

    encoder          ids -> embed -> [bidirectional stack] -> MLM head / pooler      (BERT, RoBERTa)
    decoder          ids -> embed -> [causal stack]        -> LM head                (GPT-2, Llama)
    encoder-decoder  src -> embed -> [encoder] ----------------.
                     tgt -> embed -> [causal stack + cross-attn] -> LM head          (T5, BART)

Forward contract (tasks, PEFT, generation and the Trainer rely on it)::

    out = model(input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None,
                decoder_attention_mask=None, past_key_values=None, use_cache=False, labels=None)
    out.logits              (B, T, V)   (decoder logits for encoder-decoder models; (B, T) for head="rtd")
    out.last_hidden_state   (B, T, D)
    out.hidden_states       [N+1 x (B, T, D)] when output_hidden_states=True
    out.past_key_values     KVCache when use_cache=True
    out.loss                mean cross-entropy over labels != -100, when labels are given
                            (label-smoothed when ``model.label_smoothing`` = eps > 0 in training mode; in
                            eval mode always the plain cross-entropy, so evaluation reports it)
                            (with label_weights (B, T): sum of weight * cross-entropy over them instead);
                            head="rtd" (ELECTRA's discriminator): binary cross-entropy, labels 1 = replaced;
                            an MoE model in training mode adds out.aux_loss to it
    out.aux_loss            MoE, training mode: moe_aux_loss * L_aux + moe_z_loss * L_z (see lmforge.nn.moe)
    out.n_targets           how many labels out.loss is a mean over (a 0-dim tensor, and out.logits every
                            position's, when a compiled forward keeps the loss in its graph: _loss_in_graph)
    out.nsp_logits          (B, 2) IsNext/NotNext logits, when the model has an NSP head (nsp_head=True)
    out.attentions          [N x (B, H, T, S)] softmax weights when output_attentions=True (alias
                            return_attentions); encoder-decoders add out.encoder_attentions and
                            out.cross_attentions. Asking for them writes the softmax out instead of SDPA's
                            fused kernel; without them the forward is unchanged.
                            ``output_attentions="scores"``: the scores before the softmax instead
                            (Q K^T * scale + bias, masked entries at the mask's value; TinyBERT's targets)

Next sentence prediction (BERT). With ``next_sentence_label`` (B,) (0 = IsNext, 1 = NotNext, -100 = none)
the loss is HF ``BertForPreTraining``'s: ``out.loss = MLM mean CE + NSP mean CE`` (NSP alone without
``labels``). The two means are over different things (masked tokens, pairs), so ``out.n_targets`` (the
masked tokens) cannot weigh their sum in a gradient-accumulated mean. ``out.loss_terms`` therefore lists
each term with the batch key of its labels, and the Trainer weighs every term by its own count over the
whole accumulated batch (see :mod:`lmforge.training.trainer`): the update of ``grad_accum=k, batch=b`` is
that of ``grad_accum=1, batch=k*b``, whose loss is exactly HF's sum of the two means.

``labels`` are aligned with the predictions (the model does not shift them): the loss is
CE(logits[:, t], labels[:, t]). With labels, logits are computed only at the labelled positions and
returned flat as (N, V): an MLM batch projects 15% of the tokens to the vocabulary instead of all of
them. For an encoder-decoder model without ``decoder_input_ids``, they are ``labels`` shifted right.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> model = Transformer(ModelConfig.from_preset("gpt-tiny"))
    >>> ids = torch.randint(0, 8192, (2, 16))
    >>> model(ids).logits.shape
    torch.Size([2, 16, 8192])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lmforge import generation, model_folder
from lmforge.config import ModelConfig
from lmforge.models.heads import LMHead, MLMHead, NSPHead, Pooler, RTDHead
from lmforge.models.funnel import FunnelStack
from lmforge.models.stack import TransformerStack
from lmforge.nn.adaptive_input import AdaptiveInput
from lmforge.nn.adaptive_softmax import AdaptiveSoftmax
from lmforge.nn.compile_disable import compile_disable
from lmforge.nn.init import embedding, normal_
from lmforge.nn.attention import ScoreRecord
from lmforge.nn.block import Block
from lmforge.nn.fixup import fixup_init, residual_branches
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.labels import IGNORE_INDEX, shift_right
from lmforge.nn.evolved import SeparableConv
from lmforge.nn.lightconv import LightweightConv
from lmforge.nn.linformer import LinformerProjection
from lmforge.nn.loss import cross_entropy
from lmforge.nn.mixture_of_softmaxes import MixtureOfSoftmaxes
from lmforge.nn.moe import Experts, clear_router_losses, moe_layers, moe_stats, router_loss
from lmforge.nn.product_key_memory import ProductKeyMemory
from lmforge.nn.row_buckets import with_spare_rows
from lmforge.nn.synthesizer import SynthesizerAttention
from lmforge.nn.weighted import WeightedBranches
from lmforge.nn.transparent_attention import stack_states
from lmforge.nn.weight_only import WeightOnlyEmbedding
from lmforge.errors import UserInputError


@dataclass
class LossTerm:
    """One term of a summed loss, which adds ``weight * loss``.

    ``loss`` is the mean over the term's targets, which ``batch[labels_key]`` marks: its entries that are not
    -100, or, with ``mask=True``, its nonzero entries (``"attention_mask"``: every real token, for labels the
    model makes itself, such as ELECTRA's replaced/original ones). The Trainer counts them there, in every
    micro-batch, before any backward. ``logits`` score the n targets, flat in row-major order ((n, C), or (n,)
    for one binary logit each, > 0 meaning 1), against ``labels`` (default ``batch[labels_key]``; a mask term
    gives the labels it made, -100 off the mask), for an accuracy.
    """

    name: str
    labels_key: str
    loss: torch.Tensor
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    mask: bool = False
    weight: float = 1.0


@dataclass
class ModelOutput:
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: list[torch.Tensor] | None = None
    past_key_values: KVCache | None = None
    loss: torch.Tensor | None = None
    n_targets: int | torch.Tensor | None = None  # labelled tokens behind ``loss`` (token-weighted accumulation)
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_hidden_states: list[torch.Tensor] | None = None
    pooler_output: torch.Tensor | None = None
    nsp_logits: torch.Tensor | None = None  # (B, 2), HF's seq_relationship_logits
    loss_terms: list[LossTerm] | None = None  # the terms of ``loss`` when it sums means over different labels
    aux_loss: torch.Tensor | None = None  # MoE router losses (weighted) included in ``loss``, training mode only
    # Attention maps, when asked for (output_attentions=True): one (B, H, T, S) tensor per layer.
    attentions: list[torch.Tensor] | None = None  # self-attention (the decoder's, for an encoder-decoder)
    encoder_attentions: list[torch.Tensor] | None = None
    cross_attentions: list[torch.Tensor] | None = None


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        cfg = self.config = config.validate()
        self.embed_tokens = token_table(cfg)
        self.encoder = self.decoder = None
        self.decoder_embed_tokens = None
        if cfg.arch in ("encoder", "encoder-decoder"):
            self.encoder = FunnelStack(cfg) if cfg.funnel_blocks else TransformerStack(cfg, cfg.n_layers, causal=False)
        if cfg.arch == "decoder":
            self.decoder = TransformerStack(cfg, cfg.n_layers, causal=True)
        elif cfg.arch == "encoder-decoder":
            self.decoder = TransformerStack(cfg, cfg.decoder_layers, causal=True, cross=True)
            if not cfg.share_embeddings:
                self.decoder_embed_tokens = token_table(cfg)
            if cfg.share_encoder_decoder:
                share_blocks(self.encoder, self.decoder)
        self.lm_head = self.mlm_head = self.rtd_head = self.pooler = None
        if cfg.head == "lm" and (cfg.adaptive_softmax_cutoffs or cfg.mos_experts):
            self.lm_head = softmax_layer(cfg)  # Narang et al.'s rows: adaptive softmax, mixture of softmaxes
        elif cfg.head == "lm":
            self.lm_head = LMHead(
                cfg.d_model, cfg.vocab_size, cfg.embed_dim, cfg.tie_embeddings, cfg.lm_head_bias, cfg.lm_head_scale
            )
        elif cfg.head == "mlm":
            self.mlm_head = MLMHead(
                cfg.d_model, cfg.vocab_size, cfg.embed_dim, cfg.mlm_head_activation, cfg.norm,
                cfg.layer_norm_eps, cfg.tie_embeddings,
            )
        elif cfg.head == "rtd":
            self.rtd_head = RTDHead(cfg.d_model, cfg.activation)
        if cfg.pooler:
            self.pooler = Pooler(cfg.d_model)
        self.nsp_head = NSPHead(cfg.d_model) if cfg.nsp_head else None
        self.label_smoothing = 0.0  # eps of the token cross-entropy (a training setting, not saved)
        self.loss_in_graph: bool | None = None  # a compiled forward's loss over every position (see _loss_in_graph)
        self.reset_parameters()

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), with residual output projections scaled by 1/sqrt(2L) so
        the residual stream's variance does not grow with depth.

        Models with unscaled attention logits (``attn_scale=False``: T5) get Mesh-TF/T5's scheme instead,
        which folds the 1/sqrt(d) into the weights (see :meth:`_t5_std`)."""
        t5 = not self.config.attn_scale
        linear_std = self._t5_std if t5 else self._gpt2_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                normal_(module.weight, std=linear_std(name, module))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Experts):  # stacked (E, out, in) weights: each expert like its dense twin
                for pname, p in module.named_parameters(recurse=False):
                    if pname.endswith("bias"):
                        nn.init.zeros_(p)
                    else:
                        normal_(p, std=linear_std(f"{name}.{pname}", p))
            elif isinstance(module, nn.Embedding):
                normal_(module.weight, std=self._embedding_std(name, t5))
            elif isinstance(module, nn.LayerNorm):
                if module.weight is not None:
                    nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (LinformerProjection, ProductKeyMemory, SynthesizerAttention, WeightedBranches)):
                module.reset_parameters()
            elif isinstance(module, (LightweightConv, SeparableConv)):  # convolution kernels' own init (C1)
                module.reset_parameters()
            elif isinstance(module, Block) and module.rezero is not None:
                nn.init.zeros_(module.rezero)  # ReZero: every layer starts as the identity
        cfg = self.config
        if cfg.fixup:  # Fixup rescales the init just drawn (lmforge.nn.fixup)
            fixup_init(self, residual_branches(cfg.arch, cfg.n_layers, cfg.decoder_layers))

    def _embedding_std(self, name: str, t5: bool) -> float:
        """N(0, 1) for T5; with ``scale_embeddings`` the token table of Vaswani et al. (and fairseq): N(0, 1/d),
        which the sqrt(d) scale in the forward brings to unit size, on a par with the sinusoids it is added to
        (at GPT-2's 0.02 the fixed sinusoids, of amplitude 1, would swamp the token identities); else GPT-2's."""
        if t5:
            return 1.0
        if name == "embed_tokens" and self.config.scale_embeddings:
            return self.config.d_model ** -0.5
        return self.config.initializer_range

    def _gpt2_std(self, name: str, module: nn.Linear) -> float:
        cfg = self.config
        depth = cfg.n_layers + (cfg.decoder_layers if cfg.arch == "encoder-decoder" else 0)
        scaled = name.endswith(("attn.o", "ffn.down", "experts.down"))
        return cfg.initializer_range / math.sqrt(2 * depth) if scaled else cfg.initializer_range

    def _t5_std(self, name: str, module: nn.Linear) -> float:
        """T5's initialisation (Mesh TensorFlow, as in HF ``T5PreTrainedModel._init_weights``, factor 1):
        token embeddings N(0, 1); q N(0, (d_model * d_kv)^-0.5), k/v N(0, d_model^-0.5), o N(0, (H d_kv)^-0.5);
        FFN in N(0, d_model^-0.5), out N(0, d_ff^-0.5).

        The GPT-2 scheme is wrong here: with unscaled logits, q.k from N(0, 0.02) weights is ~0, so every
        attention is uniform, and N(0, 0.02) embeddings (norm ~0.3) are swamped by the ReLU FFNs' shared
        output direction, so the encoder's output barely depends on its input and the decoder learns to
        ignore it."""
        cfg = self.config
        d, hd = cfg.d_model, cfg.dim_per_head
        if name.endswith("attn.q"):
            return (d * hd) ** -0.5
        if name.endswith(("attn.k", "attn.v", "ffn.up", "ffn.gate", "experts.up", "experts.gate")):
            return d**-0.5
        if name.endswith("attn.o"):
            return (cfg.n_heads * hd) ** -0.5
        if name.endswith(("ffn.down", "experts.down")):
            return cfg.d_ff**-0.5
        return module.in_features**-0.5

    # ------------------------------------------------------------------ helpers
    @property
    def output_embedding(self) -> torch.Tensor | WeightOnlyEmbedding:
        """The (V, E) matrix a tied head multiplies by (the table itself once it is quantised)."""
        emb = self.decoder_embed_tokens if self.decoder_embed_tokens is not None else self.embed_tokens
        return emb if isinstance(emb, WeightOnlyEmbedding) else getattr(emb, "weight", None)  # None: banded (adaptive)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        if self.mlm_head is not None:
            return self.mlm_head(h, self.embed_tokens.weight)
        if self.lm_head is not None:
            return self.lm_head(h, self.output_embedding)
        if self.rtd_head is not None:
            return self.rtd_head(h)
        raise UserInputError(f"model {self.config.name!r} has head='none': it produces hidden states, not logits")

    def encode(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        attentions: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Run the encoder stack: (B, S) ids -> (B, S, D) states (and all layers when asked; each layer's attention
        weights appended to ``attentions`` when given). With ``transparent_attention`` the states are all N + 1
        of them, (B, S, N + 1, D): the memory the decoder reads (:mod:`lmforge.nn.transparent_attention`)."""
        if self.encoder is None:
            raise UserInputError(f"model {self.config.name!r} (arch={self.config.arch}) has no encoder")
        if self.config.moe_experts:
            clear_router_losses(self.encoder)
        tokens = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if self.config.transparent_attention:
            _, hidden = self.encoder(tokens, attention_mask, token_type_ids, position_ids,
                                     output_hidden_states=True, attentions=attentions)
            return stack_states(hidden), (hidden if output_hidden_states else None)
        return self.encoder(tokens, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, attentions=attentions)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        label_weights: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_attentions: bool | str = False,
        return_attentions: bool = False,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """See the module docstring. ``encoder_hidden_states`` (B, S, D) skips re-running the encoder
        (generation); ``inputs_embeds`` (B, T, E) replaces the token lookup (prompt tuning);
        ``label_weights`` (B, T) weighs each label's cross-entropy in a summed loss (an example-averaged
        loss, say), read only where ``labels`` != -100; ``next_sentence_label`` (B,) adds BERT's NSP loss;
        ``logits_to_keep`` = n > 0 computes the logits of the last n positions only, (B, n, V) (HF's argument of the
        name): a prompt's decoding needs the last one, and the vocabulary projection over every position of a
        32-token prompt is a third of its forward."""
        cfg = self.config
        out = ModelOutput()
        if cfg.moe_experts:
            clear_router_losses(self)
        cache = past_key_values if past_key_values is not None else (KVCache(window=cfg.sliding_window) if use_cache else None)
        maps = output_attentions or return_attentions
        if maps:
            record = ScoreRecord if output_attentions == "scores" else list
            out.attentions = record()
            if cfg.arch == "encoder-decoder":
                out.encoder_attentions = record() if encoder_hidden_states is None else None
                out.cross_attentions = record()
        if cfg.arch == "encoder":
            h, out.hidden_states = self.encode(
                input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_hidden_states,
                out.attentions,
            )
            if self.pooler is not None:
                out.pooler_output = self.pooler(h)
        elif cfg.arch == "decoder":
            tokens = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            h, out.hidden_states = self.decoder(
                tokens, attention_mask, token_type_ids, position_ids, cache=cache,
                output_hidden_states=output_hidden_states, attentions=out.attentions,
            )
        else:
            memory = encoder_hidden_states
            if memory is None:
                memory, out.encoder_hidden_states = self.encode(
                    input_ids, attention_mask, token_type_ids, None, inputs_embeds, output_hidden_states,
                    out.encoder_attentions,
                )
            out.encoder_last_hidden_state = memory[:, :, -1] if memory.dim() == 4 else memory  # transparent: all
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                if labels is None:
                    raise ValueError("an encoder-decoder forward needs decoder_input_ids (or labels to shift)")
                decoder_input_ids = shift_right(labels, self._decoder_start_id(), cfg.pad_token_id or 0)
            if decoder_inputs_embeds is None:
                table = self.decoder_embed_tokens if self.decoder_embed_tokens is not None else self.embed_tokens
                decoder_inputs_embeds = table(decoder_input_ids)
            memory_mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
            h, out.hidden_states = self.decoder(
                decoder_inputs_embeds, decoder_attention_mask, None, position_ids, memory, memory_mask, cache,
                output_hidden_states, out.attentions, out.cross_attentions,
            )
        out.last_hidden_state = h
        out.past_key_values = cache if use_cache else None
        if cfg.moe_experts:
            out.aux_loss = router_loss(self, cfg.moe_aux_loss, cfg.moe_z_loss)
        if self.nsp_head is not None:
            out.nsp_logits = self.nsp_head(out.pooler_output)  # (B, 2)
        if cfg.head != "none":
            if labels is None:
                out.logits = self._head(h if logits_to_keep <= 0 else h[:, -logits_to_keep:])  # (B, T | n, V)
            else:
                if label_weights is not None and label_weights.shape != labels.shape:
                    raise ValueError(f"label_weights has shape {tuple(label_weights.shape)}; "
                                     f"labels have {tuple(labels.shape)}")
                compiling = torch.compiler.is_compiling()
                if compiling and self._loss_in_graph(h, label_weights):
                    out.logits, out.loss, out.n_targets = self._every_position_loss(h, labels)
                else:
                    out.logits, out.loss, out.n_targets = self._labelled_loss(h, labels, compiling, label_weights)
        if next_sentence_label is not None:
            self._add_nsp_loss(out, next_sentence_label)
        if out.aux_loss is not None and out.loss is not None:
            out.loss = out.loss + out.aux_loss
            if out.loss_terms:  # the router losses ride on the token term, weighted by its share of the batch
                out.loss_terms[0].loss = out.loss_terms[0].loss + out.aux_loss
        return out

    @compile_disable  # selecting the labelled pairs has a data-dependent shape, as in _labelled_loss
    def _add_nsp_loss(self, out: ModelOutput, label: torch.Tensor) -> None:
        """NSP mean CE over the pairs with label != -100, added to ``out.loss`` as HF does (see module doc)."""
        if out.nsp_logits is None:
            raise UserInputError(f"model {self.config.name!r} has no NSP head: next_sentence_label needs "
                                 "nsp_head=True (with pooler=True)")
        valid = label != IGNORE_INDEX  # (B,)
        nsp = cross_entropy(out.nsp_logits[valid], label[valid])
        if out.loss is None:  # NSP alone: a mean over the pairs
            out.loss, out.n_targets = nsp, int(valid.sum())
            return
        out.loss_terms = [LossTerm("tokens", "labels", out.loss, out.logits),
                          LossTerm("nsp", "next_sentence_label", nsp, out.nsp_logits[valid])]
        out.loss = out.loss + nsp

    # Selecting the labelled rows has a data-dependent shape, which torch.compile cannot trace
    # without a break; excluding this method keeps the whole body in one compiled graph, and the
    # head's matmul runs just as fast eagerly. A compiled model asks for the fused (compiled) loss.
    @compile_disable
    def _labelled_loss(
        self, h: torch.Tensor, labels: torch.Tensor, fused: bool = False, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """h (B, T, D), labels (B, T), weights (B, T) or None -> logits (N, V) at labelled positions, the
        mean CE (or the weighted sum), N."""
        selected = labels != -100  # (B, T)
        # Causal LM labels every position: then a view, where indexing would copy (and scatter back).
        every = bool(selected.all())
        # Otherwise the labelled rows, then unlabelled ones up to a bucketed count (lmforge.nn.row_buckets): the
        # head's matrix multiplies then meet a few shapes per job, not a new one for every step's masking.
        index = None if every else with_spare_rows(selected)
        n = int(selected.sum())

        def at_labels(t: torch.Tensor) -> torch.Tensor:  # (B, T, ...) -> (N', ...)
            return t.flatten(0, 1) if every else t.flatten(0, 1).index_select(0, index)

        target = at_labels(labels)[:n]
        weights = None if weights is None else at_labels(weights)[:n]
        logits = self._head(at_labels(h))[:n]  # (N, V): only labelled positions (and spares) reach the vocabulary
        if self.rtd_head is not None:  # (N,) replaced/original logits against 0/1 labels
            if bool((target > 1).any()):
                raise UserInputError(f"model {self.config.name!r} has head='rtd' (ELECTRA's discriminator): its labels "
                                     "are 0 (original) / 1 (replaced), not token ids; pre-train it with objective "
                                     "'electra', or fine-tune it")
            loss = F.binary_cross_entropy_with_logits(logits.float(), target.float(), weight=weights,
                                                      reduction="mean" if weights is None else "sum")
            return logits, loss, int(target.numel())
        # Smoothing is a training target: in eval mode the loss (and a run's eval_loss, eval_ppl) is the plain CE.
        eps = self.label_smoothing if self.training else 0.0
        loss = cross_entropy(logits, target, fused=fused, weight=weights, label_smoothing=eps)
        return logits, loss, int(target.numel())

    def _loss_in_graph(self, h: torch.Tensor, weights: torch.Tensor | None) -> bool:
        """Whether a compiled forward computes its loss over every position, inside the compiled graph, rather
        than over the labelled rows (:meth:`_labelled_loss`, which runs outside it). ``self.loss_in_graph``
        decides when set; by default a decoder or encoder-decoder on a GPU does: its labels cover nearly every
        position, so projecting them all costs little, while the graph break of the selection costs a host sync
        and the head's fusion with the loss. An MLM encoder (15% of positions labelled) keeps selecting."""
        if weights is not None or self.rtd_head is not None:
            return False
        if self.loss_in_graph is not None:
            return self.loss_in_graph
        return h.is_cuda and self.config.arch != "encoder"

    def _every_position_loss(self, h: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
        """h (B, T, D), labels (B, T) -> logits (B*T, V) at every position, the mean CE over the labelled ones
        (the same value as :meth:`_labelled_loss`), and their count as a tensor (reading it would sync)."""
        logits = self._head(h).flatten(0, 1)  # (B*T, V)
        eps = self.label_smoothing if self.training else 0.0
        loss = F.cross_entropy(logits.float(), labels.flatten(), ignore_index=IGNORE_INDEX, label_smoothing=eps)
        return logits, loss, (labels != IGNORE_INDEX).sum()

    def generate(self, *args, **kwargs):
        """Greedy / beam / sampled generation; see :func:`lmforge.generation.generate` (same arguments,
        without ``model``). Example: ``model.generate(ids, max_new_tokens=20, num_beams=4).sequences``."""
        return generation.generate(self, *args, **kwargs)

    def _decoder_start_id(self) -> int:
        cfg = self.config
        for tid in (cfg.decoder_start_token_id, cfg.bos_token_id, cfg.pad_token_id):
            if tid is not None:
                return tid
        return 0

    # ------------------------------------------------------------------ bookkeeping
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (tied weights counted once); optionally without token/position tables."""
        params = {id(p): p for p in self.parameters()}
        if exclude_embeddings:
            for name, p in self.named_parameters():
                if "embed_tokens" in name or name.endswith("positions.weight"):
                    params.pop(id(p), None)
        return sum(p.numel() for p in params.values())

    def active_parameters(self, exclude_embeddings: bool = False) -> int:
        """The parameters one token multiplies by: :meth:`num_parameters` less the experts it is not routed to
        (each MoE layer counts its router and ``top_k`` of its experts). Equal to it for a dense model."""
        return self.num_parameters(exclude_embeddings) - _inactive_expert_weights(self)

    def training_metrics(self) -> dict:
        """Scalars (and the expert load histogram) of the training forwards since the last call, for the
        Trainer's log: an MoE model's router statistics (:func:`lmforge.nn.moe.moe_stats`); ``{}`` if dense."""
        return moe_stats(self) if self.config.moe_experts else {}

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Estimated training FLOPs per token (forward + backward), PaLM appendix B:
        6 * N_matmul + 12 * L * d_attn * T, where N_matmul counts the weights every token multiplies
        by (non-embedding parameters plus the output projection to the vocabulary). An MoE layer counts its
        *active* weights only: the router and ``top_k`` experts (:meth:`active_parameters`). A sliding window
        or Linformer shortens the T keys each query attends to (see ``_attention_flops``).

        For an encoder-decoder a "token" is one source token *and* one target token (both stacks run);
        use :meth:`train_flops` to count a batch whose source and target lengths differ."""
        T = seq_len or self.config.max_seq_len
        return self.train_flops(T, T if self.config.arch == "encoder-decoder" else None) // T

    def train_flops(self, seq_len: int, target_len: int | None = None) -> int:
        """Estimated training FLOPs (forward + backward) of one sequence: ``seq_len`` tokens, plus
        ``target_len`` decoder tokens for an encoder-decoder.

        Each stack's weights are multiplied by its own tokens only (the encoder's and cross-attention's key and
        value projections by source tokens, the rest of the decoder's and the vocabulary projection's by target
        tokens), so counting both stacks per source
        token would overstate an encoder-decoder's work (and its MFU) about twofold.

        Example:
            >>> import lmforge
            >>> m = lmforge.build_model("t5-tiny", n_layers=1, n_decoder_layers=1, d_model=8, n_heads=2, head_dim=4,
            ...                         d_ff=16, vocab_size=10)
            >>> m.train_flops(4, 4) == 4 * m.flops_per_token(4)
            True
        """
        cfg = self.config
        d_attn = cfg.n_heads * cfg.dim_per_head
        head = cfg.vocab_size * cfg.embed_dim if cfg.head in ("lm", "mlm") and cfg.tie_embeddings else 0
        if cfg.mos_experts:  # each of the K softmaxes multiplies the (V, E) output embedding (counted once if untied)
            head = (cfg.mos_experts - (not cfg.tie_embeddings)) * cfg.vocab_size * cfg.embed_dim
        if cfg.arch != "encoder-decoder":
            n = (self.active_parameters(exclude_embeddings=True) + head - _linformer_weights(self)
                 - _synthesizer_tables(self)
                 + _repeated_weights(self.encoder or self.decoder, cfg.n_layers))
            if isinstance(self.encoder, FunnelStack):  # its layers run on pooled lengths: counted layer by layer
                n -= sum(p.numel() for p in self.encoder.layers.parameters())
                return int(6 * n * seq_len + self.encoder.train_flops(seq_len))
            return int((6 * n + cfg.n_layers * _attention_flops(cfg, seq_len)) * seq_len)
        S, T = seq_len, target_len or seq_len
        n_enc = (_stack_weights(self.encoder) - _inactive_expert_weights(self.encoder)
                 + _repeated_weights(self.encoder, cfg.n_layers))
        # Cross-attention's key and value projections read the encoder's output: they run once per source token.
        # A shared decoder layer (share_layers) runs them once per depth.
        n_mem = sum(p.numel() for name, p in self.decoder.named_parameters()
                    if ".cross_attn.k." in name or ".cross_attn.v." in name
                    ) * (cfg.decoder_layers // len(self.decoder.layers))
        # Blocks shared with the encoder (share_encoder_decoder) multiply the target tokens too: same cost as unshared.
        enc_params = {id(p) for p in self.encoder.parameters()}
        reused = sum(p.numel() for p in {id(p): p for p in self.decoder.parameters()}.values() if id(p) in enc_params)
        n_dec = (self.active_parameters(exclude_embeddings=True) - _stack_weights(self.encoder)
                 + _inactive_expert_weights(self.encoder) - n_mem + head + reused
                 + _repeated_weights(self.decoder, cfg.decoder_layers))
        enc = 6 * (n_enc + n_mem) * S + 12 * cfg.n_layers * d_attn * S * S
        if isinstance(self.encoder, FunnelStack):  # its layers run on pooled lengths: counted layer by layer
            layers = sum(p.numel() for p in self.encoder.layers.parameters())
            enc = 6 * (n_enc - layers + n_mem) * S + self.encoder.train_flops(S)
        dec = 6 * n_dec * T + 12 * cfg.decoder_layers * d_attn * T * (T + S)  # self- then cross-attention
        return int(enc + dec)

    def save(self, path: str | Path, tokenizer=None) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (+ tokenizer) atomically; see lmforge.model_folder."""
        return model_folder.save(self, path, tokenizer=tokenizer)


def share_blocks(encoder: TransformerStack, decoder: TransformerStack) -> None:
    """T5's "Enc-dec, shared" row (Raffel et al. 2020, §3.2.2): the decoder's layer i reuses the encoder's
    layer i, so the model has about the parameters P of one stack rather than 2P.

    What is shared: each layer's self-attention and feed-forward, with their norms. The paper counts the
    shared model as P, the size of an L-layer stack, which ignores the decoder's encoder-decoder attention;
    the encoder has no such sublayer to share it with, so the decoder keeps its own cross-attention and its
    norm. Each stack also keeps its own final norm and position signals (T5's relative bias is
    bidirectional in the encoder and causal in the decoder, with separate buckets).
    """
    for enc, dec in zip(encoder.layers, decoder.layers, strict=True):
        dec.attn_norm, dec.attn, dec.ffn_norm, dec.ffn = enc.attn_norm, enc.attn, enc.ffn_norm, enc.ffn
        if enc.rezero is not None:
            dec.rezero = enc.rezero
        if enc.fixup is not None:  # Fixup's scalars go with the branches they gate
            dec.fixup["attn"], dec.fixup["ffn"] = enc.fixup["attn"], enc.fixup["ffn"]


def token_table(cfg: ModelConfig) -> nn.Module:
    """The token table: one (V, E) embedding, or Baevski & Auli's banded one (``adaptive_input_cutoffs``)."""
    if cfg.adaptive_input_cutoffs:
        return AdaptiveInput(cfg.vocab_size, cfg.d_model, cfg.adaptive_input_cutoffs, cfg.adaptive_factor)
    return embedding(cfg.vocab_size, cfg.embed_dim)


def softmax_layer(cfg: ModelConfig) -> nn.Module:
    """The LM head that replaces the one softmax: an adaptive softmax, or a mixture of ``mos_experts`` softmaxes.
    Both return log-probabilities over the vocabulary as their logits."""
    if cfg.adaptive_softmax_cutoffs:
        return AdaptiveSoftmax(cfg.d_model, cfg.vocab_size, cfg.adaptive_softmax_cutoffs, cfg.adaptive_factor,
                               head_bias=cfg.lm_head_bias)
    return MixtureOfSoftmaxes(cfg.d_model, cfg.vocab_size, cfg.mos_experts, cfg.embed_dim, cfg.tie_embeddings,
                              bias=cfg.lm_head_bias)


def set_label_smoothing(model: nn.Module, eps: float) -> None:
    """Smooth the token cross-entropy of every Transformer inside ``model`` (a wrapper's or a task model's body
    too) by ``eps`` while it trains; evaluation still reports the plain cross-entropy.

    Example:
        >>> import lmforge
        >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
        >>> set_label_smoothing(model, 0.1)
        >>> model.label_smoothing
        0.1
    """
    for module in model.modules():
        if isinstance(module, Transformer):
            module.label_smoothing = eps


def packed_layer_weights(stack: nn.Module) -> int:
    """The weights a stack's layers multiply each packed row by (:mod:`lmforge.nn.unpadding`): all of them but
    cross-attention's key and value projections, which read the padded encoder output, counted once per depth
    (a shared layer runs ``n_layers`` times)."""
    per_token = sum(p.numel() for name, p in stack.layers.named_parameters()
                    if ".cross_attn.k." not in name and ".cross_attn.v." not in name)
    return (per_token - _linformer_weights(stack.layers)) * stack.n_layers // len(stack.layers)


def _attention_flops(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token and layer of the scores and the weighted sum: 12 * d_attn per key a query
    attends to. A sliding window attends to at most W keys; Linformer to its k projected rows, plus
    projecting K and V onto them (E K, F V: 12 * k * d_kv per token)."""
    d_attn, d_kv = cfg.n_heads * cfg.dim_per_head, cfg.kv_heads * cfg.dim_per_head
    if cfg.attention == "linformer":
        return 12 * cfg.linformer_k * (d_attn + d_kv)
    if cfg.attention.startswith("synthesizer-") and cfg.synthesizer_mix == "none":
        return 6 * d_attn * seq_len  # the weighted sum only: no query-key scores
    if cfg.attention in ("lightconv", "dynamicconv"):  # a width-k window per channel, no keys: 2 d k forward
        return 6 * cfg.d_model * cfg.conv_kernel
    if cfg.block == "evolved" and cfg.arch == "decoder":  # the decoder layer's wide self-attention too (d wide)
        return 12 * (d_attn + cfg.d_model) * seq_len
    return 12 * d_attn * (seq_len if cfg.sliding_window is None else min(seq_len, cfg.sliding_window))


def _linformer_weights(model: nn.Module) -> int:
    """Linformer's E and F: their cost is counted by :func:`_attention_flops`, not per weight."""
    return sum(p.numel() for name, p in model.named_parameters() if ".linformer." in name)


def _synthesizer_tables(model: nn.Module) -> int:
    """A random synthesizer's (H, L, L) logits (or its R1, R2): read, never multiplied by a token."""
    return sum(p.numel() for m in model.modules() if isinstance(m, SynthesizerAttention) and m.kind.endswith("random")
               for name, p in m.named_parameters(recurse=False) if name.startswith("R"))


def _inactive_expert_weights(module: nn.Module) -> int:
    """Expert weights of ``module``'s MoE layers that a token is not routed to: (E - k) / E of each layer's; and
    the product-key memory slots it does not read (all but heads x top-k of each memory's values)."""
    total = 0
    for layer in moe_layers(module):
        per_expert = sum(p.numel() for p in layer.experts.parameters()) // layer.n_experts
        total += (layer.n_experts - layer.top_k) * per_expert
    for memory in (m for m in module.modules() if isinstance(m, ProductKeyMemory)):
        total += memory.values.weight.numel() - memory.heads * memory.topk * memory.values.weight.shape[1]
    return total


def _repeated_weights(stack: nn.Module, depth: int) -> int:
    """Weights of a stack's shared layer (ALBERT's ``share_layers``) counted once more per extra depth: the
    layer is stored once but runs ``depth`` times, so its weights multiply every token ``depth`` times."""
    if len(stack.layers) >= depth:
        return 0
    once = (sum(p.numel() for p in stack.layers.parameters()) - _inactive_expert_weights(stack.layers)
            - _linformer_weights(stack.layers))
    return (depth - len(stack.layers)) * once


def _stack_weights(stack: nn.Module) -> int:
    """Parameters of one stack that multiply activations (its position tables excluded)."""
    return sum(p.numel() for name, p in stack.named_parameters() if not name.endswith("positions.weight"))
