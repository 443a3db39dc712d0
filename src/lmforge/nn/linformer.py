"""Linformer's low-rank self-attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

Full attention builds an (n, n) score matrix per head. Linformer projects the keys and values along the
*sequence* axis to k rows first, with learned (k, n) matrices E and F:

    head = softmax(Q (E K)^T * scale) (F V)        Q (n, hd), E K (k, hd), F V (k, hd) -> (n, hd)

so the scores are (n, k): time and memory grow linearly in n for a fixed k. The paper's argument is that
the attention matrix is close to low rank, so k ~ 256 loses little.

Sharing (``linformer_sharing``; the paper's section 4):
    headwise    one E and one F per layer, shared by all heads (the default);
    key-value   one matrix per layer, E = F;
    none        E_h, F_h per key/value head.
The paper's layerwise sharing (one E for every layer) is not offered: it would tie parameters across blocks.

E and F are sized to ``max_seq_len`` and sliced to the first n columns, so any length up to it runs; a
longer input has no columns to project and is refused.

Padding: a padded key must not reach the projected keys, but E K mixes every position into every row,
so masking scores afterwards is impossible. Padded keys and values are therefore zeroed before the
projection. Then E[:, :n] K equals E[:, :n_real] K_real: a padded row gives exactly what the same row gives
unpadded (tested). A mask that differs per query (a causal or prefix mask) cannot survive the projection,
which is why the config refuses Linformer for anything but an encoder; only the key-padding part of the
mask is read.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig(arch="encoder", d_model=32, n_heads=4, d_ff=64, vocab_size=10, max_seq_len=16,
    ...                   attention="linformer", linformer_k=8)
    >>> proj = LinformerProjection(cfg)
    >>> k = v = torch.randn(2, 4, 12, 8)  # (B, Hkv, n, hd)
    >>> [t.shape for t in proj(k, v, None)]
    [torch.Size([2, 4, 8, 8]), torch.Size([2, 4, 8, 8])]
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import UserInputError
from lmforge.nn.init import normal_


class LinformerProjection(nn.Module):
    """E and F of one layer: keys and values (B, Hkv, n, hd) -> (B, Hkv, k, hd).

    Parameters: ``E`` (G, k, max_seq_len) and ``F`` (same, or absent when E = F), with G = 1 (shared by
    the heads) or Hkv (per head).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k, self.max_len = cfg.linformer_k, cfg.max_seq_len
        groups = cfg.kv_heads if cfg.linformer_sharing == "none" else 1
        self.E = nn.Parameter(torch.empty(groups, self.k, self.max_len))
        self.F = None if cfg.linformer_sharing == "key-value" else nn.Parameter(torch.empty_like(self.E))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 1/k), as the reference implementations: E K keeps the scale of K summed over k draws."""
        for p in (self.E, self.F):
            if p is not None:
                normal_(p, std=self.k**-0.5)

    def forward(
        self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, Hkv, n, hd); mask bool (B|1, 1, T|1, n), True = real key, or None -> (B, Hkv, k, hd) x 2."""
        n = k.shape[2]
        if n > self.max_len:
            raise UserInputError(f"Linformer attention projects at most max_seq_len={self.max_len} positions; "
                                 f"got a sequence of {n} (shorten it, or build the model with a larger max_seq_len)")
        if mask is not None:
            # Key padding is the same in every query row of an encoder's mask; any() keeps a key some query sees.
            keep = mask.any(dim=2, keepdim=True).transpose(2, 3).to(k.dtype)  # (B, 1, n, 1)
            k, v = k * keep, v * keep  # padded keys and values contribute nothing to E K, F V
        E = self.E[:, :, :n].to(k.dtype)  # (G, k, n): G = 1 broadcasts over heads
        F = E if self.F is None else self.F[:, :, :n].to(v.dtype)
        return E @ k, F @ v  # (B, Hkv, k, hd)
