"""RoBERTa's four input formats (Liu et al., 2019, "RoBERTa: A Robustly Optimized BERT Pretraining
Approach", §4.2, Table 2): what one MLM input holds, with and without next sentence prediction.

==================  ============  =======================================================================
format              objective     one input
==================  ============  =======================================================================
``segment-pair``    ``mlm+nsp``   ``[CLS] A [SEP] B [SEP]``, A and B each several sentences (BERT's original)
``sentence-pair``   ``mlm+nsp``   ``[CLS] A [SEP] B [SEP]``, A and B one sentence each
``full-sentences``  ``mlm``       whole sentences packed to the length limit, continuing into the next
                                  document, with an extra ``[SEP]`` between documents; no NSP
``doc-sentences``   ``mlm``       whole sentences of one document only; no NSP
==================  ============  =======================================================================

RoBERTa found the two no-NSP formats at least as good, DOC-SENTENCES slightly best; it kept FULL-SENTENCES,
which keeps the batch size fixed. Plain ``mlm`` (no format) frames each document segment of ``lmforge
pretrain`` as it is, cut every ``seq_len - 2`` tokens whatever the sentences.

How ``lmforge pretrain`` builds them (``--objective-option format=...``): every format reads document
segments cut at sentence ends (:func:`lmforge.data.loader.sentence_segments`), whole sentences up to the
length limit. ``doc-sentences`` frames one segment per input: the plain MLM objective on sentence-aligned
segments. ``full-sentences`` packs the batch's segments, in their (shuffled) order, into as few inputs as
the limit allows (:class:`FullSentences`): an input holds as many tokens as RoBERTa's, so a batch may hold
fewer inputs than segments. The pair formats are :class:`~lmforge.objectives.nsp.MaskedLMAndNSP`.

Example::

    >>> [row.tolist() for row in pack_full_sentences([[5, 9, 6, 9], [7, 9], [8, 8, 9]], [9], separator_id=2,
    ...                                              max_length=7)]
    [[5, 9, 6, 9, 2, 7, 9], [8, 8, 9]]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from lmforge.config import ConfigError
from lmforge.objectives.base import as_ids, id_set, split_sentences

# format -> the objective that takes it
FORMATS = {"segment-pair": "mlm+nsp", "sentence-pair": "mlm+nsp", "full-sentences": "mlm", "doc-sentences": "mlm"}


def check_format(objective: str, value) -> str | None:
    """The ``format`` option of ``objective`` (None: the objective's default), or a one-line ConfigError.

    Example:
        >>> check_format("mlm", "segment-pair")
        Traceback (most recent call last):
        ...
        lmforge.config.ConfigError: objective_options: format='segment-pair' trains NSP: use it with --objective mlm+nsp; --objective mlm takes format=full-sentences|doc-sentences
    """
    if value is None:
        return None
    if value not in FORMATS:
        raise ConfigError(f"objective_options: unknown format={value!r}; choose one of {'|'.join(FORMATS)}")
    if FORMATS[value] != objective:
        own = "|".join(f for f, o in FORMATS.items() if o == objective)
        why = "trains NSP" if FORMATS[value] == "mlm+nsp" else "has no NSP"
        raise ConfigError(f"objective_options: format={value!r} {why}: use it with --objective {FORMATS[value]}; "
                          + (f"--objective {objective} takes format={own}" if own else
                             f"--objective {objective} takes no format"))
    return value


def pack_full_sentences(segments: Sequence, sentence_end_ids: Iterable[int], separator_id: int,
                        max_length: int) -> list[torch.Tensor]:
    """FULL-SENTENCES inputs (without framing): the segments' sentences, in order, packed greedily into rows of
    at most ``max_length`` tokens; ``separator_id`` goes between two documents inside a row. A sentence
    longer than a row is cut into row-sized pieces. Each segment counts as one document."""
    ends = id_set(sentence_end_ids)
    sep = torch.tensor([separator_id])
    rows: list[torch.Tensor] = []
    row: list[torch.Tensor] = []
    used = 0
    for segment in segments:
        new_document = bool(row)  # the first sentence of this segment follows another document's in the row
        for sentence in split_sentences(as_ids(segment), ends):
            for piece in sentence.split(max_length):
                extra = len(piece) + (1 if new_document else 0)
                if used + extra > max_length:
                    rows.append(torch.cat(row))
                    row, used, extra, new_document = [], 0, len(piece), False
                if new_document:
                    row.append(sep)
                    new_document = False
                row.append(piece)
                used += extra
    if row:
        rows.append(torch.cat(row))
    return rows


class FullSentences:
    """The FULL-SENTENCES format around an MLM objective: packs a batch of document segments
    (:func:`pack_full_sentences`), then lets ``objective`` frame and mask the rows.

    Args:
        objective: e.g. a :class:`~lmforge.objectives.mlm.MaskedLM` that frames rows as ``[CLS] x [SEP]``.
        sentence_end_ids, separator_id, max_length: as for :func:`pack_full_sentences` (``max_length``
            leaves out the framing tokens). Packing draws nothing: the state is the objective's.
    """

    def __init__(self, objective, *, sentence_end_ids: Iterable[int], separator_id: int, max_length: int):
        if max_length < 1:
            raise ValueError(f"max_length={max_length} must be >= 1")
        self.objective, self.separator_id, self.max_length = objective, separator_id, max_length
        self.sentence_end_ids = list(sentence_end_ids)

    def __call__(self, segments: Sequence) -> dict[str, torch.Tensor]:
        return self.objective(pack_full_sentences(segments, self.sentence_end_ids, self.separator_id,
                                                  self.max_length))

    def state_dict(self) -> dict:
        return self.objective.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.objective.load_state_dict(state)
