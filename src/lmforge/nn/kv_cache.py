"""Key/value cache for incremental decoding.

Decoding token by token would recompute every earlier key and value at each step. The cache keeps
them: each step appends the new position's K/V per layer and attends over the stored prefix.
Buffers grow by doubling, so appending is an in-place copy rather than an O(T) ``torch.cat``.
Cross-attention K/V depend only on the encoder output, so they are computed once per source and
kept as they are.

With a sliding window W (Mistral: a query sees its last W keys, itself included) the cache keeps only the
last W - 1 positions after each update, as HF's sliding-window cache does: the next query's window is
those plus itself. ``seq_len`` still counts every position seen (positions go on from it), and
``offset`` says how many fell off the front, so the mask knows which absolute positions the kept keys are.

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
        window: keep only the last ``window - 1`` positions (a sliding-window model's cache), or None.
    """

    def __init__(self, capacity: int = 0, window: int | None = None) -> None:
        self.window = window
        self.capacity = capacity if window is None else min(capacity, window)  # a window bounds what is kept
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}  # buffer index one past the newest position
        self._start: dict[int, int] = {}  # buffer index of the oldest kept position
        self._dropped: dict[int, int] = {}  # positions that fell out of the window
        self.cross: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def seq_len(self, layer: int = 0) -> int:
        """Number of self-attention positions seen (of ``layer``; all layers agree between steps)."""
        return self._dropped.get(layer, 0) + self._lengths.get(layer, 0) - self._start.get(layer, 0)

    def offset(self, layer: int = 0) -> int:
        """Positions no longer kept (0 without a window): the kept keys are positions offset .. seq_len - 1."""
        return self._dropped.get(layer, 0)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, H_kv, T, hd); return the kept and the new keys and values (B, H_kv, S, hd)."""
        start, n = self._start.get(layer, 0), self._lengths.get(layer, 0)
        keys = self._keys.get(layer)
        if keys is None or n + k.shape[2] > keys.shape[2] or keys.dtype != k.dtype:
            kept = n - start
            need = kept + k.shape[2]
            capacity = max(2 * need, 16) if need > self.capacity else self.capacity
            new_k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
            if kept:  # moved to the front: a window's cache compacts here instead of growing
                new_k[:, :, :kept] = keys[:, :, start:n]
                new_v[:, :, :kept] = self._values[layer][:, :, start:n]
            self._keys[layer], self._values[layer] = new_k, new_v
            start, n = 0, kept
        end = n + k.shape[2]
        self._keys[layer][:, :, n:end] = k
        self._values[layer][:, :, n:end] = v
        self._lengths[layer] = end
        out = self._keys[layer][:, :, start:end], self._values[layer][:, :, start:end]
        if self.window is not None and end - start > self.window - 1:  # the next query needs the last W - 1
            drop = end - start - (self.window - 1)
            self._dropped[layer] = self._dropped.get(layer, 0) + drop
            start += drop
        self._start[layer] = start
        return out

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses' caches)."""
        for layer in list(self._keys):
            self._keys[layer] = self._keys[layer].index_select(0, index)
            self._values[layer] = self._values[layer].index_select(0, index)
        self.cross = {i: (k.index_select(0, index), v.index_select(0, index)) for i, (k, v) in self.cross.items()}
