"""Static masking: BERT's original pipeline, the baseline RoBERTa compared dynamic masking against.

Devlin et al. (2019) masked once, during data preparation: ``create_pretraining_data.py`` wrote the corpus
``dupe_factor = 10`` times, each copy with its own masks, so over 40 epochs every sequence was seen with
the same mask four times. Liu et al. (2019, "RoBERTa: A Robustly Optimized BERT Pretraining Approach",
§4.1, Table 1) compared this *static* masking with *dynamic* masking, which draws a new mask every time a
sequence is fed to the model. Dynamic masking did about as well (SQuAD 2.0 78.7 vs 78.3 static, SST-2 92.9
vs 92.5, MNLI-m 84.0 vs 84.3) and needs no duplicated data, so it is lmforge's default.

Here the copies are never written out. With ``N`` copies, epoch ``e`` shows copy ``c = e mod N`` of each
sequence, and the mask of a sequence is a pure function of ``(seed, sample id, c)``: a generator seeded from
``SeedSequence([seed, sample_id, c])``, a stable hash, drives the masking of that one sequence. So::

    epoch    0   1   2  ...  N-1   N   N+1 ...
    copy     0   1   2  ...  N-1   0   1   ...     same copy -> the same mask; another copy -> another mask

The sample id is the sequence's fixed position in the data set, which the loader attaches to each batch
(:class:`lmforge.data.loader.DocumentBatch`), together with the epoch. Neither shuffling, batch size,
data-parallel rank nor a resume changes them, and the masks keep no state, so a resumed run draws the
same masks as an uninterrupted one.

Example::

    >>> copy_index(epoch=12, copies=10)
    2
    >>> a = torch.rand(3, generator=copy_generator(0, sample_id=7, copy=2))
    >>> b = torch.rand(3, generator=copy_generator(0, sample_id=7, copy=2))
    >>> c = torch.rand(3, generator=copy_generator(0, sample_id=7, copy=3))
    >>> torch.equal(a, b), torch.equal(a, c)
    (True, False)

With :class:`~lmforge.objectives.MaskedLM` (epochs 0 and 2 show copy 0, epoch 1 copy 1)::

    >>> from lmforge.data import DocumentBatch
    >>> from lmforge.objectives import MaskedLM
    >>> mlm = MaskedLM(vocab_size=100, mask_token_id=3, pad_token_id=0, masking="static", static_copies=2)
    >>> def labels(epoch):
    ...     return mlm(DocumentBatch([torch.arange(10, 40)], epoch=epoch, sample_ids=[7]))["labels"]
    >>> torch.equal(labels(0), labels(2)), torch.equal(labels(0), labels(1))
    (True, False)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lmforge.config import ConfigError

MASKINGS = ("dynamic", "static")


def check_masking(masking: str, copies: int) -> None:
    """Refuse an unknown ``masking`` or a copy count below 1 (one line, naming the option)."""
    if masking not in MASKINGS:
        raise ConfigError(f"objective option masking={masking!r} is not one of {', '.join(MASKINGS)}; "
                          "static masks each sequence once per copy (BERT), dynamic anew at each epoch (RoBERTa)")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ConfigError(f"objective option static_copies={copies!r} must be a whole number >= 1 "
                          "(BERT duplicated its data 10 times)")


def copy_index(epoch: int, copies: int) -> int:
    """Which of the ``copies`` masked copies epoch ``epoch`` shows: ``epoch mod copies``."""
    return epoch % copies


def copy_generator(seed: int, sample_id: int, copy: int) -> torch.Generator:
    """The generator that masks copy ``copy`` of sample ``sample_id``: seeded from a stable hash of the three."""
    state = np.random.SeedSequence([seed, sample_id, copy]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def batch_identity(examples: Sequence) -> tuple[int, list[int]]:
    """``(epoch, sample_ids)`` of a batch from :class:`~lmforge.data.loader.DocumentDataset`.

    Raises:
        ValueError: the batch does not say which samples it holds (e.g. a plain list).
    """
    epoch, ids = getattr(examples, "epoch", None), getattr(examples, "sample_ids", None)
    if epoch is None or ids is None or len(ids) != len(examples):
        raise ValueError("static masking needs batches that carry their epoch and sample ids (a DocumentBatch, "
                         "as DocumentDataset yields); a plain list of sequences cannot be masked statically")
    return int(epoch), [int(i) for i in ids]
