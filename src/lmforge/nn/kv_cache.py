"""Key/value cache for incremental decoding.

Decoding token by token would recompute every earlier key and value at each step. The cache keeps
them: each step appends the new position's K/V per layer and attends over the stored prefix.
Buffers grow by doubling, so appending is an in-place copy rather than an O(T) ``torch.cat``.
Cross-attention K/V depend only on the encoder output, so they are computed once per source and
kept as they are.

Layout per layer: keys and values (B, H_kv, S, hd).

Example:
    >>> import torch
    >>> cache = KVCache()
    >>> k, v = cache.update(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    >>> k, v = cache.update(0, torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    >>> k.shape, cache.seq_len()
    (torch.Size([1, 2, 4, 4]), 4)
"""

from __future__ import annotations

import torch


class KVCache:
    """Args:
        capacity: positions to reserve at the first update (generation knows prompt + new tokens),
            so decoding never reallocates; the buffers still double if it is exceeded.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}
        self.cross: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def seq_len(self, layer: int = 0) -> int:
        """Number of cached self-attention positions (of ``layer``; all layers agree between steps)."""
        return self._lengths.get(layer, 0)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, H_kv, T, hd); return all cached keys and values (B, H_kv, S, hd)."""
        n = self._lengths.get(layer, 0)
        keys = self._keys.get(layer)
        if keys is None or n + k.shape[2] > keys.shape[2] or keys.dtype != k.dtype:
            capacity = max(2 * (n + k.shape[2]), 16) if n + k.shape[2] > self.capacity else self.capacity
            new_k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
            if n:
                new_k[:, :, :n] = keys[:, :, :n]
                new_v[:, :, :n] = self._values[layer][:, :, :n]
            self._keys[layer], self._values[layer] = new_k, new_v
        end = n + k.shape[2]
        self._keys[layer][:, :, n:end] = k
        self._values[layer][:, :, n:end] = v
        self._lengths[layer] = end
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses' caches)."""
        for layer in list(self._keys):
            self._keys[layer] = self._keys[layer].index_select(0, index)
            self._values[layer] = self._values[layer].index_select(0, index)
        self.cross = {i: (k.index_select(0, index), v.index_select(0, index)) for i, (k, v) in self.cross.items()}
