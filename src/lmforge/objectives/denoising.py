"""BART denoising: corrupt a document with composable noise functions, decode the original.

Lewis et al. (2020, "BART: Denoising Sequence-to-Sequence Pre-training for Natural Language Generation,
Translation, and Comprehension", §2.2 and Fig. 2) define five noise functions. The encoder reads the
noised document and the decoder reconstructs the original::

    token masking         A _ C D _ F .      random tokens -> <mask>
    token deletion        A C D F .          random tokens removed (the model must find where)
    text infilling        A _ D _ F .        spans with lengths ~ Poisson(3) -> ONE <mask> each; a 0-length
                                             span inserts a <mask> (the model must learn how many are missing)
    sentence permutation  F G . A B C . D E .    sentences shuffled
    document rotation     E . F G . A B C . D    rotated to start at a random token

Each function below is a pure, seeded transform of a 1-D tensor. ``BartDenoising`` applies them in
fairseq's order (permute, then token-level noise, then rotate). The defaults are the paper's final
setting: infill 30% of the tokens and permute every document's sentences.

Sentences come either from ``sentence_end_ids`` (full stop, or an end-of-sentence id; the end token
closes its sentence) or from the example itself, given as a list of sentences (explicit boundaries).

Targets are the original document, framed like the input (``[bos] x eos``).
``decoder_input_ids = shift_right(labels)`` starts with ``decoder_start_token_id``, which defaults to
eos as in BART.

Example::

    >>> bart = BartDenoising(mask_token_id=4, eos_token_id=2, pad_token_id=1, bos_token_id=0,
    ...                      sentence_end_ids=[5], seed=0)
    >>> batch = bart([[10, 11, 12, 5, 13, 14, 5], [[20, 21, 5], [22, 5]]])
    >>> batch["labels"].tolist()  # the originals, framed, padded with -100
    [[0, 10, 11, 12, 5, 13, 14, 5, 2], [0, 20, 21, 5, 22, 5, 2, -100, -100]]
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import torch

from lmforge.objectives.base import Seeded, as_ids, place_spans, split_sentences
from lmforge.objectives.decoder_layout import check_layout, layout_batch


def token_masking(tokens: torch.Tensor, prob: float, mask_token_id: int, generator=None) -> torch.Tensor:
    """Replace each token by ``mask_token_id`` with probability ``prob``. (T,) -> (T,)"""
    hit = torch.rand(len(tokens), generator=generator) < prob
    return tokens.masked_fill(hit, mask_token_id)


def token_deletion(tokens: torch.Tensor, prob: float, generator=None) -> torch.Tensor:
    """Delete each token with probability ``prob``. (T,) -> (T',), T' <= T"""
    return tokens[torch.rand(len(tokens), generator=generator) >= prob]


def poisson_span_lengths(budget: int, poisson_lambda: float, generator=None) -> torch.Tensor:
    """Poisson(lambda) span lengths (zeros included) covering exactly ``budget`` tokens; the last is cut. (k,)"""
    lengths = torch.zeros(0, dtype=torch.long)
    if budget == 0:
        return lengths
    while lengths.sum() < budget:  # almost always one round: `budget` draws have mean sum lambda * budget
        draws = torch.poisson(torch.full((budget,), float(poisson_lambda)), generator=generator).long()
        lengths = torch.cat([lengths, draws])
    ends = torch.cumsum(lengths, 0)
    k = int(torch.searchsorted(ends, budget)) + 1  # first span whose end reaches the budget
    lengths = lengths[:k]
    lengths[-1] -= int(ends[k - 1]) - budget
    return lengths


def text_infilling(
    tokens: torch.Tensor, ratio: float, mask_token_id: int, generator=None, poisson_lambda: float = 3.0
) -> torch.Tensor:
    """Replace spans covering round(ratio * T) tokens by a single ``<mask>`` each. (T,) -> (T',)

    Span lengths ~ Poisson(lambda). A 0-length span inserts a ``<mask>`` between two kept tokens. Spans
    never overlap, so every span gives exactly one ``<mask>``, and the kept tokens keep their order.
    """
    n = len(tokens)
    lengths = poisson_span_lengths(round(ratio * n), poisson_lambda, generator)  # (k,)
    k = len(lengths)
    starts = place_spans(n, lengths, generator)  # (k,)
    # Coverage by a difference array: +1 where a span starts, -1 where it ends (0-length spans cancel out).
    delta = torch.zeros(n + 1, dtype=torch.long)
    delta.index_add_(0, starts, torch.ones(k, dtype=torch.long))
    delta.index_add_(0, starts + lengths, -torch.ones(k, dtype=torch.long))
    kept = tokens[torch.cumsum(delta, 0)[:n] == 0]
    # Mask j lands after the kept tokens before span j (its start minus earlier span lengths) and the j
    # earlier masks.
    earlier = torch.cumsum(lengths, 0) - lengths
    is_mask = torch.zeros(len(kept) + k, dtype=torch.bool)
    is_mask[starts - earlier + torch.arange(k)] = True
    out = torch.full((len(kept) + k,), mask_token_id, dtype=torch.long)
    out[~is_mask] = kept
    return out


def sentence_permutation(
    tokens: torch.Tensor,
    generator=None,
    *,
    sentence_end_ids: Iterable[int] | None = None,
    sentence_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """Shuffle the sentences of a document. (T,) -> (T,)

    Sentences end at (and include) any id in ``sentence_end_ids``; tokens after the last end form one
    more sentence. Or pass the ``sentence_lengths`` directly; they must sum to T.
    """
    if sentence_lengths is None:
        sentences = split_sentences(tokens, () if sentence_end_ids is None else sentence_end_ids)
    elif sum(sentence_lengths) != len(tokens):
        raise ValueError(f"sentence lengths sum to {sum(sentence_lengths)}, the document has {len(tokens)} tokens")
    else:
        sentences = tokens.split(list(sentence_lengths))
    order = torch.randperm(len(sentences), generator=generator)
    return torch.cat([sentences[i] for i in order]) if sentences else tokens


def document_rotation(tokens: torch.Tensor, generator=None) -> torch.Tensor:
    """Rotate the document to start at a uniformly chosen token. (T,) -> (T,)"""
    if len(tokens) == 0:
        return tokens
    start = int(torch.randint(len(tokens), (), generator=generator))
    return torch.cat([tokens[start:], tokens[:start]])


def _split_example(example) -> tuple[torch.Tensor, list[int] | None]:
    """A flat id sequence, or a list of sentences -> (tokens (T,), sentence lengths or None)."""
    if isinstance(example, torch.Tensor) or len(example) == 0 or isinstance(example[0], numbers.Integral):
        return as_ids(example), None
    sentences = [as_ids(s) for s in example]
    return torch.cat(sentences), [len(s) for s in sentences]


class BartDenoising(Seeded):
    """BART collator: documents -> encoder ``input_ids``/``attention_mask`` (B, S), decoder ``labels``/
    ``decoder_input_ids``/``decoder_attention_mask`` (B, L).

    Args:
        mask_token_id, eos_token_id, pad_token_id: ids of ``<mask>``, ``</s>`` and padding.
        bos_token_id: if set, both input and target start with it (BART's ``<s>``).
        decoder_start_token_id: first decoder input; defaults to ``eos_token_id`` (as in BART).
        sentence_end_ids: ids that close a sentence, for permuting flat documents.
        mask_prob: per-token probability of token masking.
        delete_prob: per-token probability of token deletion.
        infill_ratio: share of the tokens removed by text infilling; ``poisson_lambda``: mean span length.
        permute_prob: probability that a document's sentences are shuffled.
        rotate_prob: probability that a document is rotated.
        layout: ``seq2seq`` (encoder-decoder), or ``decoder`` / ``prefix-lm``: input and target concatenated
            for one decoder stack, loss on the target (:mod:`lmforge.objectives.decoder_layout`).
        seed: seed of the generator that drives every noise function.
    """

    def __init__(
        self,
        *,
        mask_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
        bos_token_id: int | None = None,
        decoder_start_token_id: int | None = None,
        sentence_end_ids: Iterable[int] = (),
        mask_prob: float = 0.0,
        delete_prob: float = 0.0,
        infill_ratio: float = 0.3,
        poisson_lambda: float = 3.0,
        permute_prob: float = 1.0,
        rotate_prob: float = 0.0,
        layout: str = "seq2seq",
        seed: int = 0,
    ):
        super().__init__(seed)
        self.layout = check_layout(layout)
        for name, value in [("mask_prob", mask_prob), ("delete_prob", delete_prob), ("infill_ratio", infill_ratio),
                            ("permute_prob", permute_prob), ("rotate_prob", rotate_prob)]:
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if poisson_lambda <= 0:
            raise ValueError(f"poisson_lambda must be > 0, got {poisson_lambda}")
        self.mask_token_id, self.eos_token_id, self.pad_token_id = mask_token_id, eos_token_id, pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = eos_token_id if decoder_start_token_id is None else decoder_start_token_id
        self.sentence_end_ids = list(sentence_end_ids)
        self.mask_prob, self.delete_prob, self.infill_ratio = mask_prob, delete_prob, infill_ratio
        self.poisson_lambda, self.permute_prob, self.rotate_prob = poisson_lambda, permute_prob, rotate_prob

    def noise(self, tokens: torch.Tensor, sentence_lengths: list[int] | None = None) -> torch.Tensor:
        """Apply the configured noise functions to one unframed document. (T,) -> (T',)"""
        g = self.generator
        if self.permute_prob and self._coin(self.permute_prob):
            tokens = sentence_permutation(tokens, g, sentence_end_ids=self.sentence_end_ids,
                                          sentence_lengths=sentence_lengths)
        if self.mask_prob:
            tokens = token_masking(tokens, self.mask_prob, self.mask_token_id, g)
        if self.delete_prob:
            tokens = token_deletion(tokens, self.delete_prob, g)
        if self.infill_ratio:
            tokens = text_infilling(tokens, self.infill_ratio, self.mask_token_id, g, self.poisson_lambda)
        if self.rotate_prob and self._coin(self.rotate_prob):
            tokens = document_rotation(tokens, g)
        return tokens

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        bos = torch.tensor([] if self.bos_token_id is None else [self.bos_token_id], dtype=torch.long)
        eos = torch.tensor([self.eos_token_id])
        sources, targets = [], []
        for example in examples:
            tokens, sentence_lengths = _split_example(example)
            sources.append(torch.cat([bos, self.noise(tokens, sentence_lengths), eos]))
            targets.append(torch.cat([bos, tokens, eos]))
        return layout_batch(sources, targets, self.pad_token_id, self.decoder_start_token_id, self.layout)
