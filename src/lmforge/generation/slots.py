"""Batched-slot decoding: rows join and leave a running batch between decode steps (continuous batching).

Orca (Yu et al. 2022, "iteration-level scheduling") and vLLM schedule per decode step, not per batch: a
new sequence joins as soon as a row is free, and a finished one leaves at once, so short requests never
wait for long ones. :class:`SlotBatch` is the model-side half of that: rows of KV cache that sequences
occupy and free, and one forward per step over every occupied row.

Layout: per layer, static key/value buffers (R, H_kv, C, hd) for R rows and C positions (a
:class:`~lmforge.nn.static_kv_cache.StaticKVCache`). The occupied rows are kept packed at the front
(0..n-1; a leaving row is replaced by the last one) and share one write column ``cur``: every row's
tokens lie right-aligned in ``[cur - L_i, cur)``, like a left-padded batch, and the mask of valid
columns hides what lies before a row's first token:

    row 0   . . a a a a a | cur        each step writes column cur for every row, then cur += 1
    row 1   . . . . b b b |            position ids are per row (L_i), so a row's numbers equal its
    row 2   c c c c c c c |            own, unpadded run; attention spans columns [0, cur]

A joining sequence is prefilled alone (its prompt's forward over a fresh
:class:`~lmforge.nn.kv_cache.KVCache`, exactly as ``generate`` does it) and its keys/values are copied into
the columns before ``cur`` (all rows shift right first when the prompt is longer than ``cur``). When
``cur`` reaches C the rows shift left by the free columns they all share. With C >= 2 * max_len
(:func:`SlotBatch.__init__` takes ``max_len``, the longest prompt + output a row may reach) a shift
always frees room: after it ``cur`` is the longest row's length (< max_len).

Only position schemes applied through ``position_ids`` work this way (learned, sinusoidal, RoPE, none):
relative biases would need each row's query offset in the cache.

Compiled steps (``compile=True``): the step runs through the compiled decode step of
:mod:`lmforge.generation.compiled` (one ``torch.compile`` graph, weights frozen in) over the whole buffers,
so its shapes do not change as ``cur`` moves: ids (b, 1), the write column as a (1,) tensor, per-row
positions and valid columns (b, C), keys/values (b, H_kv, C, hd). ``b`` is the smallest of a few row
buckets (powers of 4 below R, and R) that holds the occupied rows: the first ``b`` rows of the buffers,
so one request decodes at the cost of a few rows, not of R. Free rows within the bucket decode garbage
that no one reads (each attends at least to its newest column, and every column holds finite values, so
the garbage stays finite; a joining row overwrites its mask). :meth:`SlotBatch.warm_up` compiles every
bucket before serving (tens of seconds each on a 2-core CPU, less with the persistent compile cache of
:func:`~lmforge.generation.compiled.compile_cache_dir`); a step whose compile or run fails falls back to the
eager step, with a warning. Tokens equal the eager step's up to fp32 rounding (the compiled kernels sum in
another order), which can decide only a near-tied argmax.

Example:
    >>> import torch, lmforge
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1).eval()
    >>> batch = SlotBatch(model, rows=2, max_len=16)
    >>> with torch.inference_mode():
    ...     a = batch.join("a", [5, 6, 7]).argmax()
    ...     b = batch.join("b", [9]).argmax()
    ...     logits = batch.step(torch.stack([a, b]))         # (n, V): one forward for both rows
    ...     keys = list(batch.keys)
    ...     batch.leave("a")                                  # its row is free for the next sequence
    >>> keys, logits.shape[0], batch.keys
    (['a', 'b'], 2, ['b'])
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.generation.compiled import check_supported, compiled_step
from lmforge.generation.generate import _decode_weights
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.static_kv_cache import StaticKVCache

SUPPORTED_POSITIONS = ("learned", "sinusoidal", "rope", "none")


def check_slot_model(model) -> None:
    """Raise UserInputError unless ``model`` can decode in a :class:`SlotBatch` (decoders with an LM head
    whose positions go through ``position_ids``)."""
    mc = model.config
    if mc.arch != "decoder" or mc.head != "lm":
        raise UserInputError(f"model {mc.name!r} (arch={mc.arch}, head={mc.head}) cannot be served for "
                             "generation: continuous batching needs a decoder with an LM head")
    if mc.position not in SUPPORTED_POSITIONS:
        raise UserInputError(f"model {mc.name!r} uses {mc.position!r} positions; continuous batching supports "
                             f"{', '.join(SUPPORTED_POSITIONS)} (a relative bias needs each row's offset)")
    if mc.attention in ("lightconv", "dynamicconv") or mc.block == "evolved":
        raise UserInputError(f"model {mc.name!r} has convolution layers (attention={mc.attention!r}, block="
                             f"{mc.block!r}); continuous batching keeps attention keys and values only")


class SlotBatch:
    """Rows of a static KV cache that sequences join and leave (see the module docstring).

    Args:
        model: a decoder with an LM head (:func:`check_slot_model`), in eval mode.
        rows: the most sequences decoded at once (R).
        max_len: the most tokens (prompt + generated) one sequence may hold; C = 2 * max_len columns.
        compile: decode steps through compiled graphs (see the module docstring).
    """

    def __init__(self, model, rows: int, max_len: int, compile: bool = False):
        check_slot_model(model)
        if compile:
            check_supported(model)
        self.model, self.rows, self.max_len = model, rows, max_len
        self.compiled = compile
        self.capacity = 2 * max_len
        self.keys: list[Hashable] = []  # row i holds sequence keys[i]
        self.lengths: list[int] = []  # tokens in the cache per row
        self.cur = 0  # the column the next step writes
        self._k: list[torch.Tensor] = []  # per layer (R, H_kv, C, hd), allocated at the first join
        self._v: list[torch.Tensor] = []
        device = next(model.parameters()).device
        self._valid = torch.zeros(rows, self.capacity, dtype=torch.bool, device=device)  # (R, C)
        if compile:
            self.buckets = row_buckets(rows)
            self._positions = torch.zeros(rows, self.capacity, dtype=torch.long, device=device)  # (R, C)
            self._slots = torch.arange(self.capacity, device=device)  # column c is the view _slots[c:c+1]
            self._steps: dict[int, object] = {}  # bucket -> its compiled step

    @property
    def free(self) -> int:
        return self.rows - len(self.keys)

    def join(self, key: Hashable, ids: Sequence[int]) -> torch.Tensor:
        """Prefill ``ids`` (T,) into a free row for sequence ``key``; return the next-token logits (V,)."""
        return self.join_many([(key, ids)])[0]

    def join_many(self, items: Sequence[tuple[Hashable, Sequence[int]]], all_positions: bool = False
                  ) -> torch.Tensor:
        """Prefill G prompts of one length T together (one forward over (G, T): a wave of new requests costs
        one pass over the weights, not G), each into a free row; return their next-token logits (G, V), or
        with ``all_positions`` the logits at every prompt position (G, T, V) (a server scoring the prompts)."""
        G = len(items)
        T = len(items[0][1]) if items else 0
        if any(len(ids) != T for _, ids in items):
            raise ValueError("join_many prefills prompts of one length only")
        if G > self.free:
            raise RuntimeError("no free row: wait for a sequence to leave")
        if not 0 < T < self.max_len:
            raise ValueError(f"a prompt of {T} tokens does not fit rows of max_len={self.max_len}")
        device = self._valid.device
        cache = KVCache(capacity=T)
        out = self.model(torch.tensor([list(ids) for _, ids in items], device=device), past_key_values=cache,
                         use_cache=True)  # logits (G, T, V)
        if not self._k:
            for layer in range(len(cache._keys)):
                k = cache._keys[layer]
                self._k.append(k.new_zeros(self.rows, k.shape[1], self.capacity, k.shape[3]))
                self._v.append(k.new_zeros(self.rows, k.shape[1], self.capacity, k.shape[3]))
        if self.cur >= self.capacity:
            self._compact()
        if T > self.cur:
            self._shift(T - self.cur)
        i, start = len(self.keys), self.cur - T
        rows = slice(i, i + G)
        for layer in range(len(self._k)):
            # Columns before the prompt are masked but must be finite (0 * NaN would leak through the softmax);
            # those after ``cur`` hold an earlier row's finite values until a step writes them.
            self._k[layer][rows, :, :start] = 0
            self._v[layer][rows, :, :start] = 0
            self._k[layer][rows, :, start:self.cur] = cache._keys[layer][:, :, :T]
            self._v[layer][rows, :, start:self.cur] = cache._values[layer][:, :, :T]
        self._valid[rows] = False
        self._valid[rows, start:self.cur] = True
        self.keys.extend(key for key, _ in items)
        self.lengths.extend([T] * G)
        return out.logits if all_positions else out.logits[:, -1]  # (G, T, V) or (G, V)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` (n,), one per row in :attr:`keys` order; return the next logits (n, V)."""
        n = len(self.keys)
        if tokens.shape != (n,):
            raise ValueError(f"step needs {n} tokens (one per row), got shape {tuple(tokens.shape)}")
        if any(L + 1 > self.max_len for L in self.lengths):
            raise ValueError(f"a row would exceed max_len={self.max_len}: let it leave first")
        if self.cur >= self.capacity:
            self._compact()
        if self.compiled:
            try:
                logits = self._compiled_step(tokens, next(b for b in self.buckets if b >= n))
            except Exception as exc:  # a compiler or toolchain failure: the eager step computes the same
                warnings.warn(f"compiled decode step failed ({type(exc).__name__}: {exc}); decoding eagerly "
                              "from now on", stacklevel=2)
                self.compiled = False
            else:
                self.cur += 1
                self.lengths = [L + 1 for L in self.lengths]
                return logits
        c, W = self.cur, self.cur + 1
        device = self._valid.device
        self._valid[:n, c] = True
        slot = torch.tensor([c], device=device)
        cache = StaticKVCache([k[:n, :, :W] for k in self._k], [v[:n, :, :W] for v in self._v], slot)
        positions = torch.tensor(self.lengths, device=device)[:, None]  # (n, 1): each row's own count
        out = self.model(tokens.reshape(n, 1).to(device), attention_mask=self._valid[:n, None, :W],  # (n, 1, W)
                         position_ids=positions, past_key_values=cache, use_cache=True)
        self.cur = W
        self.lengths = [L + 1 for L in self.lengths]
        return out.logits[:, -1]  # (n, V)

    def _compiled_step(self, tokens: torch.Tensor, b: int) -> torch.Tensor:
        """The step over the first ``b`` rows of the whole buffers, through the compiled graph: logits (n, V)."""
        n, c = len(self.keys), self.cur
        device = self._valid.device
        self._valid[:b, c] = True  # a free row attends to at least one (finite) column: no NaN
        self._positions[:n, c] = torch.tensor(self.lengths, device=device)
        ids = torch.zeros(b, 1, dtype=torch.long, device=device)  # (b, 1)
        ids[:n, 0] = tokens.to(device)
        step = self._steps.get(b)
        if step is None:
            k = self._k[0]
            step = self._steps[b] = compiled_step(self.model, b, self.capacity, k.dtype, k.device)
        logits = step(self.model, ids, self._slots[c:c + 1], self._positions[:b], self._valid[:b],
                      [k[:b] for k in self._k], [v[:b] for v in self._v])  # (b, V)
        return logits[:n]

    def warm_up(self, prompt: Sequence[int] = (0,)) -> bool:
        """Compile the step of every row bucket now (a throwaway sequence joins, steps, and leaves), so that
        no request waits for a compile; False when compiling failed and steps are eager."""
        if not self.compiled or self.keys:
            return self.compiled
        logits = self.join(None, prompt)
        token = logits.argmax()[None]
        for b in self.buckets:
            if not self.compiled:
                break
            try:
                self._compiled_step(token, b)
            except Exception as exc:
                warnings.warn(f"compiled decode step failed ({type(exc).__name__}: {exc}); decoding eagerly",
                              stacklevel=2)
                self.compiled = False
        self.leave(None)
        return self.compiled

    def leave(self, key: Hashable) -> None:
        """Free ``key``'s row: the last row moves into it, so the occupied rows stay packed."""
        i, last = self.keys.index(key), len(self.keys) - 1
        if i != last:
            for buf in (*self._k, *self._v):
                buf[i, :, :self.cur] = buf[last, :, :self.cur]  # after cur: nothing attended to yet
            self._valid[i] = self._valid[last]
            self.keys[i], self.lengths[i] = self.keys[last], self.lengths[last]
        self.keys.pop()
        self.lengths.pop()
        self._valid[last] = False
        if not self.keys:
            self.cur = 0

    def _shift(self, d: int) -> None:
        """Move every row's columns right by ``d`` (d > 0) so that a longer prompt fits before ``cur``."""
        n, c = len(self.keys), self.cur
        if n and c:
            for buf in (*self._k, *self._v):
                buf[:n, :, d:c + d] = buf[:n, :, :c].clone()
                buf[:n, :, :d] = 0
            self._valid[:n, d:c + d] = self._valid[:n, :c].clone()
            self._valid[:n, :d] = False
        self.cur = c + d

    def _compact(self) -> None:
        """Move every row's columns left by the columns that no row uses (those before the longest row)."""
        n, c = len(self.keys), self.cur
        d = c - max(self.lengths, default=0)
        if d <= 0:
            raise RuntimeError("no free columns to reclaim (a row exceeds max_len)")
        for buf in (*self._k, *self._v):
            buf[:n, :, :c - d] = buf[:n, :, d:c].clone()
            buf[:n, :, c - d:] = 0
        self._valid[:n, :c - d] = self._valid[:n, d:c].clone()
        self._valid[:n, c - d:] = False
        self.cur = c - d


def row_buckets(rows: int) -> list[int]:
    """Batch sizes a compiled :class:`SlotBatch` of ``rows`` rows runs at: powers of 4 below ``rows``, and
    ``rows`` (at most 4 sizes: the most that :mod:`lmforge.generation.compiled` keeps per model).

    >>> row_buckets(16), row_buckets(1), row_buckets(8), row_buckets(300)
    ([1, 4, 16], [1], [1, 4, 8], [16, 64, 256, 300])
    """
    below = [4 ** i for i in range(rows.bit_length()) if 4 ** i < rows]
    return (below + [rows])[-4:]


def decoding_forms(model) -> list[torch.Tensor]:
    """The weights that ``generate`` multiplies in their decoding forms (see :mod:`lmforge.nn.linear`): a
    slot decoder run inside ``decoding_weights(decoding_forms(model))`` computes what ``generate`` does."""
    return _decode_weights(model)
