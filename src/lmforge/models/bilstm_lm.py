"""ELMo's bidirectional LSTM language model and its scalar-mix feature extractor (Peters et al. 2018).

Two LSTM language models share the token embedding and the softmax, and nothing else::

    ids (B, T) -> embed (B, T, E) --> forward LSTM x L  --> h_fwd[l] (B, T, H)  --softmax--> p(x_{t+1} | x_<=t)
                                  \\-> backward LSTM x L --> h_bwd[l] (B, T, H)  --softmax--> p(x_{t-1} | x_>=t)

    loss = mean CE of both directions:  -(sum_t log p(x_t | x_<t) + log p(x_t | x_>t)) / (#targets)

The backward LM reads each sequence reversed *within its length* (padding stays on the right), so padded
batches give the same states as unpadded ones. Layers above the first add a residual connection, as ELMo's
second layer does. The representation of layer l is ``[h_fwd[l]; h_bwd[l]]`` (B, T, 2H); layer 0 is the
token embedding projected to 2H (ELMo duplicates its context-free char-CNN vector; a projection makes the
sizes match for any E). The LM loss never reaches that projection (nor the model's scalar mix): after
pre-training it is still its random initialisation, a full-rank linear map of the embedding that a linear probe
sees through, and a downstream task may train it. (For the same reason a DDP run would need
``find_unused_parameters``; the biLM has been trained single-process only.) :meth:`BiLM.elmo` mixes the L+1
layers with a learned :class:`~lmforge.nn.scalar_mix.ScalarMix` (softmax-normalised weights x gamma).

Pre-training: ``lmforge pretrain --model elmo-tiny --objective bilm --data DATA --out RUN``. The objective
(:class:`lmforge.objectives.bilm.BiLMObjective`) makes aligned (B, 2, T) labels, and the model returns
``loss``/``n_targets``/flat ``logits`` in the order of those labels, so the :class:`~lmforge.training.Trainer`
runs it unchanged: checkpoints, exact resume, bf16 and accumulation included. ``RUN/model`` (``config.json``
with ``arch: bilstm``, ``model.safetensors``, the tokenizer) loads with ``lmforge.load`` / :func:`lmforge.checkpoint.load_bilm`,
and :class:`lmforge.embeddings.SentenceEncoder` takes it like any encoder: its N+1 "hidden states" are :meth:`BiLM.layer_states` and its scalar mix is the model's own.

ELMo as the paper built it (``char_cnn: true``, preset ``elmo-cnn-tiny``): layer 0 is a character CNN with
highway layers (:class:`lmforge.nn.char_cnn.CharCNN`) over each token's string, trained with the rest by the LM
loss, and layer 0's representation is that vector duplicated, ``[x; x]``, as ELMo does; the LSTMs have
projections (``d_proj``: H cells projected to P, so layers are 2P wide; ELMo: 4096 cells, P = 512). Each
vocabulary entry's characters are a buffer (:meth:`BiLM.set_token_chars`, filled from the tokenizer when a
run starts), and ``char_ids`` (B, T, C) passed directly give vectors to words outside the vocabulary. The
output softmax is still over the vocabulary (``embed_tokens`` is then only the softmax matrix).

Presets (:data:`PRESETS`) are plain dicts here rather than YAML files in ``lmforge/presets``, which hold
Transformer configs only.

Example:
    >>> import torch
    >>> lm = BiLM(BiLMConfig(vocab_size=50, d_embed=16, d_hidden=16, n_layers=2))
    >>> ids = torch.randint(1, 50, (2, 7))
    >>> out = lm(ids, labels=bilm_labels(ids))
    >>> out.loss.shape, out.n_targets, len(lm.layer_states(ids)), lm.elmo(ids).shape
    (torch.Size([]), 24, 3, torch.Size([2, 7, 32]))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ConfigBase
from lmforge.nn.char_cnn import DEFAULT_FILTERS, CharCNN, char_ids
from lmforge.nn.labels import IGNORE_INDEX
from lmforge.nn.scalar_mix import ScalarMix

__all__ = ["ARCH", "PRESETS", "BiLM", "BiLMConfig", "BiLMOutput", "bilm_labels", "reverse_within_length"]

ARCH = "bilstm"  # the ``arch`` a BiLM config.json records; lmforge.load dispatches on it
# ELMo's own biLM has 2 layers of 4096 cells projected to 512; these are CPU-sized.
PRESETS: dict[str, dict[str, Any]] = {
    "elmo-tiny": {"name": "elmo-tiny", "vocab_size": 8192, "d_embed": 256, "d_hidden": 256, "n_layers": 2,
                  "dropout": 0.1, "max_seq_len": 128},
    # the paper's layout scaled down: character CNN + 2 highway layers, LSTMs of 512 cells projected to 128
    "elmo-cnn-tiny": {"name": "elmo-cnn-tiny", "vocab_size": 8192, "d_embed": 128, "d_hidden": 512, "d_proj": 128,
                      "n_layers": 2, "dropout": 0.1, "max_seq_len": 128, "char_cnn": True},
}


@dataclass
class BiLMConfig(ConfigBase):
    """Plain data (round-trips through ``asdict``/JSON).

    Args:
        vocab_size: tokens.
        d_embed: token embedding size E.
        d_hidden: LSTM hidden size H per direction (layer representations are 2H, or 2P with ``d_proj``).
        d_proj: P, each LSTM's output projected from H cells to P (ELMo's LSTMP); 0 = none.
        n_layers: LSTM layers per direction.
        char_cnn: compute the token vectors (size ``d_embed``, which must then equal the layer size P or H)
            with ELMo's character CNN instead of a table; layer 0 is then that vector duplicated.
        char_filters: the CNN's ``[width, n_filters]`` pairs. n_highway: its highway layers.
        max_chars: characters per token, BOW and EOW included (longer tokens are cut).
        dropout: between layers and before the softmax.
        pad_token_id: padding id (its embedding stays zero).
        max_seq_len: default segment length for pre-training and truncation length for encoding (an LSTM has
            no hard limit; this only keeps the defaults of the Transformer tools meaningful).
        name: preset name, for logs.
        arch: always ``"bilstm"``; recorded so that a model folder says which class to rebuild.
    """

    vocab_size: int
    d_embed: int = 128
    d_hidden: int = 128
    d_proj: int = 0
    n_layers: int = 2
    dropout: float = 0.1
    pad_token_id: int = 0
    max_seq_len: int = 128
    char_cnn: bool = False
    char_filters: list[list[int]] = field(default_factory=lambda: [list(f) for f in DEFAULT_FILTERS])
    n_highway: int = 2
    max_chars: int = 50
    name: str = "custom"
    arch: str = ARCH

    def __post_init__(self):
        for key in ("vocab_size", "d_embed", "d_hidden", "n_layers", "max_seq_len"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BiLMConfig.{key} must be an integer >= 1 (got {value!r})")
        if isinstance(self.d_proj, bool) or not isinstance(self.d_proj, int) or self.d_proj < 0:
            raise ValueError(f"BiLMConfig.d_proj must be an integer >= 0 (0: no projection; got {self.d_proj!r})")
        if self.char_cnn:
            widths = [f[0] for f in self.char_filters if isinstance(f, (list, tuple)) and len(f) == 2]
            if len(widths) != len(self.char_filters) or not widths or min(min(f) for f in self.char_filters) < 1:
                raise ValueError(f"BiLMConfig.char_filters must be [width, n_filters] pairs >= 1 "
                                 f"(got {self.char_filters!r})")
            if not max(widths) + 2 <= self.max_chars:
                raise ValueError(f"BiLMConfig.max_chars={self.max_chars} is shorter than the widest filter plus "
                                 f"BOW and EOW ({max(widths) + 2})")
            if self.d_embed != self.layer_size:
                raise ValueError(f"BiLMConfig: with char_cnn, layer 0 is the CNN's vector duplicated, so d_embed "
                                 f"({self.d_embed}) must equal the LSTM output size ({self.layer_size}: d_proj, "
                                 "else d_hidden)")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"BiLMConfig.dropout must be in [0, 1) (got {self.dropout})")
        if self.arch != ARCH:
            raise ValueError(f"BiLMConfig.arch must be {ARCH!r} (got {self.arch!r})")

    @property
    def layer_size(self) -> int:
        """Output size of one direction's LSTM: P with projections, else H."""
        return self.d_proj or self.d_hidden

    @property
    def d_model(self) -> int:
        """Size of every layer representation, 2P or 2H (what sentence encoders and probes see)."""
        return 2 * self.layer_size

    config_noun = "BiLM setting(s)"

    def replace(self, **changes: Any) -> "BiLMConfig":
        return type(self).from_dict({**self.to_dict(), **changes}, source="overrides")


