"""Attention masks: which key positions each query may see.

Masks are boolean, True = may attend, shaped (B or 1, 1, T, S) so they broadcast over heads.
Three sources combine: padding of the keys, causality (a decoder query at absolute position i sees
keys at positions <= i, counting cached ones), and an explicit (B, T, S) mask given by the caller
(e.g. a prefix-LM mask, which is then complete and used as is). A sliding window W (Mistral) also hides
keys more than W - 1 positions before the query: each query sees its last W keys, itself included.

A query row that may see nothing (a left-pad position in a causal model) is opened fully: its output
is never used, but an all-masked softmax would produce NaNs that poison gradients.

Example:
    >>> import torch
    >>> m = build_mask(q_len=3, k_len=3, causal=True, key_padding=torch.tensor([[1, 1, 0]]))
    >>> m[0, 0].int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
"""

from __future__ import annotations

import torch


def build_mask(
    q_len: int,
    k_len: int,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    explicit: torch.Tensor | None = None,
    device: torch.device | None = None,
    window: int | None = None,
) -> torch.Tensor | None:
    """Return a bool mask (B|1, 1, T, S), or None when every query may see every key.

    Args:
        q_len: T, the number of new query positions (the last T of the S key positions).
        k_len: S, cached + new key positions.
        causal: forbid keys after the query.
        key_padding: (B, S) or (B, S_new) with 1/True for real tokens. When only the new positions'
            padding is given, the cached ones are taken as real.
        explicit: (B, T, S) bool, a complete mask from the caller (causality is not added).
        window: with ``causal``, a query at i sees keys i - window + 1 .. i only. Padding longer than
            S (a windowed cache keeps the last S keys) is read for its last S positions.
    """
    if explicit is not None:
        mask = explicit.bool()[:, None]  # (B, 1, T, S)
    else:
        mask = None
        windowed = causal and window is not None and k_len > window
        if causal and (q_len != 1 or windowed):
            q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (T, 1)
            k_pos = torch.arange(k_len, device=device)[None, :]  # (1, S)
            mask = k_pos <= q_pos
            if windowed:
                mask = mask & (k_pos > q_pos - window)
            mask = mask[None, None]  # (1, 1, T, S)
        if key_padding is not None:
            keep = key_padding.bool()[:, -k_len:]
            if keep.shape[-1] < k_len:  # padding given for the new positions only
                keep = torch.cat([keep.new_ones(keep.shape[0], k_len - keep.shape[-1]), keep], dim=-1)
            # An all-ones padding mask is dropped so SDPA can take its mask-free kernel; reading
            # that back is a host sync torch.compile cannot trace, so compiled graphs keep the mask.
            if torch.compiler.is_compiling() or not bool(keep.all()):
                pad = keep[:, None, None, :]  # (B, 1, 1, S)
                mask = pad if mask is None else mask & pad
    if mask is None:
        return None
    if mask.shape[-2] != q_len:
        mask = mask.expand(mask.shape[0], 1, q_len, k_len)
    return mask | ~mask.any(dim=-1, keepdim=True)
