"""Label conventions shared by the models, the objectives and the tasks.

``IGNORE_INDEX`` marks a position without a target; the loss skips it. :func:`shift_right` turns targets
into decoder inputs (teacher forcing): both the encoder-decoder model and the objectives that build its
batches need it, so it lives below both.

Example:
    >>> import torch
    >>> shift_right(torch.tensor([[5, 6, IGNORE_INDEX]]), start_id=1, pad_id=0).tolist()
    [[1, 5, 6]]
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # label value that the cross-entropy loss skips


def shift_right(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """Decoder inputs from targets: (B, T) -> (B, T), ``[start, y_0 .. y_{T-2}]``, IGNORE_INDEX -> pad."""
    shifted = labels.new_full(labels.shape, start_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)
