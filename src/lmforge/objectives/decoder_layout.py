"""Seq2seq objectives on a single decoder stack: input and target concatenated, loss on the target only.

Raffel et al. (2020, §3.2, Table 2) train every architecture with the same denoising objective. An
encoder-decoder reads the corrupted input in its encoder and decodes the target. A decoder-only model
("Language model") and a prefix LM read one sequence instead: the corrupted input, then the target, and
predict each next token. Only the target's tokens carry loss; the input is given, not predicted::

    source  s0 s1 s2            target  y0 y1
    x       s0 s1 s2 y0 y1      input_ids = x[:-1] = s0 s1 s2 y0      labels = x[1:] with the source masked
    labels  -100 -100 y0 y1     (labels[t] = x[t+1]; position S-1 = 2, the last source token, predicts y0)

``layout``:

* ``seq2seq``: the encoder-decoder batch (``input_ids`` for the encoder, ``labels``/``decoder_input_ids``).
* ``decoder``: a causal decoder over x; ``attention_mask`` (B, T) marks the padding.
* ``prefix-lm``: as ``decoder``, but the source is a bidirectional prefix: ``attention_mask`` is the complete
  (B, T, T) causal-with-prefix mask of :func:`lmforge.objectives.prefix_lm.prefix_lm_mask` with prefix S.

Example::

    >>> batch = layout_batch([[5, 6, 7]], [[8, 9]], pad_id=0, start_id=0, layout="prefix-lm")
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[5, 6, 7, 8]], [[-100, -100, 8, 9]])
    >>> batch["attention_mask"][0].int().tolist()  # the source (3 tokens) is bidirectional
    [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.objectives.base import IGNORE_INDEX, as_ids, next_token_batch, seq2seq_batch
from lmforge.objectives.prefix_lm import prefix_lm_mask

LAYOUTS = ("seq2seq", "decoder", "prefix-lm")
LAYOUT_ARCH = {"seq2seq": "encoder-decoder", "decoder": "decoder", "prefix-lm": "decoder"}


def check_layout(layout: str) -> str:
    """``layout`` when it is one of :data:`LAYOUTS`, else a one-line error."""
    if layout not in LAYOUTS:
        raise UserInputError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    return layout


def default_layout(arch: str) -> str:
    """The layout that trains ``arch``: ``seq2seq`` for an encoder-decoder, ``decoder`` for a decoder."""
    return "decoder" if arch == "decoder" else "seq2seq"


def check_layout_fits(objective: str, layout: str, arch: str) -> None:
    """One line when ``layout`` cannot train an ``arch`` model, naming both."""
    if LAYOUT_ARCH[check_layout(layout)] != arch:
        fits = [name for name, a in LAYOUT_ARCH.items() if a == arch]
        raise UserInputError(f"objective {objective!r} with layout={layout!r} does not fit arch={arch!r}; "
                             f"use layout={' or '.join(repr(f) for f in fits)}")


def concatenated_batch(sources: Sequence, targets: Sequence, pad_id: int, prefix: bool) -> dict[str, torch.Tensor]:
    """Decoder batch of ``source + target`` sequences, with loss on the target tokens only.

    Returns ``input_ids`` (B, T), ``labels`` (B, T) (-100 on the source and padding) and ``attention_mask``:
    (B, T) padding, or with ``prefix`` the complete (B, T, T) bool mask whose prefix is the source.
    """
    srcs, tgts = [as_ids(s) for s in sources], [as_ids(t) for t in targets]
    if any(len(s) == 0 or len(t) == 0 for s, t in zip(srcs, tgts)):
        raise ValueError("a concatenated example needs a non-empty source and target")
    input_ids, real, labels = next_token_batch([torch.cat([s, t]) for s, t in zip(srcs, tgts)], pad_id, 2, "")
    n_source = torch.tensor([len(s) for s in srcs])  # (B,)
    # labels[t] = x[t+1] is a source token for t < S - 1: given, never predicted.
    in_source = torch.arange(labels.size(1))[None, :] < (n_source - 1)[:, None]  # (B, T)
    labels = labels.masked_fill(in_source, IGNORE_INDEX)
    mask = prefix_lm_mask(n_source, real) if prefix else real.long()
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def layout_batch(sources: Sequence, targets: Sequence, pad_id: int, start_id: int, layout: str) -> dict[str, torch.Tensor]:
    """The batch of (source, target) pairs in ``layout`` (see the module docstring)."""
    if check_layout(layout) == "seq2seq":
        return seq2seq_batch(sources, targets, pad_id, start_id)
    return concatenated_batch(sources, targets, pad_id, prefix=layout == "prefix-lm")
