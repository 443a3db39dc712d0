"""mBART: multilingual denoising pre-training with language-id tokens (Liu et al. 2020, §2.1-2.2).

BART's denoising (:mod:`lmforge.objectives.denoising`) run on many languages at once. Two noise functions,
the paper's: the sentences of each instance are permuted, and spans covering 35% of its words are replaced
by one ``<mask>`` each, with lengths ~ Poisson(3.5). Each sequence ends with a language-id token ``<LID>``,
which also starts the decoder, so one model learns every language and is told which one to write::

    encoder input     noise(X)  </s>  <LID>
    decoder input     <LID>  X  </s>                 (the target shifted right: <LID> starts decoding)
    labels            X  </s>  <LID>

Language ids are tokens added after the tokenizer's vocabulary (:func:`language_token_ids`): language i of
``languages`` is id ``vocab_size + i``, so the model's embedding grows by one row per language, learned with
the rest. Batches come from :class:`lmforge.data.language_mixture.LanguageMixture` (one language per batch,
sampled with temperature alpha): every example is a ``(language, ids)`` pair.

Fine-tuning for translation (§3) frames a sentence pair the same way, with the source's language id after the
source and the target's language id starting the decoder: :class:`LanguagePairs`. A fine-tuned model then
translates with ``decoder_start_token_id`` = the target language's id.

Example:
    >>> mbart = MultilingualDenoising(mask_token_id=4, eos_token_id=2, pad_token_id=1, vocab_size=50,
    ...                               languages=["en", "es"], infill_ratio=0.0, permute_prob=0.0)
    >>> batch = mbart([("es", [10, 11, 12])])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist(), batch["decoder_input_ids"].tolist()
    ([[10, 11, 12, 2, 51]], [[10, 11, 12, 2, 51]], [[51, 10, 11, 12, 2]])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.objectives.base import as_ids, seq2seq_batch
from lmforge.objectives.denoising import BartDenoising, _split_example

LANGUAGES_FILE = "languages.json"  # {"en": id, ...}: what a model folder of such a run records


def language_token_ids(vocab_size: int, languages: Sequence[str]) -> dict[str, int]:
    """Language i -> id ``vocab_size + i``: tokens added after a tokenizer's ``vocab_size`` ids.

    Example:
        >>> language_token_ids(1000, ["en", "es"])
        {'en': 1000, 'es': 1001}
    """
    if len(set(languages)) != len(languages) or not languages:
        raise UserInputError(f"languages={list(languages)!r}: give one or more distinct language codes")
    return {lang: vocab_size + i for i, lang in enumerate(languages)}


def _framed(ids: torch.Tensor, eos: int, lid: int) -> torch.Tensor:
    return torch.cat([ids, torch.tensor([eos, lid])])  # X </s> <LID>


def _with_language_starts(batch: dict[str, torch.Tensor], starts: Sequence[int]) -> dict[str, torch.Tensor]:
    """Each row's decoder starts with its own language id (seq2seq_batch shifts in one shared start id)."""
    batch["decoder_input_ids"][:, 0] = torch.tensor(list(starts))
    return batch


class MultilingualDenoising(BartDenoising):
    """mBART's collator: ``(language, ids)`` examples -> an encoder-decoder batch (see the module docstring).

    Args:
        mask_token_id, eos_token_id, pad_token_id: the tokenizer's ids.
        vocab_size: the tokenizer's vocabulary size; language ids follow it.
        languages: language codes, in the order that fixes their ids (a run takes them from its data folder).
        sentence_end_ids: ids that end a sentence, for the permutation.
        infill_ratio: share of tokens masked in spans (mBART: 0.35); ``poisson_lambda``: mean span length (3.5).
        permute_prob: probability that an instance's sentences are permuted (mBART: always).
        alpha: temperature of the language sampling of the batches this objective reads (mBART: 0.7; a
            pre-training run builds its :class:`~lmforge.data.language_mixture.LanguageMixture` with it).
        seed: seed of the noise.
    """

    multilingual = True  # a pre-training run reads one data folder per language (lmforge.training.pretrain)

    def __init__(self, *, mask_token_id: int, eos_token_id: int, pad_token_id: int, vocab_size: int,
                 languages: Sequence[str], sentence_end_ids: Iterable[int] = (), infill_ratio: float = 0.35,
                 poisson_lambda: float = 3.5, permute_prob: float = 1.0, alpha: float = 0.7, seed: int = 0):
        super().__init__(mask_token_id=mask_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                         sentence_end_ids=sentence_end_ids, infill_ratio=infill_ratio, poisson_lambda=poisson_lambda,
                         permute_prob=permute_prob, seed=seed)
        self.languages = list(languages)
        if not 0.0 <= alpha <= 1.0:
            raise UserInputError(f"alpha={alpha}: the language sampling temperature must be in [0, 1] (mBART: 0.7)")
        self.alpha = alpha
        self.language_ids = language_token_ids(vocab_size, self.languages)

    def lid(self, language: str) -> int:
        if language not in self.language_ids:
            raise UserInputError(f"language {language!r} is not one of this run's {self.languages}")
        return self.language_ids[language]

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        sources, targets, starts = [], [], []
        for example in examples:
            if not (isinstance(example, (tuple, list)) and len(example) == 2 and isinstance(example[0], str)):
                raise ValueError("multilingual denoising takes (language, ids) examples (a LanguageMixture's batches)")
            language, ids = example
            tokens, sentence_lengths = _split_example(ids)
            lid = self.lid(language)
            sources.append(_framed(self.noise(tokens, sentence_lengths), self.eos_token_id, lid))
            targets.append(_framed(tokens, self.eos_token_id, lid))
            starts.append(lid)
        return _with_language_starts(seq2seq_batch(sources, targets, self.pad_token_id, self.eos_token_id), starts)


class LanguagePairs:
    """mBART's translation fine-tuning batches: ``(source ids, target ids)`` pairs of one direction.

    encoder ``X </s> <src>``; labels ``Y </s> <tgt>``; decoder input ``<tgt> Y </s>``. Stateless.

    Example:
        >>> pairs = LanguagePairs(eos_token_id=2, pad_token_id=1, source_id=50, target_id=51)
        >>> b = pairs([([7, 8], [9])])
        >>> b["input_ids"].tolist(), b["labels"].tolist(), b["decoder_input_ids"].tolist()
        ([[7, 8, 2, 50]], [[9, 2, 51]], [[51, 9, 2]])
    """

    def __init__(self, *, eos_token_id: int, pad_token_id: int, source_id: int, target_id: int) -> None:
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.source_id, self.target_id = source_id, target_id

    def source(self, ids) -> torch.Tensor:
        """One source sentence framed for the encoder: ``X </s> <src>``."""
        return _framed(as_ids(ids), self.eos_token_id, self.source_id)

    def __call__(self, pairs: Sequence) -> dict[str, torch.Tensor]:
        sources = [self.source(s) for s, _ in pairs]
        targets = [_framed(as_ids(t), self.eos_token_id, self.target_id) for _, t in pairs]
        return seq2seq_batch(sources, targets, self.pad_token_id, self.target_id)
