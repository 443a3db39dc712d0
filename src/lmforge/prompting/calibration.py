"""Contextual calibration (Zhao et al. 2021, "Calibrate Before Use: Improving Few-Shot Performance of Language
Models").

A prompt biases the model towards some answers whatever the input (majority label of the demonstrations, the
most recent one, common tokens). Zhao et al. estimate that bias from *content-free* inputs such as "N/A", "" and
"[MASK]" put in the same prompt, and undo it:

    p_cf = mean over content-free inputs of p(label | prompt(cf))          (C,)
    q    = normalise(diag(p_cf)^-1 p)      i.e.  q_c = (p_c / p_cf_c) / sum_c' (p_c' / p_cf_c')

so a content-free input is mapped to the uniform distribution.

Example:
    >>> import torch
    >>> p = torch.tensor([[0.7, 0.3], [0.9, 0.1]])
    >>> calibrate(p, torch.tensor([0.8, 0.2]))
    tensor([[0.3684, 0.6316],
            [0.6923, 0.3077]])
"""

from __future__ import annotations

import torch

CONTENT_FREE = ("N/A", "", "[MASK]")  # Zhao et al. 2021, section 5


def calibrate(probs: torch.Tensor, content_free: torch.Tensor) -> torch.Tensor:
    """probs (N, C) label probabilities, content_free (C,) the content-free prediction -> calibrated (N, C)."""
    if content_free.shape[-1] != probs.shape[-1]:
        raise ValueError(f"content-free prediction has {content_free.shape[-1]} labels, probs have {probs.shape[-1]}")
    scaled = probs / content_free.clamp_min(1e-12)  # W p with W = diag(p_cf)^-1 (b = 0)
    return scaled / scaled.sum(-1, keepdim=True)


def content_free_prediction(label_scores: torch.Tensor) -> torch.Tensor:
    """Label scores (M, C) of the M content-free inputs -> the mean of their label distributions (C,)."""
    return label_scores.softmax(-1).mean(0)
