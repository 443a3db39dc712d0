"""Masked language modelling (BERT), with optional whole-word and span (SpanBERT) masking.

BERT (Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", §3.1) selects 15% of the tokens as prediction targets. Of those, 80% become ``[MASK]``,
10% become a random token and 10% stay unchanged. The loss is taken only at the selected positions.
``[MASK]`` never appears at fine-tuning time, so the random and unchanged shares stop the model from
assuming that only ``[MASK]`` positions need good representations.

Two variants choose *which* tokens are selected:

- Whole-word masking (from BERT's later release) selects a word with all its pieces, or none of them,
  so a masked piece cannot be recovered from its sibling pieces.
- Span masking (Joshi et al., 2020, "SpanBERT: Improving Pre-training by Representing and Predicting
  Spans", §3.1) selects contiguous spans of whole words until 15% of the words are covered. Span
  lengths follow Geo(p=0.2), truncated at 10 and renormalised (mean 3.8). The 80/10/10 choice is made
  once per span, as in the paper.

Word boundaries come from ``continuation_token_ids``: the ids of pieces that continue the previous word.
These are the WordPiece ``##`` pieces, or for SentencePiece / byte-level BPE every piece *without* the
``▁`` / ``Ġ`` word-start prefix (:meth:`lmforge.tokenization.Tokenizer.continuation_ids`). The set is
computed once from the vocabulary, so each example stays a plain list of ids. ``whole_word=True`` and
``span_masking=True`` group the pieces into words with it; a piece right after a special token (or at the
start of a segment) starts a word whatever its spelling. Without it, every token is its own word.

*When* masks are drawn is the ``masking`` option: ``"dynamic"`` (RoBERTa, the default) draws a new mask
each time a batch is made; ``"static"`` (original BERT) masks each sequence once per copy, for
``static_copies`` copies (:mod:`lmforge.objectives.static_masking`).

Special tokens (``special_token_ids``, plus pad, mask, cls and sep) and padding are never selected.

Example::

    >>> mlm = MaskedLM(vocab_size=100, mask_token_id=3, pad_token_id=0, cls_token_id=1, sep_token_id=2,
    ...                add_cls_sep=True, seed=0)
    >>> batch = mlm([[10, 11, 12, 13], [14, 15]])
    >>> batch["input_ids"].shape, batch["labels"].shape  # (B, T) with T = 4 + [CLS] + [SEP]
    (torch.Size([2, 6]), torch.Size([2, 6]))
    >>> bool((batch["labels"][:, 0] == -100).all())  # [CLS] is never a target
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence

import torch

from lmforge.config import ConfigError
from lmforge.objectives.base import IGNORE_INDEX, Seeded, as_ids, id_set, pad, place_spans
from lmforge.objectives.static_masking import batch_identity, check_masking, copy_generator, copy_index


def add_cls_sep(ids: Sequence[int] | torch.Tensor, cls_token_id: int, sep_token_id: int) -> torch.Tensor:
    """BERT framing: ``[CLS] ids [SEP]``. (T,) -> (T + 2,)"""
    return torch.cat([torch.tensor([cls_token_id]), as_ids(ids), torch.tensor([sep_token_id])])


def truncated_geometric(p: float, max_length: int) -> torch.Tensor:
    """P(len = l) for l = 1..max_length, proportional to p (1-p)^(l-1). Shape (max_length,)."""
    lengths = torch.arange(1, max_length + 1, dtype=torch.float64)
    probs = p * (1 - p) ** (lengths - 1)
    return probs / probs.sum()


class MaskedLM(Seeded):
    """BERT-style MLM collator: list of token-id sequences -> ``input_ids``, ``attention_mask``, ``labels``.

    Args:
        vocab_size: random replacements are drawn uniformly from ``[0, vocab_size)`` minus the special ids.
        mask_token_id, pad_token_id: ids of ``[MASK]`` and padding.
        special_token_ids: further ids that are never selected and never drawn as random tokens.
        mlm_probability: share of (non-special) tokens, or of words, selected as targets.
        mask_prob, random_prob: shares of the selected tokens that become ``[MASK]`` / a random token.
            The rest (1 - mask_prob - random_prob) stay unchanged.
        continuation_token_ids: word boundaries (see the module docstring); used by ``whole_word`` and
            ``span_masking``.
        whole_word: select whole words (needs ``continuation_token_ids``).
        span_masking: SpanBERT spans of words, lengths ~ Geo(span_p) truncated at ``max_span_length``.
            Without ``continuation_token_ids`` the spans are spans of tokens.
        cls_token_id, sep_token_id, add_cls_sep: with ``add_cls_sep``, each example is framed as
            ``[CLS] x [SEP]`` before masking.
        masking: ``"dynamic"`` (a fresh mask per batch) or ``"static"`` (one mask per sequence and copy;
            batches must be :class:`~lmforge.data.loader.DocumentBatch` es, which say which samples they hold).
        static_copies: with static masking, epoch ``e`` shows copy ``e mod static_copies`` (BERT: 10).
        seed: seed of the generator that drives every random choice.
        static_seed: seed of the static masks (default: ``seed``). Data-parallel ranks mask dynamically
            with different seeds, but must share the static masks, which ``lmforge pretrain`` sets to the run's.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        mask_token_id: int,
        pad_token_id: int,
        special_token_ids: Iterable[int] = (),
        mlm_probability: float = 0.15,
        mask_prob: float = 0.8,
        random_prob: float = 0.1,
        continuation_token_ids: Iterable[int] | None = None,
        whole_word: bool = False,
        span_masking: bool = False,
        span_p: float = 0.2,
        max_span_length: int = 10,
        cls_token_id: int | None = None,
        sep_token_id: int | None = None,
        add_cls_sep: bool = False,
        masking: str = "dynamic",
        static_copies: int = 10,
        seed: int = 0,
        static_seed: int | None = None,
    ):
        super().__init__(seed)
        if not 0.0 <= mlm_probability <= 1.0:
            raise ValueError(f"mlm_probability must be in [0, 1], got {mlm_probability}")
        if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
            raise ValueError(f"mask_prob + random_prob must be within [0, 1], got {mask_prob} + {random_prob}")
        if add_cls_sep and (cls_token_id is None or sep_token_id is None):
            raise ValueError("add_cls_sep=True needs cls_token_id and sep_token_id")
        self.vocab_size = vocab_size
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id
        self.cls_token_id, self.sep_token_id, self.add_cls_sep = cls_token_id, sep_token_id, add_cls_sep
        self.mlm_probability, self.mask_prob, self.random_prob = mlm_probability, mask_prob, random_prob
        self.special_token_ids = id_set([*special_token_ids, pad_token_id, mask_token_id, cls_token_id, sep_token_id])
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[self.special_token_ids[self.special_token_ids < vocab_size]] = False
        self.random_pool = allowed.nonzero().squeeze(1)  # (V',) ids a random replacement may take
        if len(self.random_pool) == 0:
            raise ValueError("every id in the vocabulary is special: nothing to draw random replacements from")
        check_masking(masking, static_copies)
        if whole_word and continuation_token_ids is None:
            raise ConfigError("objective option whole_word=true needs word boundaries (continuation_token_ids), and "
                              "the tokenizer has none: use a WordPiece, BPE or Unigram tokenizer")
        words = whole_word or span_masking
        self.continuation_token_ids = id_set(continuation_token_ids) if words and continuation_token_ids is not None \
            else None
        self.whole_word, self.span_masking = whole_word, span_masking
        self.masking, self.static_copies = masking, static_copies
        self.static_seed = seed if static_seed is None else static_seed
        self.span_length_probs = truncated_geometric(span_p, max_span_length)  # (max_span_length,)

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        seqs = [as_ids(x) for x in examples]
        if self.add_cls_sep:
            seqs = [add_cls_sep(s, self.cls_token_id, self.sep_token_id) for s in seqs]
        ids, real = pad(seqs, self.pad_token_id)  # (B, T) each
        if self.masking == "static":
            input_ids, labels = self._static_masks(examples, seqs, ids)
        else:
            input_ids, labels = self.mask_tokens(ids, real)
        return {"input_ids": input_ids, "attention_mask": real.long(), "labels": labels}

    def _static_masks(self, examples: Sequence, seqs: list[torch.Tensor],
                      ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence masked on its own, by the generator of its (sample id, copy): (B, T) each."""
        epoch, sample_ids = batch_identity(examples)
        copy = copy_index(epoch, self.static_copies)
        input_ids, labels = ids.clone(), torch.full_like(ids, IGNORE_INDEX)
        for b, (seq, sample_id) in enumerate(zip(seqs, sample_ids)):
            # Unpadded, so that the mask depends on the sequence alone, not on the batch it lands in.
            g = copy_generator(self.static_seed, sample_id, copy)
            masked, targets = self.mask_tokens(seq[None], torch.ones(1, len(seq), dtype=torch.bool), g)  # (1, n)
            input_ids[b, :len(seq)], labels[b, :len(seq)] = masked[0], targets[0]
        return input_ids, labels

    def mask_tokens(self, ids: torch.Tensor, real: torch.Tensor,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Select targets and corrupt them. Usable on any padded batch (e.g. NSP pairs).

        Args:
            ids: (B, T) token ids. real: (B, T) bool, False on padding.
            generator: draws the mask; default the objective's own.
        Returns:
            ``(input_ids, labels)``, both (B, T) long; labels are IGNORE_INDEX except at selected tokens.
        """
        B, T = ids.shape
        g = self.generator if generator is None else generator
        maskable = real & ~torch.isin(ids, self.special_token_ids)  # (B, T)
        word_id, word_start = self._words(ids, maskable)  # (B, T) each
        if self.span_masking:
            word_selected, word_u = self._sample_spans(word_id, word_start & maskable, g)  # (B, T), indexed by word
            u = word_u.gather(1, word_id)  # (B, T): one 80/10/10 draw per span
        else:
            word_selected = torch.rand(B, T, generator=g) < self.mlm_probability  # (B, T), indexed by word
            u = torch.rand(B, T, generator=g)  # (B, T): one 80/10/10 draw per token
        selected = word_selected.gather(1, word_id) & maskable  # (B, T): a word's pieces share its draw
        random_ids = self.random_pool[torch.randint(len(self.random_pool), (B, T), generator=g)]  # (B, T)

        to_mask = selected & (u < self.mask_prob)
        to_random = selected & (u >= self.mask_prob) & (u < self.mask_prob + self.random_prob)
        input_ids = torch.where(to_mask, self.mask_token_id, torch.where(to_random, random_ids, ids))
        labels = torch.where(selected, ids, IGNORE_INDEX)
        return input_ids, labels

    def _words(self, ids: torch.Tensor, maskable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Word index of each token and word-start flags, both (B, T). Without continuation ids, word = token."""
        B, T = ids.shape
        if self.continuation_token_ids is None:
            return torch.arange(T).expand(B, T), torch.ones(B, T, dtype=torch.bool)
        # A special token or pad always stands alone, even if its id is also listed as a continuation, and the
        # piece after one starts a word (byte-level BPE spells a text's first word without its space mark).
        after_special = torch.cat([torch.ones(B, 1, dtype=torch.bool), ~maskable[:, :-1]], dim=1)  # (B, T)
        word_start = ~(torch.isin(ids, self.continuation_token_ids) & maskable) | after_special
        word_id = torch.cumsum(word_start.long(), dim=1) - 1  # word_start[:, 0] is True: ids start at 0
        return word_id, word_start

    def _span_lengths(self, budget: int, generator: torch.Generator) -> torch.Tensor:
        """SpanBERT span lengths (in words) summing exactly to ``budget``; the last one is cut to fit. (k,)"""
        # `budget` draws always suffice, since each span is at least one word long.
        lengths = torch.multinomial(self.span_length_probs, budget, replacement=True, generator=generator) + 1
        ends = torch.cumsum(lengths, 0)
        k = int(torch.searchsorted(ends, budget)) + 1  # first span whose end reaches the budget
        lengths = lengths[:k]
        lengths[-1] -= int(ends[k - 1]) - budget
        return lengths

    def _sample_spans(self, word_id: torch.Tensor, unit_start: torch.Tensor,
                      g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Word-level span selection for each example, drawn from generator ``g``.

        Args:
            word_id: (B, T) word index per token. unit_start: (B, T) True at the first token of a maskable word.
        Returns:
            ``(selected, u)``, both (B, T) and indexed by *word*: selected words and their per-span 80/10/10 draw.
        """
        B, T = word_id.shape
        selected = torch.zeros(B, T, dtype=torch.bool)
        u = torch.zeros(B, T)
        for b in range(B):
            units = word_id[b][unit_start[b]]  # (U,) indices of the maskable words, in order
            n = len(units)
            budget = round(self.mlm_probability * n)
            if budget == 0:
                continue
            lengths = self._span_lengths(budget, g)  # (k,)
            # A one-word gap keeps neighbouring spans from merging, so each stays one span with one decision.
            gap = 1 if n - budget >= len(lengths) - 1 else 0
            starts = place_spans(n, lengths, g, gap)  # (k,)
            pos = torch.arange(n)
            span = torch.searchsorted(starts, pos, right=True) - 1  # (U,) last span starting at or before
            covered = (span >= 0) & (pos < (starts + lengths)[span.clamp(min=0)])
            selected[b, units[covered]] = True
            u[b, units[covered]] = torch.rand(len(lengths), generator=g)[span[covered]]
        return selected, u


def with_mlm_options(cls, exclude: Iterable[str] = ()) -> type:
    """Give ``cls`` (whose ``__init__`` passes ``**mlm_options`` on to a :class:`MaskedLM`) the signature of its own
    keyword arguments plus every MaskedLM argument it does not set itself (nor ``exclude``), so the pre-training
    recipe fills and checks them by name, as for MaskedLM, and a new MaskedLM option reaches it unedited."""
    own = [p for name, p in inspect.signature(cls.__init__).parameters.items()
           if name != "self" and p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in own} | set(exclude)
    cls.__signature__ = inspect.Signature(
        own + [p for p in inspect.signature(MaskedLM).parameters.values() if p.name not in taken])
    return cls
