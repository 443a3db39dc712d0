"""Plumbing shared by the pre-training objectives: seeded randomness, padding, shifting, span placement.

Every objective is a batch transform (a collator): ``objective(examples) -> dict[str, Tensor]``, applied on
the fly so that each epoch sees fresh noise (RoBERTa's "dynamic masking"). Randomness comes from one
``torch.Generator`` per objective, so a batch is a pure function of (seed, batches drawn so far), and
``state_dict()`` / ``load_state_dict()`` let a resumed run draw exactly the batch it would have drawn.

Example::

    >>> import torch
    >>> from lmforge.objectives.base import pad, shift_right
    >>> ids, real = pad([[5, 6, 7], [8]], pad_value=0)
    >>> ids.tolist(), real.tolist()
    ([[5, 6, 7], [8, 0, 0]], [[True, True, True], [True, False, False]])
    >>> shift_right(torch.tensor([[5, 6, -100]]), start_id=1, pad_id=0).tolist()
    [[1, 5, 6]]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from lmforge.nn.labels import IGNORE_INDEX, shift_right


def as_ids(sequence: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """One example as a 1-D LongTensor (a list, tuple or tensor of token ids)."""
    ids = torch.as_tensor(sequence, dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"an example must be a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    return ids


def id_set(ids: Iterable[int | None]) -> torch.Tensor:
    """Distinct ids (``None`` dropped) as a sorted LongTensor, ready for ``torch.isin``."""
    return torch.tensor(sorted({int(i) for i in ids if i is not None}), dtype=torch.long)


def pad(sequences: Sequence, pad_value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ragged sequences.

    Returns:
        ``(ids, real)``: ``ids`` (B, T) long padded with ``pad_value``; ``real`` (B, T) bool, True on
        real tokens. ``real`` comes from the lengths, not from comparing with ``pad_value``, because a pad
        id may legitimately occur inside a sequence (e.g. T5 uses 0 for both pad and decoder start).
    """
    if len(sequences) == 0:
        raise ValueError("cannot build a batch from zero examples")
    seqs = [as_ids(s) for s in sequences]
    lengths = torch.tensor([len(s) for s in seqs])  # (B,)
    ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad_value)  # (B, T)
    real = torch.arange(ids.size(1)) < lengths[:, None]  # (B, T)
    return ids, real


def pad_labels(sequences: Sequence) -> torch.Tensor:
    """Right-pad target sequences with IGNORE_INDEX, so padding never contributes to the loss. (B, T)"""
    return pad(sequences, IGNORE_INDEX)[0]


def split_sentences(tokens: torch.Tensor, sentence_end_ids: Iterable[int] | torch.Tensor) -> list[torch.Tensor]:
    """Cut a document (T,) into its sentences: each ends at, and includes, a token of ``sentence_end_ids``;
    tokens after the last end form one more sentence. An empty document has no sentence.

    Example:
        >>> [s.tolist() for s in split_sentences(torch.tensor([5, 6, 9, 7, 9, 8]), [9])]
        [[5, 6, 9], [7, 9], [8]]
    """
    ends_at = sentence_end_ids if isinstance(sentence_end_ids, torch.Tensor) else id_set(sentence_end_ids)
    ends = torch.isin(tokens, ends_at).nonzero().squeeze(1) + 1  # exclusive ends
    bounds = torch.unique(torch.cat([torch.tensor([0]), ends, torch.tensor([len(tokens)])]))
    return list(tokens.split(bounds.diff().tolist())) if len(tokens) else []


def next_token_batch(examples: Sequence, pad_id: int, min_tokens: int,
                     too_short: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of decoder-only objectives: ``(input_ids, real, labels)``, each (B, T).

    ``input_ids`` are each sequence without its last token, ``labels`` without its first (aligned: labels[t] =
    x[t+1]); ``real`` marks the non-padding inputs. A sequence shorter than ``min_tokens`` raises
    ``ValueError(too_short)``.

    Example:
        >>> ids, real, labels = next_token_batch([[5, 6, 7], [8, 9]], pad_id=0, min_tokens=2, too_short="too short")
        >>> ids.tolist(), labels.tolist()
        ([[5, 6], [8, 0]], [[6, 7], [9, -100]])
    """
    seqs = [as_ids(x) for x in examples]
    if any(len(s) < min_tokens for s in seqs):
        raise ValueError(too_short)
    input_ids, real = pad([s[:-1] for s in seqs], pad_id)  # (B, T) each
    return input_ids, real, pad_labels([s[1:] for s in seqs])


def seq2seq_batch(sources: Sequence, targets: Sequence, pad_id: int, start_id: int) -> dict[str, torch.Tensor]:
    """Encoder-decoder inputs from source and target id sequences (reconstruct ``targets`` from ``sources``).

    Returns ``input_ids``/``attention_mask`` (B, S), ``labels`` (B, L) with IGNORE_INDEX at padding, and
    the teacher-forcing ``decoder_input_ids``/``decoder_attention_mask`` (B, L).
    """
    input_ids, real = pad(sources, pad_id)  # (B, S) each
    labels = pad_labels(targets)  # (B, L)
    return {
        "input_ids": input_ids,
        "attention_mask": real.long(),
        "labels": labels,
        "decoder_input_ids": shift_right(labels, start_id, pad_id),
        "decoder_attention_mask": (labels != IGNORE_INDEX).long(),
    }


def place_spans(length: int, span_lengths: torch.Tensor, generator: torch.Generator, gap: int = 0) -> torch.Tensor:
    """Random start positions for non-overlapping spans laid out, in the given order, on ``length`` items.

    Every layout that keeps the spans in order with at least ``gap`` untouched items between neighbours is
    equally likely. The trick: with ``free`` items left over after the spans and the mandatory gaps, a
    layout is a choice of which ``k`` of ``free + k`` slots are spans.

    Args:
        span_lengths: (k,) non-negative lengths (zero-length spans are insertion points).
    Returns:
        (k,) long start positions, non-decreasing.
    """
    k = len(span_lengths)
    free = length - int(span_lengths.sum()) - gap * max(k - 1, 0)
    if free < 0:
        raise ValueError(f"spans of total length {int(span_lengths.sum())} (gap {gap}) do not fit in {length} items")
    slots = torch.randperm(free + k, generator=generator)[:k].sort().values  # (k,)
    order = torch.arange(k)
    earlier = torch.cumsum(span_lengths, 0) - span_lengths  # (k,) total length of the spans before each
    # start = free items before the span (slot minus the spans before it) + earlier spans + earlier gaps
    return slots - order + earlier + gap * order


class Seeded:
    """Owns the objective's ``torch.Generator`` and exposes it for exact resume."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict:
        """``{"generator": ByteTensor}``: everything needed to redraw the next batch exactly."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def _coin(self, prob: float) -> bool:
        """One Bernoulli(prob) draw from the objective's generator."""
        return bool(torch.rand((), generator=self.generator) < prob)