@dataclass
class BiLMOutput:
    loss: torch.Tensor | None = None
    n_targets: int | None = None
    logits: torch.Tensor | None = None  # (N, V) at the labelled targets: forward ones first, then backward
    forward_logits: torch.Tensor | None = None  # (B, T, V): position t predicts token t+1
    backward_logits: torch.Tensor | None = None  # (B, T, V): position t predicts token t-1
    hidden_states: list[torch.Tensor] | None = None  # L+1 x (B, T, 2H), with output_hidden_states=True


def bilm_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Aligned targets of both LMs, (B, T) -> (B, 2, T): row 0 holds token t+1 at t, row 1 token t-1 at t.

    A target is kept only when both the predicting position and the predicted token are real (not padding).

    Example:
        >>> bilm_labels(torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 1, 1, 0]])).tolist()
        [[[6, 7, -100, -100], [-100, 5, 6, -100]]]
    """
    B, T = input_ids.shape
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    labels = torch.full((B, 2, T), IGNORE_INDEX, dtype=torch.long, device=input_ids.device)
    labels[:, 0, :-1] = torch.where(real[:, :-1] & real[:, 1:], input_ids[:, 1:], IGNORE_INDEX)
    labels[:, 1, 1:] = torch.where(real[:, 1:] & real[:, :-1], input_ids[:, :-1], IGNORE_INDEX)
    return labels


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps, leave its padding in place; (B, T, ...) -> same.

    Applying it twice is the identity, so the same call maps the backward LSTM's outputs back.
    """
    T = x.size(1)
    t = torch.arange(T, device=x.device)[None, :]  # (1, T)
    L = lengths[:, None]  # (B, 1)
    index = torch.where(t < L, L - 1 - t, t)  # (B, T)
    return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x))


