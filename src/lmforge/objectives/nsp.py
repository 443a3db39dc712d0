"""Next sentence prediction (BERT), optionally combined with MLM masking.

BERT (Devlin et al., 2019, §3.1 "Task #2") trains a binary classifier on the ``[CLS]`` output. The input
is ``[CLS] A [SEP] B [SEP]``; half the time B is the sentence that follows A in its document (IsNext),
and half the time B is a sentence from another document (NotNext). RoBERTa (Liu et al., 2019, §4.2) found
that dropping NSP matches or improves downstream results. lmforge therefore leaves it off by default:
``MaskedLM`` alone is the BERT recipe, and this objective must be asked for (``build_objective("nsp")``).

Labels follow the HF convention: ``next_sentence_label`` 0 = IsNext, 1 = NotNext. ``token_type_ids`` is 0
on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``. Pass ``mlm=MaskedLM(...)`` to mask the pair as well, which is
BERT's joint pre-training batch. The MLM must know ``[CLS]``/``[SEP]`` so that it never masks them.

Input: a list of *documents*, each a list of at least two sentences (token-id sequences). Each document
gives one pair. NotNext sentences come from another document of the same batch, so a batch needs at
least two documents.

Example::

    >>> nsp = NextSentencePrediction(cls_token_id=1, sep_token_id=2, pad_token_id=0, seed=0)
    >>> docs = [[[10, 11], [12], [13, 14]], [[20], [21, 22]]]
    >>> batch = nsp(docs)
    >>> sorted(batch)
    ['attention_mask', 'input_ids', 'next_sentence_label', 'token_type_ids']
    >>> batch["next_sentence_label"].shape  # (B,)
    torch.Size([2])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import Seeded, as_ids, pad
from lmforge.objectives.mlm import MaskedLM

IS_NEXT, NOT_NEXT = 0, 1


class NextSentencePrediction(Seeded):
    """Sentence-pair collator: documents -> ``input_ids``, ``attention_mask``, ``token_type_ids``,
    ``next_sentence_label`` (and ``labels`` when ``mlm`` is given).

    Args:
        cls_token_id, sep_token_id, pad_token_id: framing and padding ids.
        max_length: if set, each pair is cut to this many tokens including the 3 specials. Tokens are taken
            from the end of the longer sentence, as in BERT's ``truncate_seq_pair``.
        next_prob: probability of an IsNext pair (0.5 in BERT).
        mlm: optional ``MaskedLM`` applied to the pairs; its generator is saved with this one.
        seed: seed of this objective's generator.
    """

    def __init__(
        self,
        *,
        cls_token_id: int,
        sep_token_id: int,
        pad_token_id: int,
        max_length: int | None = None,
        next_prob: float = 0.5,
        mlm: MaskedLM | None = None,
        seed: int = 0,
    ):
        super().__init__(seed)
        if max_length is not None and max_length < 5:
            raise ValueError(f"max_length must leave room for [CLS] A [SEP] B [SEP] (>= 5), got {max_length}")
        if mlm is not None and not torch.isin(torch.tensor([cls_token_id, sep_token_id]), mlm.special_token_ids).all():
            raise ValueError("the MaskedLM given to NSP must list cls_token_id and sep_token_id as special ids")
        self.cls_token_id, self.sep_token_id, self.pad_token_id = cls_token_id, sep_token_id, pad_token_id
        self.max_length, self.next_prob, self.mlm = max_length, next_prob, mlm

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
        docs = [[as_ids(s) for s in doc] for doc in documents]
        if any(len(doc) < 2 for doc in docs):
            raise ValueError("every NSP document needs at least 2 sentences, so that an IsNext pair exists")
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

    def _sample_pair(self, docs: list[list[torch.Tensor]], d: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = self.generator
        doc = docs[d]
        i = int(torch.randint(len(doc) - 1, (), generator=g))  # A = sentence i, which has a successor
        if self._coin(self.next_prob):
            return doc[i], doc[i + 1], IS_NEXT
        # Draw among the other documents only (shift past d), so a NotNext B never comes from A's document.
        other = int(torch.randint(len(docs) - 1, (), generator=g))
        other_doc = docs[other + (other >= d)]
        j = int(torch.randint(len(other_doc), (), generator=g))
        return doc[i], other_doc[j], NOT_NEXT

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
