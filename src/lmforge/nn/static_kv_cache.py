"""A fixed-capacity KV cache for compiled decoding: shapes never change, so a compiled step never recompiles.

:class:`~lmforge.nn.kv_cache.KVCache` hands attention the keys written so far, ``(B, H_kv, S, hd)`` with
``S`` growing by one per token: a compiled graph would see a new shape at every step. This cache keeps
preallocated buffers of ``capacity`` positions per layer and writes the new token's K/V at ``index``, a
(T,) long *tensor* (a Python int would be baked into the graph). Attention always spans the whole
capacity; a mask of the valid positions (real prompt tokens up to the current one) hides the rest, so
the buffers must hold finite values everywhere (zeros beyond what was written: 0 * NaN would leak
through the masked softmax).

To the stack it reports ``seq_len() == capacity - 1`` past positions: with the one new token, attention
sees ``capacity`` keys, matching the buffers. Which of them are real is the caller's mask's business, so
only position schemes applied through ``position_ids`` (learned, sinusoidal, RoPE, none) read it right;
relative biases (ALiBi, T5, Shaw) would place the query at the last slot.

Layout per layer: keys and values (B, H_kv, capacity, hd).

Example:
    >>> import torch
    >>> k = [torch.zeros(1, 2, 8, 4)]; v = [torch.zeros(1, 2, 8, 4)]
    >>> cache = StaticKVCache(k, v, index=torch.tensor([3]))
    >>> keys, values = cache.update(0, torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    >>> keys.shape, cache.seq_len(), keys[0, 0, :, 0].tolist()
    (torch.Size([1, 2, 8, 4]), 7, [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.nn.kv_cache import KVCache


class StaticKVCache:
    """Args:
        keys, values: per layer (B, H_kv, capacity, hd) buffers, written in place.
        index: (T,) long tensor, the capacity slots the next ``update`` writes (T = new tokens).
        cross: per-layer cross-attention (K, V), as in :class:`KVCache` (computed once per source).
        run_layer: how the stack runs its layers over this cache: ``run_layer(block, x, ctx, i)`` instead of
            ``block(x, ctx, memory, layer=i)`` (a compiled step's one compiled layer, reused for all:
            :mod:`lmforge.generation.compiled`); None, the layers themselves.
    """

    def __init__(
        self,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        index: torch.Tensor,
        cross: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
        run_layer=None,
    ) -> None:
        self.keys, self.values, self.index = list(keys), list(values), index
        self.cross = dict(cross or {})
        self.run_layer = run_layer

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def seq_len(self, layer: int = 0) -> int:
        """Past positions as the stack counts them: attention spans the whole capacity (see the module docstring)."""
        return self.capacity - 1

    def offset(self, layer: int = 0) -> int:
        """Positions no longer kept: none (see :meth:`KVCache.offset`)."""
        return 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, T, hd) at ``index``; return the whole buffers (B, H_kv, capacity, hd)."""
        self.keys[layer].index_copy_(2, self.index, k)
        self.values[layer].index_copy_(2, self.index, v)
        return self.keys[layer], self.values[layer]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search). Buffers keep their shapes, so nothing recompiles, and where the batch
        size stays they are rewritten in place: a CUDA graph replays on the same addresses."""
        self.keys = [_rows(k, index) for k in self.keys]
        self.values = [_rows(v, index) for v in self.values]
        self.cross = {i: (_rows(k, index), _rows(v, index)) for i, (k, v) in self.cross.items()}

    @classmethod
    def from_cache(cls, cache: KVCache, capacity: int, index: torch.Tensor) -> "StaticKVCache":
        """Buffers of ``capacity`` positions holding ``cache``'s keys/values (zeros after them): the
        prompt is prefilled eagerly into a :class:`KVCache`, then decoding goes on here."""
        keys, values = [], []
        for layer in range(len(cache._keys)):
            n = cache.seq_len(layer)
            for src, out in ((cache._keys[layer], keys), (cache._values[layer], values)):
                buf = src.new_zeros(src.shape[0], src.shape[1], capacity, src.shape[3])
                buf[:, :, :n] = src[:, :, :n]
                out.append(buf)
        return cls(keys, values, index, cache.cross)


def _rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t``'s rows ``index``: written into ``t`` itself when their number is unchanged, else a new tensor."""
    picked = t.index_select(0, index)
    if picked.shape != t.shape:
        return picked
    return t.copy_(picked)
