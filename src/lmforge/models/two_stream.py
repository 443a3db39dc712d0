"""XLNet's two-stream attention (Yang et al. 2019, §2.3) on an lmforge encoder, for permuted LM pre-training.

A permuted LM predicts x_i from the tokens before i in a sampled order, knowing i's position. One stream
cannot do both: a representation that predicts x_i must not contain x_i, yet when x_i is context for later
tokens it must. XLNet therefore runs two streams through the *same* layers:

    content stream h_i   starts at the token embedding e(x_i); attends to content h_j, rank(j) <= rank(i)
    query stream   g_i   starts at a learned vector w;         attends to content h_j, rank(j) <  rank(i)

and predicts x_i from the query stream's last layer. Here both streams run as one sequence of 2T positions
through the encoder stack: rows 0..T-1 are the content stream, rows T..2T-1 the query stream, and one
(B, 2T, 2T) mask lets content rows see content keys by ``content_mask`` and query rows see content keys by
``query_mask``; no row ever sees a query-stream key. Both halves carry positions 0..T-1, so every layer
(attention weights, norms, FFN) treats the two streams exactly as XLNet's shared-weight streams. Absolute
positions (learned, sinusoidal, RoPE, none) follow ``position_ids``; relative biases computed from the
2T-long sequence would not, so those models are refused.

The wrapper is a training-time model: :attr:`TwoStreamLM.saved_model` is the encoder, which a finished run
saves (``w`` is only needed to pre-train).

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.models.transformer import Transformer
    >>> body = Transformer(ModelConfig(arch="encoder", head="mlm", d_model=16, n_heads=2, d_ff=32, vocab_size=50))
    >>> model = TwoStreamLM(body)
    >>> ranks = torch.tensor([[1, 3, 0, 2]])
    >>> content = ranks[:, None, :] <= ranks[:, :, None]
    >>> model(torch.tensor([[5, 6, 7, 8]]), content, ranks[:, None, :] < ranks[:, :, None]).logits.shape
    torch.Size([1, 4, 50])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.models.transformer import ModelOutput, Transformer

ABSOLUTE_POSITIONS = ("learned", "sinusoidal", "rope", "none")


def two_stream_train_flops(model: Transformer, seq_len: int, predicted: float) -> int:
    """Estimated training FLOPs of one sequence of ``seq_len`` tokens run as two streams: 2T rows through the
    stack (attention over 2T keys), but only the ``predicted`` tokens reach the vocabulary projection.

    Example (every row predicted: the cost of one plain sequence of 2T tokens)::

        >>> import lmforge
        >>> m = lmforge.build_model("bert-tiny", n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=10)
        >>> two_stream_train_flops(m, 4, predicted=8) == m.train_flops(8)
        True
    """
    cfg = model.config
    unpredicted = 6 * cfg.vocab_size * cfg.embed_dim * (2 * seq_len - predicted)
    return model.train_flops(2 * seq_len) - round(unpredicted)


class TwoStreamLM(nn.Module):
    """An encoder ``Transformer`` run as XLNet's content and query streams (see the module docstring)."""

    def __init__(self, model: Transformer):
        super().__init__()
        cfg = model.config
        if cfg.arch != "encoder" or cfg.head not in ("mlm", "lm"):
            raise ConfigError(f"permuted LM trains an encoder with a token head (arch='encoder', head 'mlm' or 'lm'); "
                              f"model {cfg.name!r} has arch={cfg.arch!r}, head={cfg.head!r}")
        if cfg.position not in ABSOLUTE_POSITIONS or cfg.attention != "full":
            raise ConfigError(f"permuted LM runs both streams as one sequence, which needs absolute positions and full "
                              f"attention; model {cfg.name!r} has position={cfg.position!r}, "
                              f"attention={cfg.attention!r} (use position {', '.join(ABSOLUTE_POSITIONS)})")
        self.model = model
        self.query_init = nn.Parameter(torch.randn(cfg.embed_dim) * cfg.initializer_range)  # w, (E,)

    @property
    def config(self):
        return self.model.config

    @property
    def saved_model(self) -> Transformer:
        """The model a finished run saves: the encoder and its head."""
        return self.model

    def num_parameters(self) -> int:
        return self.model.num_parameters() + self.query_init.numel()

    def forward(self, input_ids: torch.Tensor, content_mask: torch.Tensor, query_mask: torch.Tensor,
                labels: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None) -> ModelOutput:
        """input_ids (B, T), content_mask/query_mask (B, T, T) bool (True = may attend), labels (B, T) or None.

        Returns the query stream's ``last_hidden_state`` (B, T, D) and its ``logits`` (B, T, V), or with
        labels the mean cross-entropy at the labelled positions (``logits`` (N, V) there)."""
        B, T = input_ids.shape
        tokens = self.model.embed_tokens(input_ids)  # (B, T, E) content stream's input
        query = self.query_init.to(tokens.dtype).expand(B, T, -1)  # (B, T, E) query stream's input
        never = torch.zeros_like(content_mask)  # no row attends to a query-stream key
        mask = torch.cat([torch.cat([content_mask, never], 2), torch.cat([query_mask, never], 2)], 1)  # (B, 2T, 2T)
        positions = torch.arange(T, device=input_ids.device).repeat(2)[None]  # (1, 2T): the same places twice
        types = None if token_type_ids is None else token_type_ids.repeat(1, 2)
        h, _ = self.model.encoder(torch.cat([tokens, query], 1), mask, types, positions)  # (B, 2T, D)
        g = h[:, T:]  # (B, T, D) the query stream
        out = ModelOutput(last_hidden_state=g)
        if labels is None:
            out.logits = self.model._head(g)
        else:
            out.logits, out.loss, out.n_targets = self.model._labelled_loss(g, labels)
        return out
