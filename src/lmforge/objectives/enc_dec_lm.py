"""Encoder-decoder language modelling (T5's "prefix language modeling"): read a prefix, write the rest.

Raffel et al. (2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
§3.2.3 and §3.3.1, Table 3) take a span of text and choose a random point to split it into a prefix and a
target. The encoder reads the prefix (bidirectionally) and the decoder predicts the rest, left to right::

    original   Thank you for inviting me to your party last week .
    inputs     Thank you for inviting </s>
    targets    me to your party last week . </s>

It is the encoder-decoder counterpart of a decoder-only prefix LM (:mod:`lmforge.objectives.prefix_lm`),
and the baseline that T5's denoising objectives beat.

The split point. An example of T >= 2 tokens is cut after P tokens, P ~ Uniform{1, ..., T - 1}, so both
sides hold at least one token: T5's ``random_prefix_noise_mask`` at its ``prefix_lm`` noise density 0.5.
A one-token example (the tail of a document cut into segments) cannot be split; its token is the target
and the encoder reads an empty prefix.

Framing. Both sides end with EOS, as in T5. With ``bos_token_id`` (BART), the encoder input starts with
it, as BART's inputs do; the target continues the text, so it opens with no BOS. ``labels`` are the target,
padded with -100, and ``decoder_input_ids = shift_right(labels)`` start with ``decoder_start_token_id``
(default the pad id, as in T5; BART's tokenizer says ``</s>``).

Example::

    >>> lm = EncDecLM(eos_token_id=1, pad_token_id=0, seed=3)
    >>> batch = lm([[5, 6, 7, 8, 9], [10, 11]])  # split as [5 6 7 | 8 9] and [10 | 11] (the only split of two)
    >>> batch["input_ids"].tolist()  # (B, S): prefix + EOS, padded
    [[5, 6, 7, 1], [10, 1, 0, 0]]
    >>> batch["labels"].tolist()  # (B, L): the rest + EOS, padding ignored
    [[8, 9, 1], [11, 1, -100]]
    >>> batch["decoder_input_ids"].tolist()  # labels shifted right behind the start id (T5: pad)
    [[0, 8, 9], [0, 11, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import Seeded, as_ids, seq2seq_batch


def split_point(length: int, generator: torch.Generator) -> int:
    """Prefix length P ~ Uniform{1, ..., length - 1}: at least one token on each side (0 if length < 2)."""
    if length < 2:
        return 0
    return int(torch.randint(1, length, (), generator=generator))


class EncDecLM(Seeded):
    """Encoder-decoder LM collator: texts -> encoder ``input_ids``/``attention_mask`` (B, S) holding a random
    prefix, decoder ``labels``/``decoder_input_ids``/``decoder_attention_mask`` (B, L) holding the rest.

    Args:
        eos_token_id, pad_token_id: ids that close both sides / pad them.
        bos_token_id: if set, the encoder input starts with it (BART's ``<s>``).
        decoder_start_token_id: first decoder input; defaults to ``pad_token_id``, as in T5.
        seed: seed of the generator that draws the split points.
    """

    def __init__(
        self,
        *,
        eos_token_id: int,
        pad_token_id: int,
        bos_token_id: int | None = None,
        decoder_start_token_id: int | None = None,
        seed: int = 0,
    ):
        super().__init__(seed)
        self.eos_token_id, self.pad_token_id, self.bos_token_id = eos_token_id, pad_token_id, bos_token_id
        self.decoder_start_token_id = pad_token_id if decoder_start_token_id is None else decoder_start_token_id

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        bos = torch.tensor([] if self.bos_token_id is None else [self.bos_token_id], dtype=torch.long)
        eos = torch.tensor([self.eos_token_id])
        sources, targets = [], []
        for example in examples:
            tokens = as_ids(example)  # (T,)
            p = split_point(len(tokens), self.generator)
            sources.append(torch.cat([bos, tokens[:p], eos]))  # (P + 1 or 2,)
            targets.append(torch.cat([tokens[p:], eos]))  # (T - P + 1,)
        return seq2seq_batch(sources, targets, self.pad_token_id, self.decoder_start_token_id)
