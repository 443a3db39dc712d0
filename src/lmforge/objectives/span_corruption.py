"""Span corruption (T5): drop random spans, replace each with a unique sentinel, decode the spans.

Raffel et al. (2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
§3.1.4 and Fig. 2) corrupt 15% of the tokens (``noise_density``) in spans of mean length 3. Each span
becomes one sentinel ``<extra_id_i>`` in the encoder input. The target lists each sentinel followed by the
tokens it replaced::

    original  Thank you for inviting me to your party last week .
    inputs    Thank you <X> me to your party <Y> week . </s>
    targets   <X> for inviting <Y> last <Z> </s>

``<Z>`` closes the target because the text ends with kept tokens ("week ."). T5's random masks always
end with a noise span, so their targets end with that span's tokens and then EOS. A closing sentinel
appears exactly when the text ends with kept tokens, as in T5's ``nonnoise_span_to_unique_sentinel``.
Because the sentinels are numbered per noise span, a hand-made mask that starts with noise also stays
aligned.

The mask follows T5's ``random_spans_noise_mask``. It uses num_noise = round(length * density) and
num_spans = round(num_noise / mean_length). Kept and noise segments alternate, starting with kept, and
both are cut into num_spans non-empty pieces uniformly at random.
``compute_input_and_target_lengths`` follows T5's ``random_spans_helper``: it gives the raw block length
that yields exactly ``inputs_length`` inputs, EOS included, so packed blocks need no padding.

Example::

    >>> expanded, targets_length = compute_input_and_target_lengths(512, 0.15, 3.0)
    >>> expanded, targets_length
    (568, 114)
    >>> t5 = SpanCorruption(sentinel_ids=list(range(999, 899, -1)), eos_token_id=1, pad_token_id=0, seed=0)
    >>> batch = t5([list(range(2, 2 + expanded))] * 2)
    >>> batch["input_ids"].shape, batch["labels"].shape  # (B, inputs_length), (B, targets_length)
    (torch.Size([2, 512]), torch.Size([2, 114]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import Seeded, as_ids
from lmforge.objectives.decoder_layout import check_layout, layout_batch


def compute_input_and_target_lengths(
    inputs_length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0
) -> tuple[int, int]:
    """Raw block length and target length for span corruption without padding (T5's ``random_spans_helper``).

    Returns:
        ``(expanded_inputs_length, targets_length)``. A block of ``expanded_inputs_length`` tokens becomes
        ``inputs_length`` encoder tokens and ``targets_length`` decoder tokens, EOS included in both.
    """

    def corrupted_lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        # Inputs: kept tokens + one sentinel per span + EOS. Targets: noise + one sentinel per span + EOS.
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length
    while corrupted_lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    targets_length = corrupted_lengths(tokens_length)[1]
    # T5's adjustment: at density 0.5, make targets as long as inputs (likely a round number).
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def _random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> torch.Tensor:
    """Split ``num_items`` into ``num_segments`` non-empty parts, every split equally likely. (num_segments,)"""
    # Choose num_segments - 1 distinct cut points among the num_items - 1 gaps between items.
    cuts = torch.randperm(num_items - 1, generator=generator)[: num_segments - 1].sort().values + 1
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([num_items])])
    return bounds.diff()


def random_spans_noise_mask(
    length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """T5 noise mask: (length,) bool, True on noise. Alternates kept/noise spans, starting with kept."""
    if noise_density == 0.0 or length == 0:
        return torch.zeros(length, dtype=torch.bool)
    orig_length, length = length, max(length, 2)  # T5 computes a length-1 mask on length 2, then cuts it
    # At least one noise and one kept token, so both segmentations below are well defined.
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)  # (S,)
    kept_lengths = _random_segmentation(length - num_noise, num_spans, generator)  # (S,)
    span_lengths = torch.stack([kept_lengths, noise_lengths], dim=1).flatten()  # (2S,) kept, noise, kept, ...
    is_noise = torch.tensor([False, True]).repeat(num_spans)  # (2S,)
    return torch.repeat_interleave(is_noise, span_lengths)[:orig_length]


def corrupt_spans(
    tokens: torch.Tensor, noise_mask: torch.Tensor, sentinel_ids: Sequence[int] | torch.Tensor, eos_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a noise mask: (T,) tokens, (T,) bool mask -> (inputs, targets), each ending with EOS.

    Noise span i becomes ``sentinel_ids[i]`` in the inputs. The targets are ``sentinel_ids[i]`` + span i for
    every span, then ``sentinel_ids[num_spans]`` if the text ends with kept tokens, then EOS.
    """
    sentinels = torch.as_tensor(sentinel_ids, dtype=torch.long)
    prev_noise = torch.cat([torch.tensor([False]), noise_mask[:-1]])
    first_noise = noise_mask & ~prev_noise  # (T,) span starts
    span_id = torch.cumsum(first_noise.long(), 0) - 1  # (T,) index of the span each noise token is in
    num_spans = int(first_noise.sum())
    closing = bool(len(tokens)) and not bool(noise_mask[-1])
    if num_spans + closing > len(sentinels):
        raise ValueError(f"{num_spans + closing} sentinels needed, only {len(sentinels)} given")

    eos = torch.tensor([eos_token_id])
    # Inputs: the first token of each span becomes its sentinel, the rest of the span is dropped.
    replaced = torch.where(first_noise, sentinels[span_id.clamp(min=0)], tokens)
    inputs = torch.cat([replaced[~(noise_mask & prev_noise)], eos])

    # Targets: noise tokens in order, each span preceded by its sentinel, so noise token n moves right by
    # (its span index + 1) and sentinel i sits just before the first token of span i.
    noise_tokens = tokens[noise_mask]
    position = torch.arange(len(noise_tokens)) + span_id[noise_mask] + 1  # (N,)
    targets = torch.empty(len(noise_tokens) + num_spans, dtype=torch.long)
    targets[position] = noise_tokens
    targets[position[first_noise[noise_mask]] - 1] = sentinels[:num_spans]
    closing_sentinel = sentinels[num_spans : num_spans + 1] if closing else sentinels[:0]
    return inputs, torch.cat([targets, closing_sentinel, eos])


class SpanCorruption(Seeded):
    """T5 span-corruption collator: raw token blocks -> encoder ``input_ids``/``attention_mask`` (B, S) and
    decoder ``labels``/``decoder_input_ids``/``decoder_attention_mask`` (B, L).

    Args:
        sentinel_ids: ids of ``<extra_id_0>``, ``<extra_id_1>``, ... in that order. T5 counts them down from
            the end of the vocabulary, but any ids work.
        eos_token_id, pad_token_id: appended to inputs and targets / used for padding.
        decoder_start_token_id: first decoder input; defaults to ``pad_token_id``, as in T5.
        noise_density, mean_noise_span_length: T5 defaults 0.15 and 3.
        layout: ``seq2seq`` (encoder-decoder), or ``decoder`` / ``prefix-lm``: input and target concatenated
            for one decoder stack, loss on the target (:mod:`lmforge.objectives.decoder_layout`).
        seed: seed of the generator that draws the masks.
    """

    def __init__(
        self,
        *,
        sentinel_ids: Sequence[int],
        eos_token_id: int,
        pad_token_id: int,
        decoder_start_token_id: int | None = None,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0,
        layout: str = "seq2seq",
        seed: int = 0,
    ):
        super().__init__(seed)
        self.layout = check_layout(layout)
        if len(sentinel_ids) == 0:
            raise ValueError("span corruption needs sentinel ids (<extra_id_0>, <extra_id_1>, ...)")
        self.sentinel_ids = torch.as_tensor(list(sentinel_ids), dtype=torch.long)
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.decoder_start_token_id = pad_token_id if decoder_start_token_id is None else decoder_start_token_id
        self.noise_density, self.mean_noise_span_length = noise_density, mean_noise_span_length

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        inputs, targets = [], []
        for x in examples:
            tokens = as_ids(x)
            mask = random_spans_noise_mask(len(tokens), self.noise_density, self.mean_noise_span_length, self.generator)
            source, target = corrupt_spans(tokens, mask, self.sentinel_ids, self.eos_token_id)
            inputs.append(source)
            targets.append(target)
        return layout_batch(inputs, targets, self.pad_token_id, self.decoder_start_token_id, self.layout)