class _Direction(nn.Module):
    """A stack of single-layer LSTMs, so every layer's states are available (nn.LSTM only returns the top)."""

    def __init__(self, cfg: BiLMConfig):
        super().__init__()
        sizes = [cfg.d_embed] + [cfg.layer_size] * cfg.n_layers
        self.layers = nn.ModuleList(nn.LSTM(sizes[i], cfg.d_hidden, proj_size=cfg.d_proj, batch_first=True)
                                    for i in range(cfg.n_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        states = []
        for i, lstm in enumerate(self.layers):
            h, _ = lstm(self.dropout(x) if i else x)  # (B, T, P or H)
            h = h + x if i else h  # residual above the first layer (sizes match there)
            states.append(h)
            x = h
        return states


class BiLM(nn.Module):
    """Forward + backward LSTM LMs with a shared embedding and softmax (ELMo's biLM)."""

    def __init__(self, config: BiLMConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=config.pad_token_id)
        self.forward_lm = _Direction(config)
        self.backward_lm = _Direction(config)
        self.to_vocab_space = nn.Linear(config.layer_size, config.d_embed)  # then the tied (shared) softmax
        if config.char_cnn:
            self.char_cnn = CharCNN(config.d_embed, config.char_filters, config.n_highway)
            # each vocabulary entry's characters (V, C); set from the tokenizer (set_token_chars), saved with the model
            self.register_buffer("token_chars", torch.zeros(config.vocab_size, config.max_chars, dtype=torch.long))
        else:
            self.layer0 = nn.Linear(config.d_embed, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.scalar_mix = ScalarMix(config.n_layers + 1)

    def set_token_chars(self, tokens: Sequence[str | None]) -> None:
        """Give the character CNN each vocabulary entry's string (``tokens[i]`` for id i; None = empty)."""
        if not self.config.char_cnn:
            raise ValueError("set_token_chars: this BiLM has no character CNN (char_cnn: false)")
        if len(tokens) != self.config.vocab_size:
            raise ValueError(f"set_token_chars: {len(tokens)} tokens for a vocabulary of {self.config.vocab_size}")
        self.token_chars.copy_(char_ids([t or "" for t in tokens], self.config.max_chars))

    def embed(self, input_ids: torch.Tensor | None = None, char_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Context-free token vectors (B, T, E): the table, or the character CNN over ``char_ids`` (B, T, C)
        (default: the vocabulary's characters of ``input_ids``)."""
        if not self.config.char_cnn:
            if char_ids is not None:
                raise ValueError("char_ids: this BiLM has no character CNN (char_cnn: false)")
            return self.embed_tokens(input_ids)
        return self.char_cnn(self.token_chars[input_ids] if char_ids is None else char_ids)

    @staticmethod
    def _lengths(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            return torch.full((x.size(0),), x.size(1), device=x.device)
        return attention_mask.long().sum(1)

    def directional_states(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None = None,
                           char_ids: torch.Tensor | None = None):
        """(embeddings (B, T, E), forward states L x (B, T, P), backward states L x (B, T, P)); P = H without
        projections. ``char_ids`` (B, T, C): see :meth:`embed`."""
        x = self.embed(input_ids, char_ids)
        lengths = self._lengths(x, attention_mask)
        fwd = self.forward_lm(x)
        # the backward LM is a forward LM over the reversed sequence; map its states back to positions t
        bwd = [reverse_within_length(h, lengths) for h in self.backward_lm(reverse_within_length(x, lengths))]
        return x, fwd, bwd

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.to_vocab_space(self.dropout(h)) @ self.embed_tokens.weight.T  # (..., V)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool = False,
                char_ids: torch.Tensor | None = None) -> BiLMOutput:
        """``labels`` (B, 2, T) are aligned with the predictions (see :func:`bilm_labels`): ``labels[:, 0, t]`` is
        the forward LM's target at position t (token t+1), ``labels[:, 1, t]`` the backward LM's (token t-1),
        -100 where there is none. The flat ``logits`` rows follow ``labels[labels != -100]``, as the trainer's
        evaluation expects. ``output_hidden_states``: also return the L+1 layer representations (see
        :meth:`layer_states`), the features a downstream task mixes."""
        x, fwd, bwd = self.directional_states(input_ids, attention_mask, char_ids)
        fwd_logits, bwd_logits = self._logits(fwd[-1]), self._logits(bwd[-1])  # (B, T, V) each
        out = BiLMOutput(forward_logits=fwd_logits, backward_logits=bwd_logits)
        if output_hidden_states:
            out.hidden_states = self._layers(x, fwd, bwd)
        if labels is not None:
            if labels.dim() != 3 or labels.size(1) != 2:
                raise ValueError(f"BiLM labels must be (B, 2, T) (use bilm_labels); got {tuple(labels.shape)}")
            keep = labels != IGNORE_INDEX  # (B, 2, T)
            out.logits = torch.stack([fwd_logits, bwd_logits], 1)[keep]  # (N, V)
            target = labels[keep]
            out.n_targets = int(target.numel())
            out.loss = F.cross_entropy(out.logits.float(), target) if out.n_targets else out.logits.sum() * 0
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _layers(self, x: torch.Tensor, fwd: list[torch.Tensor], bwd: list[torch.Tensor]) -> list[torch.Tensor]:
        first = torch.cat([x, x], -1) if self.config.char_cnn else self.layer0(x)  # (B, T, 2P)
        return [first] + [torch.cat([f, b], -1) for f, b in zip(fwd, bwd)]

    def layer_states(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None = None,
                     char_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The L+1 representations, each (B, T, 2H) (2P with projections): layer 0 (the embeddings projected,
        or with the character CNN its vector duplicated), then ``[h_fwd[l]; h_bwd[l]]``."""
        return self._layers(*self.directional_states(input_ids, attention_mask, char_ids))

    def elmo(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             scalar_mix: ScalarMix | None = None) -> torch.Tensor:
        """ELMo vectors (B, T, 2H): ``gamma * sum_l softmax(s)_l * layer_l`` (Peters et al. 2018, eq. 1).

        Pass a task's own :class:`ScalarMix` (and freeze the biLM) to learn the mix for that task.
        """
        return (scalar_mix or self.scalar_mix)(self.layer_states(input_ids, attention_mask))


