"""ELECTRA's generator + discriminator pair, trained jointly (Clark et al., 2020, §2).

::

    input_ids (B, T) masked ──> generator (small MLM encoder) ──> logits (N, V) at the N masked positions
                                      │ L_MLM = mean CE                  │ sample ~ softmax (no gradient)
                                      ▼                                  ▼
    corrupted (B, T) = input_ids with the N samples in place of the masked tokens
                                      │
                                      ▼
    discriminator (the encoder being pre-trained) ──> RTD head ──> logit (B, T): "replaced?"
                                      L_RTD = BCE over every real token, label = corrupted != original

A sampled token that equals the original is labelled *original* (§2: a correct guess of the generator counts
as real). Gradients do not flow through the sample: the generator learns only from L_MLM, by maximum
likelihood, as in the paper (sampling is not differentiable; its adversarial alternative, trained with
reinforcement learning, did worse).

Sharing (§3.2). The two models share their token and position embeddings, and in lmforge the rest of the
input embedding too (segments, the embedding LayerNorm), as ELECTRA's code does. Why it pays: the
discriminator only updates the rows of tokens that occur in its input, while the generator's softmax over
the tied table updates every row. The generator is narrower (``generator_size`` of the hidden size, heads and FFN width,
the same depth; the paper's 1/4 for small models), so it keeps the discriminator's embedding width E and
projects it to its own width (HF's ``embeddings_project``, lmforge's factorised embeddings ``embedding_dim``),
and its MLM head maps back down to E before the tied output matrix.

Untying the generator's output (``tie_generator_output=False``). With the tie, the generator's softmax moves
every row of the shared table on every step, towards a common direction for the rows that are rarely targets
(Gao et al., 2019, "Representation Degeneration Problem"); under Adam even a tiny steady gradient moves a row
by about ``lr`` per step. Over the paper's million steps the rows spread out again; over a few hundred they do
not, and the discriminator inherits a table whose rare and mid-frequency rows point the same way. Untied, the
generator's MLM head gets its own (V, E) output matrix, and the shared table is updated only through the
inputs of both models, as an untied BERT's is.

The joint loss (§2) is the paper's, on every batch::

    L = L_MLM + lambda * L_RTD = mean_masked CE + lambda * mean_real BCE

Its two means are over different targets (the N masked tokens; the R real tokens), so the output lists them
as ``loss_terms``: the MLM term counted over ``labels != -100``, the RTD term over the batch's
``attention_mask`` (the discriminator's labels are made here, from the generator's sample, and are not in
the batch). The Trainer weighs each by its own count over the accumulated batch, so ``grad_accum=k,
batch_size=b`` gives exactly the update of ``grad_accum=1, batch_size=k*b``, and evaluation reports the
generator's MLM as ``eval_loss`` / ``eval_ppl`` / ``eval_accuracy`` and the discriminator's RTD as
``eval_rtd_loss`` / ``eval_rtd_accuracy``.

Saving. :attr:`ElectraPretrainer.saved_model` is the discriminator: the Trainer writes it as ``RUN/model``, an
ordinary encoder folder with ``head: rtd`` (HF ``ElectraForPreTraining``; fine-tuning strips the head). The
generator lives only in the run's checkpoints.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(arch="encoder", vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1,
    ...                   type_vocab_size=2, embedding_norm=True, head="mlm")
    >>> pair = ElectraPretrainer.from_config(cfg, generator_size=0.25)
    >>> pair.generator.config.d_model, pair.generator.config.embed_dim, pair.discriminator.config.head
    (8, 32, 'rtd')
    >>> pair.generator.embed_tokens is pair.discriminator.embed_tokens
    True
    >>> ids = torch.randint(5, 50, (2, 7))
    >>> labels = torch.full((2, 7), -100)
    >>> labels[:, 2] = ids[:, 2]
    >>> out = pair(ids, attention_mask=torch.ones(2, 7), labels=labels)
    >>> out.logits.shape, out.n_targets, out.rtd_labels.shape
    (torch.Size([2, 50]), 2, torch.Size([2, 7]))
    >>> [(t.name, t.labels_key, t.weight) for t in out.loss_terms]
    [('tokens', 'labels', 1.0), ('rtd', 'attention_mask', 50.0)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmforge.config import ConfigError, ModelConfig
from lmforge.models.transformer import LossTerm, Transformer
from lmforge.nn.labels import IGNORE_INDEX

SHARED_EMBEDDINGS = ("positions", "token_types", "norm")  # of each stack's StackEmbeddings, besides the token table


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row from softmax(logits), by inverse CDF: the first id whose cumulative probability
    exceeds ``noise``.

    Args:
        logits: (N, V) any float dtype (the softmax is taken in fp32).
        noise: (N,) uniform numbers in [0, 1), one per row.
    Returns:
        (N,) long token ids. A token of probability 0 is never drawn.

    Example:
        >>> z = torch.log(torch.tensor([[0.5, 0.0, 0.5], [0.1, 0.6, 0.3]]))
        >>> sample_tokens(z, torch.tensor([0.6, 0.65])).tolist()
        [2, 1]
    """
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(-1)  # (N, V)
    # Scaled by the row's total, so rounding in the cumsum can never leave u past the last bucket.
    u = noise.float()[:, None] * cdf[:, -1:]  # (N, 1)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=logits.shape[-1] - 1)


