"""Next sentence prediction (BERT), alone (``nsp``) or with MLM masking (``mlm+nsp``, BERT's pre-training).

BERT (Devlin et al., 2019, §3.1 "Task #2") trains a binary classifier on the ``[CLS]`` output. The input
is ``[CLS] A [SEP] B [SEP]``; half the time B is the text that follows A in its document (IsNext), and
half the time B comes from another document (NotNext). The model's loss is MLM mean CE + NSP mean CE
(:class:`~lmforge.models.heads.NSPHead`). RoBERTa (Liu et al., 2019, §4.2) found that dropping NSP matches
or improves downstream results, so plain ``mlm`` is the "no NSP" ablation and NSP must be asked for.

What A and B are is the input ``format`` (RoBERTa §4.2; see :mod:`lmforge.objectives.input_formats`)::

    segment-pair   A = the first k sentences of a document (k random), B = the rest of it (IsNext), or as
                   many sentences from another document, from a random one on (NotNext). BERT's original.
    sentence-pair  A = one sentence, B = the next one (IsNext) or a random sentence of another document.

Labels follow the HF convention: ``next_sentence_label`` 0 = IsNext, 1 = NotNext. ``token_type_ids`` is 0
on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``. The MLM masks the pairs, never the framing tokens, afresh in every
batch: static masking (one mask per sequence and copy, :mod:`lmforge.objectives.static_masking`) is refused,
since the pairs themselves are drawn anew; whole-word and span masking work on pairs as on plain sequences.

Input: a list of *documents*, each either a list of sentences (token-id sequences) or one flat sequence,
cut into sentences after each id of ``sentence_end_ids`` (how ``lmforge pretrain`` hands over its
sentence-aligned document segments). Each document gives one pair. A flat document with a single
sentence is cut in two at a random token, so that it still has an IsNext pair (a shortcut a model could
learn: such a B starts mid-sentence); one of a single token always gets a NotNext pair. NotNext text comes
from another document of the same batch, so a batch needs at least two documents.

Example::

    >>> nsp = NextSentencePrediction(cls_token_id=1, sep_token_id=2, pad_token_id=0, seed=0)
    >>> docs = [[[10, 11], [12], [13, 14]], [[20], [21, 22]]]
    >>> batch = nsp(docs)
    >>> sorted(batch)
    ['attention_mask', 'input_ids', 'next_sentence_label', 'token_type_ids']
    >>> batch["next_sentence_label"].shape  # (B,)
    torch.Size([2])
    >>> bert = MaskedLMAndNSP(vocab_size=100, mask_token_id=3, cls_token_id=1, sep_token_id=2, pad_token_id=0,
    ...                       sentence_end_ids=[9], seed=0)  # flat documents, cut after each 9
    >>> sorted(bert([[10, 11, 9, 12, 9, 13, 9], [20, 9, 21, 22, 9]]))
    ['attention_mask', 'input_ids', 'labels', 'next_sentence_label', 'token_type_ids']
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import torch

from lmforge.config import ConfigError
from lmforge.objectives.base import Seeded, as_ids, id_set, pad, split_sentences
from lmforge.objectives.mlm import MaskedLM, with_mlm_options

IS_NEXT, NOT_NEXT = 0, 1
PAIR_FORMATS = ("segment-pair", "sentence-pair")


class NextSentencePrediction(Seeded):
    """Sentence-pair collator: documents -> ``input_ids``, ``attention_mask``, ``token_type_ids``,
    ``next_sentence_label`` (and ``labels`` when ``mlm`` is given).

    Args:
        cls_token_id, sep_token_id, pad_token_id: framing and padding ids.
        max_length: if set, each pair is cut to this many tokens including the 3 specials. Tokens are taken
            from the end of the longer part, as in BERT's ``truncate_seq_pair``.
        next_prob: probability of an IsNext pair (0.5 in BERT).
        mlm: optional ``MaskedLM`` applied to the pairs; its generator is saved with this one.
        format: ``sentence-pair`` or ``segment-pair`` (see the module docstring).
        sentence_end_ids: ids that end a sentence, to cut flat documents.
        seed: seed of this objective's generator.
    """

    framing_tokens = 3  # [CLS] A [SEP] B [SEP]: lmforge pretrain cuts document segments 3 tokens short
    sentence_segments = True  # ... and at sentence ends
    model_fields = {"pooler": True, "nsp_head": True}  # what a model needs to train on these batches

    def __init__(
        self,
        *,
        cls_token_id: int,
        sep_token_id: int,
        pad_token_id: int,
        max_length: int | None = None,
        next_prob: float = 0.5,
        mlm: MaskedLM | None = None,
        format: str = "sentence-pair",
        sentence_end_ids: Iterable[int] = (),
        seed: int = 0,
    ):
        super().__init__(seed)
        if max_length is not None and max_length < 5:
            raise ValueError(f"max_length must leave room for [CLS] A [SEP] B [SEP] (>= 5), got {max_length}")
        if mlm is not None and not torch.isin(torch.tensor([cls_token_id, sep_token_id]), mlm.special_token_ids).all():
            raise ValueError("the MaskedLM given to NSP must list cls_token_id and sep_token_id as special ids")
        if mlm is not None and mlm.masking == "static":
            # A static mask is a function of (seed, sample, copy) for a fixed sequence; a pair is drawn anew in
            # every batch (where A ends, IsNext or NotNext, B from another document of the batch), so it has none.
            raise ConfigError("objective option masking='static' does not work with NSP pairs, which are drawn anew "
                              "in every batch: use masking=dynamic with mlm+nsp, or objective mlm for static masks")
        if format not in PAIR_FORMATS:
            raise ValueError(f"format={format!r} is not an NSP input format; choose one of {', '.join(PAIR_FORMATS)}")
        self.cls_token_id, self.sep_token_id, self.pad_token_id = cls_token_id, sep_token_id, pad_token_id
        self.max_length, self.next_prob, self.mlm, self.format = max_length, next_prob, mlm, format
        self.sentence_end_ids = id_set(sentence_end_ids)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.mlm is not None:
            state["mlm"] = self.mlm.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.mlm is not None:
            self.mlm.load_state_dict(state["mlm"])

    def __call__(self, documents: Sequence[Sequence]) -> dict[str, torch.Tensor]:
        if len(documents) < 2:
            raise ValueError("NSP needs at least 2 documents per batch: NotNext sentences come from another one")
        docs = [self._sentences(doc) for doc in documents]
        pairs, type_ids, labels = [], [], []
        for d in range(len(docs)):
            a, b, label = self._sample_pair(docs, d)
            a, b = self._truncate(a, b)
            cls, sep = torch.tensor([self.cls_token_id]), torch.tensor([self.sep_token_id])
            pairs.append(torch.cat([cls, a, sep, b, sep]))
            type_ids.append(torch.tensor([0] * (len(a) + 2) + [1] * (len(b) + 1)))  # [CLS] A [SEP] | B [SEP]
            labels.append(label)
        input_ids, real = pad(pairs, self.pad_token_id)  # (B, T) each
        batch = {
            "input_ids": input_ids,
            "attention_mask": real.long(),
            "token_type_ids": pad(type_ids, 0)[0],  # (B, T)
            "next_sentence_label": torch.tensor(labels),  # (B,)
        }
        if self.mlm is not None:
            batch["input_ids"], batch["labels"] = self.mlm.mask_tokens(input_ids, real)
        return batch

    def _sentences(self, doc) -> list[torch.Tensor]:
        """A document as its list of sentences (see the module docstring for flat documents)."""
        if not (isinstance(doc, torch.Tensor) or len(doc) == 0 or isinstance(doc[0], numbers.Integral)):
            sentences = [as_ids(s) for s in doc]
            if len(sentences) < 2:
                raise ValueError("every NSP document given as a list of sentences needs at least 2 sentences, "
                                 "so that an IsNext pair exists")
            return sentences
        tokens = as_ids(doc)
        if len(tokens) == 0:
            raise ValueError("an NSP document is empty")
        sentences = split_sentences(tokens, self.sentence_end_ids)
        if len(sentences) == 1 and len(tokens) > 1:
            cut = 1 + int(torch.randint(len(tokens) - 1, (), generator=self.generator))
            sentences = [tokens[:cut], tokens[cut:]]
        return sentences

    def _sample_pair(self, docs: list[list[torch.Tensor]], d: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = self.generator
        doc = docs[d]
        # Draw among the other documents only (shift past d), so a NotNext B never comes from A's document.
        other = int(torch.randint(len(docs) - 1, (), generator=g))
        other_doc = docs[other + (other >= d)]
        if len(doc) < 2:  # a one-token document: nothing can follow A inside it
            return doc[0], self._run(other_doc, 1), NOT_NEXT
        k = 1 + int(torch.randint(len(doc) - 1, (), generator=g))  # A ends before sentence k (which exists)
        is_next = self._coin(self.next_prob)
        if self.format == "sentence-pair":
            a, following = doc[k - 1], doc[k]
            if is_next:
                return a, following, IS_NEXT
            return a, other_doc[int(torch.randint(len(other_doc), (), generator=g))], NOT_NEXT
        a, following = torch.cat(doc[:k]), torch.cat(doc[k:])
        if is_next:
            return a, following, IS_NEXT
        # BERT fills B from a random sentence of the other document on, to about the length the true B has,
        # so that B's length does not give the label away.
        return a, self._run(other_doc, len(following)), NOT_NEXT

    def _run(self, doc: list[torch.Tensor], target: int) -> torch.Tensor:
        """Consecutive sentences of ``doc`` from a random one on, until they hold ``target`` tokens (>= 1 sentence)."""
        start = int(torch.randint(len(doc), (), generator=self.generator))
        taken = [doc[start]]
        for sentence in doc[start + 1:]:
            if sum(len(s) for s in taken) >= target:
                break
            taken.append(sentence)
        return torch.cat(taken)

    def _truncate(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.max_length is None:
            return a, b
        budget = self.max_length - 3  # [CLS], [SEP], [SEP]
        while len(a) + len(b) > budget:
            if len(a) >= len(b):
                a = a[:-1]
            else:
                b = b[:-1]
        return a, b


class MaskedLMAndNSP(NextSentencePrediction):
    """BERT's joint pre-training batch (objective ``mlm+nsp``): NSP pairs, ``segment-pair`` by default,
    masked by a :class:`MaskedLM` built from the remaining options.

    Args:
        vocab_size, mask_token_id: for the MLM.
        cls_token_id, sep_token_id, pad_token_id, max_length, next_prob, format, sentence_end_ids, seed: as for
            :class:`NextSentencePrediction` (the MLM's generator is seeded with ``seed + 1``).
        **mlm_options: any other :class:`MaskedLM` argument (``mlm_probability``, ``span_masking``, ...); the
            signature lists them, so ``lmforge pretrain`` fills and checks them like any objective's.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        mask_token_id: int,
        cls_token_id: int,
        sep_token_id: int,
        pad_token_id: int,
        max_length: int | None = None,
        next_prob: float = 0.5,
        format: str = "segment-pair",
        sentence_end_ids: Iterable[int] = (),
        seed: int = 0,
        **mlm_options,
    ):
        mlm = MaskedLM(vocab_size=vocab_size, mask_token_id=mask_token_id, pad_token_id=pad_token_id,
                       cls_token_id=cls_token_id, sep_token_id=sep_token_id, seed=seed + 1, **mlm_options)
        super().__init__(cls_token_id=cls_token_id, sep_token_id=sep_token_id, pad_token_id=pad_token_id,
                         max_length=max_length, next_prob=next_prob, mlm=mlm, format=format,
                         sentence_end_ids=sentence_end_ids, seed=seed)


with_mlm_options(MaskedLMAndNSP, exclude=("add_cls_sep",))  # pairs are framed here, never by the MLM
