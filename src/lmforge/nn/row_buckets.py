"""Row counts rounded up to a few buckets, so that a CPU's bf16 matrix multiplies meet few distinct shapes.

On x86 CPUs PyTorch runs bf16 matrix multiplies through oneDNN, which generates a kernel for each new shape and
caches it. For a (400 x 384) @ (384 x 1536) product, forward and backward, a new row count cost about 25 ms
more than a cached one (6 ms) and kept about 4 MB for good (2 cores, torch 2.13, 2026-11-27). Two places in
a training step used to give the matrix multiplies a new row count nearly every step: the masked positions
of MLM (about 15% of a batch, drawn anew each step) and the real tokens of a padded batch
(:mod:`lmforge.nn.unpadding`). An MLM pre-training job of 200 steps grew to 2.8 GB of resident memory
where 20 steps took 1.3 GB.

Rounding the row count up to a multiple of ``ROW_MULTIPLE`` leaves a few shapes per job. The extra rows are
positions whose results nothing reads (unlabelled positions for a loss, padding for the layers), so the
result is unchanged; they cost at most ``ROW_MULTIPLE - 1`` rows of compute.

Example:
    >>> import torch
    >>> needed = torch.tensor([True, False, True, False, False])  # positions whose results are read
    >>> with_spare_rows(needed, multiple=4).tolist()  # the 2 needed, then 2 spare ones: 4 rows
    [0, 2, 1, 3]
    >>> with_spare_rows(needed, multiple=4, spare=torch.tensor([False, False, False, False, True])).tolist()
    [0, 2, 4]
"""

from __future__ import annotations

import torch

ROW_MULTIPLE = 64


def with_spare_rows(needed: torch.Tensor, multiple: int = ROW_MULTIPLE,
                    spare: torch.Tensor | None = None) -> torch.Tensor:
    """Indices (N',) into ``needed``'s flattened positions: every needed one first (in order), then as many
    ``spare`` ones (default: the positions not needed) as make N' a multiple of ``multiple``, or as there are."""
    needed = needed.reshape(-1).bool()
    index = needed.nonzero().squeeze(1)
    extra = -index.numel() % multiple
    if extra == 0:
        return index
    spare = ~needed if spare is None else spare.reshape(-1).bool() & ~needed
    return torch.cat([index, spare.nonzero().squeeze(1)[:extra]])