def generator_config(discriminator: ModelConfig, size: float, tie_output: bool = True) -> ModelConfig:
    """The generator's config: the discriminator's with hidden size and FFN scaled by ``size``, the per-head
    width kept where it fits (ELECTRA's code: heads = hidden // 64), the same depth, the discriminator's
    embedding width, and an MLM head tied to the (shared) token table unless ``tie_output`` is False.

    Example:
        >>> g = generator_config(ModelConfig.from_preset("bert-tiny"), 0.25)
        >>> g.d_model, g.n_heads, g.d_ff, g.embed_dim, g.n_layers, g.tie_embeddings
        (96, 1, 384, 384, 6, True)
        >>> generator_config(ModelConfig.from_preset("bert-tiny"), 0.25, tie_output=False).tie_embeddings
        False
    """
    if not 0.0 < size <= 1.0:
        raise ConfigError(f"generator_size={size} must be in (0, 1]: a fraction of the discriminator's width")
    d = max(1, round(discriminator.d_model * size))
    heads = max(1, min(d // discriminator.dim_per_head, discriminator.n_heads))
    while d % heads:  # the largest head count up to that which divides the width
        heads -= 1
    return discriminator.replace(
        d_model=d, n_heads=heads, n_kv_heads=None, head_dim=None, d_ff=max(1, round(discriminator.d_ff * size)),
        embedding_dim=discriminator.embed_dim, head="mlm", tie_embeddings=tie_output, pooler=False,
        name=f"{discriminator.name}-generator",
    )


@dataclass
class ElectraPairConfig:
    """What a checkpoint of the pair records (its ``model/config.json``): both configs and the loss settings."""

    discriminator: dict[str, Any]
    generator: dict[str, Any]
    rtd_weight: float

    # What a run's summary line reads off a model config: the discriminator's, the model being pre-trained.
    @property
    def name(self) -> str:
        return f"{self.discriminator['name']} with an ELECTRA generator of d_model {self.generator['d_model']}"

    @property
    def arch(self) -> str:
        return self.discriminator["arch"]

    @property
    def vocab_size(self) -> int:
        return self.discriminator["vocab_size"]

    def to_dict(self) -> dict[str, Any]:
        return {"electra": {"discriminator": self.discriminator, "generator": self.generator,
                            "rtd_weight": self.rtd_weight}}


@dataclass
class ElectraOutput:
    """The pair's forward: the Trainer's fields (``loss``, ``n_targets``, ``logits``) and the parts.

    Attributes:
        loss: the joint loss L_MLM + lambda * L_RTD. n_targets: N, the masked tokens.
        loss_terms: its two terms, each counted over its own targets (module docstring).
        logits: (N, V) the generator's logits at the masked positions (so evaluation's accuracy is the MLM's).
        mlm_loss: mean CE of the generator. rtd_loss: mean BCE of the discriminator over the real tokens.
        corrupted_ids: (B, T) the discriminator's input. rtd_labels: (B, T) 1 replaced, 0 original, -100 pad.
        rtd_logits: (R,) the discriminator's logits at the R real tokens.
    """

    loss: torch.Tensor
    n_targets: int
    logits: torch.Tensor
    mlm_loss: torch.Tensor
    rtd_loss: torch.Tensor
    corrupted_ids: torch.Tensor
    rtd_labels: torch.Tensor
    rtd_logits: torch.Tensor
    loss_terms: list[LossTerm]


class ElectraPretrainer(nn.Module):
    """A generator (MLM) and a discriminator (RTD) sharing their input embeddings; see the module docstring.

    Args:
        discriminator: an encoder Transformer with ``head="rtd"``.
        generator: an encoder Transformer with ``head="mlm"`` and the discriminator's embedding width; its
            embedding modules are replaced by the discriminator's.
        rtd_weight: lambda (paper: 50).
    """

    def __init__(self, discriminator: Transformer, generator: Transformer, rtd_weight: float = 50.0):
        super().__init__()
        d, g = discriminator.config, generator.config
        if d.arch != "encoder" or d.head != "rtd":
            raise ConfigError(f"ELECTRA's discriminator must be an encoder with head='rtd' (got arch={d.arch!r}, "
                              f"head={d.head!r})")
        if g.arch != "encoder" or g.head != "mlm":
            raise ConfigError(f"ELECTRA's generator must be an encoder with head='mlm' (got arch={g.arch!r}, "
                              f"head={g.head!r})")
        generator.embed_tokens = discriminator.embed_tokens
        for name in SHARED_EMBEDDINGS:
            ours, theirs = getattr(discriminator.encoder.embed, name), getattr(generator.encoder.embed, name)
            if (ours is None) != (theirs is None) or (ours is not None and
                                                       [p.shape for p in ours.parameters()] !=
                                                       [p.shape for p in theirs.parameters()]):
                raise ConfigError(f"the generator's embedding {name!r} differs from the discriminator's; build the "
                                  "generator with generator_config()")
            setattr(generator.encoder.embed, name, ours)
        self.discriminator = discriminator
        self.generator = generator
        self.rtd_weight = float(rtd_weight)

    @classmethod
    def from_config(cls, config: ModelConfig, generator_size: float = 0.25, rtd_weight: float = 50.0,
                    tie_generator_output: bool = True) -> "ElectraPretrainer":
        """The pair for an encoder ``config`` (e.g. the bert-tiny preset): the discriminator is ``config`` with
        the RTD head, the generator :func:`generator_config` of it (its MLM output tied to the shared token
        table unless ``tie_generator_output`` is False)."""
        if config.arch != "encoder":
            raise ConfigError(f"ELECTRA pre-trains an encoder; model {config.name!r} has arch={config.arch!r}")
        discriminator = Transformer(config.replace(head="rtd"))
        generator = Transformer(generator_config(discriminator.config, generator_size, tie_generator_output))
        return cls(discriminator, generator, rtd_weight)

    @property
    def config(self) -> ElectraPairConfig:
        return ElectraPairConfig(self.discriminator.config.to_dict(), self.generator.config.to_dict(),
                                 self.rtd_weight)

    def num_parameters(self) -> int:
        """Unique parameters of both models (the shared embeddings counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def train_flops(self, seq_len: int, masked_share: float) -> int:
        """Estimated training FLOPs of one sequence of ``seq_len`` tokens: both models' bodies on every
        position, but the generator's vocabulary projection only on the ``masked_share`` of positions it
        predicts (its logits are (N, V)).

        Example (every position masked: both models' full cost)::

            >>> from lmforge.config import resolve_config
            >>> cfg = resolve_config("bert-tiny").replace(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=50)
            >>> pair = ElectraPretrainer.from_config(cfg, generator_size=0.5)
            >>> pair.train_flops(8, 1.0) == pair.discriminator.train_flops(8) + pair.generator.train_flops(8)
            True
        """
        gen = self.generator.config
        unmasked_head = 6 * gen.vocab_size * gen.embed_dim * seq_len * (1 - masked_share)
        return self.discriminator.train_flops(seq_len) + self.generator.train_flops(seq_len) - round(unmasked_head)

    @property
    def saved_model(self) -> Transformer:
        """The model a finished run saves (``RUN/model``): the discriminator, with its RTD head."""
        return self.discriminator

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                sampling_noise: torch.Tensor | None = None) -> ElectraOutput:
        """One ELECTRA step's losses.

        Args:
            input_ids: (B, T) masked ids. attention_mask: (B, T) 1 on real tokens (default: all real; the
                Trainer counts the RTD term's targets in it, so its batches must carry it).
            labels: (B, T) original ids at the masked positions, -100 elsewhere.
            sampling_noise: (B, T) U[0, 1) per position for the generator's sample (default: drawn from
                torch's generator).
        """
        if labels is None:
            raise ValueError("ELECTRA's forward needs labels: the original ids at the masked positions")
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        masked = labels != IGNORE_INDEX  # (B, T)
        n_masked = int(masked.sum())
        gen = self.generator(input_ids, attention_mask, token_type_ids, labels=labels)  # logits (N, V)
        with torch.no_grad():
            noise = (sampling_noise[masked] if sampling_noise is not None
                     else torch.rand(n_masked, device=input_ids.device))  # (N,)
            sampled = sample_tokens(gen.logits.detach(), noise)  # (N,), row-major like labels[masked]
        corrupted = input_ids.masked_scatter(masked, sampled)  # (B, T)
        original = torch.where(masked, labels, input_ids)  # (B, T)
        # A sample that equals the original is no replacement: the label compares ids, not "was masked".
        rtd_labels = torch.where(real, (corrupted != original).long(), IGNORE_INDEX)  # (B, T)
        disc = self.discriminator(corrupted, attention_mask, token_type_ids, labels=rtd_labels)
        terms = [LossTerm("tokens", "labels", gen.loss, gen.logits),
                 LossTerm("rtd", "attention_mask", disc.loss, disc.logits, labels=rtd_labels, mask=True,
                          weight=self.rtd_weight)]
        return ElectraOutput(loss=gen.loss + self.rtd_weight * disc.loss, n_targets=n_masked, logits=gen.logits,
                             mlm_loss=gen.loss, rtd_loss=disc.loss, corrupted_ids=corrupted, rtd_labels=rtd_labels,
                             rtd_logits=disc.logits, loss_terms=terms)
