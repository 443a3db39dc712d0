"""Streaming datasets over prepared shards: packed blocks for causal LM, document segments for MLM/T5/BART.

Both datasets are ``torch.utils.data.IterableDataset`` s that yield whole *batches*, and every batch is a
pure function of ``(seed, epoch, batch index, rank, world_size)``:

* **Epoch order.** Shard order is shuffled with ``np.random.default_rng([seed, epoch, 0])`` and the
  documents (or segments) inside shard ``s`` with ``default_rng([seed, epoch, 1, s])``; ``shuffle=False``
  keeps file order.
* **Packing** (:class:`PackedDataset`). The epoch's documents are concatenated with the boundary token
  (eos; BERT: [SEP]) after each one, and the stream is cut into consecutive, non-overlapping blocks of
  ``seq_len + 1`` tokens (the last partial block is dropped)::

      stream:  d7 d7 d7 EOS d2 d2 EOS d9 d9 d9 d9 EOS d4 ...
      blocks:  [------ seq_len+1 -----][------ seq_len+1 -----] ...

  A block ``x`` trains on inputs ``x[:-1]`` and targets ``x[1:]``. Consecutive blocks come from the same
  document, so the epoch's blocks are shuffled within windows of ``WINDOW_BLOCKS`` consecutive blocks
  (``default_rng([seed, epoch, 2, window])``): a batch does not take the next B blocks of the stream.
* **Documents** (:class:`DocumentDataset`). Each document is cut into segments of at most ``max_len``
  tokens; a sample is one segment, without special tokens. With ``sentence_end_ids`` the cuts fall after a
  sentence end where one fits (:func:`sentence_segments`), so a segment holds whole sentences (BERT's
  sentence pairs, RoBERTa's DOC-SENTENCES / FULL-SENTENCES inputs).
* **Ranks and workers.** Sample ``g`` of the epoch goes to rank ``g % world_size``; each rank keeps the same
  number of samples (the remainder, fewer than ``world_size``, is dropped) and cuts them into batches.
  Batch ``i`` of a rank is produced by DataLoader worker ``i % num_workers``, which is the order in
  which ``DataLoader`` returns them, so the batches do not depend on the number of workers.
* **Exact resume.** :meth:`state_dict` is ``{"epoch", "batch"}`` (+ settings that must match); after
  :meth:`load_state_dict` the next batch is the one the uninterrupted run would have produced. Iterating
  the dataset itself (or via :class:`StatefulLoader`, which adds DataLoader workers) keeps the state.

Example:
    >>> import pathlib, tempfile
    >>> from lmforge.data.prepare import prepare
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
    >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
    >>> _ = prepare([d / "corpus.txt"], tok, d / "data", progress=False)  # a folder like `lmforge data prepare`'s
    >>> ds = PackedDataset(d / "data", seq_len=16, batch_size=4, seed=0)
    >>> batch = next(iter(ds)); batch.shape  # (B, seq_len + 1) int64
    torch.Size([4, 17])
    >>> state = ds.state_dict()                  # e.g. saved in a checkpoint
    >>> ds2 = PackedDataset(d / "data", seq_len=16, batch_size=4, seed=0)
    >>> ds2.load_state_dict(state); torch.equal(next(iter(ds2)), next(iter(ds)))
    True
    >>> docs = DocumentDataset(d / "data", max_len=4, batch_size=3)  # documents of 6 tokens: cut into 4 + 2
    >>> [x.shape for x in next(iter(docs))]
    [torch.Size([2]), torch.Size([4]), torch.Size([2])]
    >>> sentence_segments(np.array([7, 7, 5, 7, 5, 7, 7, 7, 7]), np.array([0, 9]), max_len=4, end_ids=[5])
    (array([0, 3, 5]), array([3, 2, 4]))
    >>> loader = StatefulLoader(PackedDataset(d / "data", 16, 4), num_workers=2)
    >>> import json
    >>> for step, batch in enumerate(loader):  # batch: (4, 17)
    ...     if step == 10: _ = (d / "loader.json").write_text(json.dumps(loader.state_dict()))
    >>> resumed = StatefulLoader(PackedDataset(d / "data", 16, 4), num_workers=2)
    >>> resumed.load_state_dict(json.loads((d / "loader.json").read_text()))
    >>> sum(1 for _ in resumed) == len(loader) - 11  # the rest of the epoch
    True
"""

from __future__ import annotations

import abc
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lmforge.data.prepare import read_manifest
from lmforge.data.sources import DataError
from lmforge.errors import IntegrityError, UserInputError
from lmforge.utils.manifest import sha256_file


def _default_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        dist = torch.distributed
        initialised = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if initialised else 0) if rank is None else rank
        world_size = (dist.get_world_size() if initialised else 1) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


class ShardSet:
    """One split of a prepared folder: shard sizes up front, token/offset memmaps opened lazily.

    Memmaps are not pickled (a DataLoader worker opens its own), so the object is cheap to send.

    The first time a shard is opened, its files are checked against the sha256 the manifest records, and its
    token ids against the tokenizer's vocabulary: a damaged shard is an :class:`IntegrityError` naming it.

    Args:
        folder: output folder of ``lmforge data prepare``.
        split: ``"train"`` or ``"val"``.
        verify: hash each shard when first opened (the vocabulary check is cheap and always made).
    """

    def __init__(self, folder: str | Path, split: str = "train", verify: bool = True) -> None:
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        if split not in manifest["splits"]:
            raise DataError(f"{folder}: no split {split!r} (splits: {', '.join(manifest['splits'])})")
        self.split = split
        self.manifest = manifest
        self.shards = [c[split] for c in manifest["chunks"] if c.get(split)]
        if not self.shards:
            raise DataError(f"{folder}: split {split!r} is empty")
        self.dtype = np.dtype(manifest["dtype"])
        self.verify = verify
        self.vocab_size = (manifest.get("tokenizer") or {}).get("vocab_size")
        self.tokens = np.array([s["tokens"] for s in self.shards], dtype=np.int64)  # (S,)
        self.documents = np.array([s["documents"] for s in self.shards], dtype=np.int64)  # (S,)
        self._open: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.shards)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}

    def arrays(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens (N,), offsets (D + 1,))`` memmaps of shard ``shard``."""
        if shard not in self._open:
            info = self.shards[shard]
            if self.verify:
                self._check_hashes(info)
            tokens = np.memmap(self.folder / info["bin"], dtype=self.dtype, mode="r", shape=(info["tokens"],))
            offsets = np.memmap(self.folder / info["idx"], dtype=np.uint64, mode="r",
                                shape=(info["documents"] + 1,))
            self._check_vocabulary(info, tokens)
            self._open[shard] = (tokens, offsets.astype(np.int64))
        return self._open[shard]

    def _check_hashes(self, info: dict[str, Any]) -> None:
        for key, want in (("bin", info.get("sha256")), ("idx", info.get("idx_sha256"))):
            path = self.folder / info[key]
            if want and path.is_file() and sha256_file(path) != want:
                raise IntegrityError(f"{path}: sha256 differs from {self.folder}/manifest.json (the shard was altered "
                                     "or damaged); run the same `lmforge data prepare` again into a new folder")

    def _check_vocabulary(self, info: dict[str, Any], tokens: np.ndarray) -> None:
        if not self.vocab_size or not len(tokens):
            return
        if int(tokens.max()) >= self.vocab_size:  # one vectorised pass over the memmap
            position = int(np.argmax(tokens >= self.vocab_size))
            raise IntegrityError(f"{self.folder / info['bin']}: token id {int(tokens[position])} at position {position}"
                                 f" is outside the tokenizer's vocabulary of {self.vocab_size}; "
                                 "the shard is damaged or was written with another tokenizer: prepare the data again")

    def lengths(self, shard: int) -> np.ndarray:
        """Token count of each document of ``shard``, shape (D,)."""
        offsets = self.arrays(shard)[1]
        return offsets[1:] - offsets[:-1]


class DocumentBatch(list):
    """A batch of document segments (a list of 1-D int64 tensors) that knows where its samples come from.

    ``epoch`` is the epoch it was drawn in and ``sample_ids[i]`` identifies sample ``i`` for good: the offset
    of its first token in the split's token stream (shards in file order). Neither depends on shuffling, batch
    size, rank or worker count, so a batch transform can derive per-sample randomness from them (static
    masking, :mod:`lmforge.objectives.static_masking`). The attributes survive pickling and DataLoader workers.

    Example:
        >>> batch = DocumentBatch([torch.tensor([5, 6]), torch.tensor([7])], epoch=2, sample_ids=[40, 12])
        >>> len(batch), batch.epoch, batch.sample_ids
        (2, 2, [40, 12])
    """

    def __init__(self, samples=(), *, epoch: int = 0, sample_ids=()) -> None:
        super().__init__(samples)
        self.epoch, self.sample_ids = epoch, list(sample_ids)
        if len(self.sample_ids) != len(self):
            raise ValueError(f"{len(self)} samples but {len(self.sample_ids)} sample ids")


class _ShardDataset(IterableDataset, abc.ABC):
    """Epoch/batch bookkeeping, rank and worker slicing, state; subclasses define the samples."""

    kind = "base"

    def __init__(self, folder, *, split, batch_size, seed, shuffle, rank, world_size) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        self.data = ShardSet(folder, split)
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.rank, self.world_size = _default_rank(rank, world_size)
        self.epoch = 0
        self.batch = 0  # next rank-local batch of `epoch`
        self._cache: OrderedDict = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": OrderedDict()}

    # ---- what a subclass defines
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Samples in one epoch, over all ranks."""

    @abc.abstractmethod
    def _samples(self, epoch: int, index: np.ndarray):
        """The samples with epoch indices ``index`` (B,), as one batch."""

    def _settings(self) -> dict[str, Any]:
        return {}

    # ---- epoch structure
    def _shard_order(self, epoch: int) -> np.ndarray:
        n = len(self.data)
        return np.random.default_rng([self.seed, epoch, 0]).permutation(n) if self.shuffle else np.arange(n)

    def _permutation(self, epoch: int, shard: int, n: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch, 1, shard]).permutation(n)

    def _cached(self, key, build):
        # Consecutive batches come from the same one or two shards (and shuffle windows); a few entries suffice.
        if key not in self._cache:
            self._cache[key] = build()
            while len(self._cache) > 8:
                self._cache.popitem(last=False)
        return self._cache[key]

    def samples_per_rank(self) -> int:
        return self.num_samples() // self.world_size

    def __len__(self) -> int:
        """Batches per epoch on this rank (the last, partial batch is dropped)."""
        return self.samples_per_rank() // self.batch_size

    def get_batch(self, epoch: int, i: int):
        """Batch ``i`` of this rank in ``epoch`` (random access; does not change the state)."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} is outside this epoch's {len(self)} batches")
        local = np.arange(i * self.batch_size, (i + 1) * self.batch_size, dtype=np.int64)
        return self._samples(epoch, self._epoch_index(epoch, local * self.world_size + self.rank))

    def _epoch_index(self, epoch: int, index: np.ndarray) -> np.ndarray:
        """Which of the epoch's samples the batch positions ``index`` (B,) hold: the same, unless a subclass
        reorders them (a bijection on ``range(num_samples())``, so ranks and batches stay disjoint)."""
        return index

    def _batches(self, epoch: int, start: int, worker: int, workers: int) -> Iterator:
        for i in range(start + worker, len(self), workers):
            yield self.get_batch(epoch, i)

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        if info is not None:  # inside a DataLoader worker: a copy; the main process keeps the state
            yield from self._batches(self.epoch, self.batch, info.id, info.num_workers)
            return
        if self.batch >= len(self):
            self.epoch, self.batch = self.epoch + 1, 0
        while self.batch < len(self):
            i = self.batch
            batch = self.get_batch(self.epoch, i)
            self.batch = i + 1  # before yielding: a state saved now resumes after this batch
            yield batch
        self.epoch, self.batch = self.epoch + 1, 0

    # ---- state
    def state_dict(self) -> dict[str, Any]:
        """Position (``epoch``, next ``batch``) plus the settings a resumed run must share."""
        return {"kind": self.kind, "epoch": self.epoch, "batch": self.batch, "seed": self.seed,
                "shuffle": self.shuffle, "batch_size": self.batch_size, "rank": self.rank,
                "world_size": self.world_size, "split": self.data.split,
                "data": self.data.manifest["fingerprint"], **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`; settings must match (else ``ValueError``)."""
        mine = self.state_dict()
        for key, value in mine.items():
            if key not in ("epoch", "batch") and state.get(key) != value:
                raise UserInputError(f"cannot resume: saved {key}={state.get(key)!r} but this dataset has {value!r}")
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class PackedDataset(_ShardDataset):
    """Contiguous packing for causal LM: batches of blocks of ``seq_len + 1`` tokens, shape ``(B, seq_len + 1)``.

    Args:
        folder: output folder of ``lmforge data prepare``.
        seq_len: tokens of model input per block (a block holds ``seq_len + 1``: inputs and shifted targets).
        batch_size: blocks per batch.
        split: ``"train"`` or ``"val"``.
        seed: shuffling seed.
        shuffle: shuffle shard and document order each epoch (False: file order, for evaluation).
        rank, world_size: this process's slice; default from ``torch.distributed`` if initialised, else 0/1.
        eos_id: boundary token between documents; default the tokenizer's eos (BERT: [SEP]) from the manifest.

    Example (``data/corpus``: a folder made by ``lmforge data prepare``; the module's example runs this on a
    corpus it makes)::

        ds = PackedDataset("data/corpus", seq_len=128, batch_size=4)
        x = next(iter(ds)); inputs, targets = x[:, :-1], x[:, 1:]  # (4, 128) each
    """

    kind = "packed"

    def __init__(self, folder: str | Path, seq_len: int, batch_size: int, *, split: str = "train", seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 eos_id: int | None = None) -> None:
        super().__init__(folder, split=split, batch_size=batch_size, seed=seed, shuffle=shuffle, rank=rank,
                         world_size=world_size)
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1")
        self.seq_len = seq_len
        self.block = seq_len + 1
        self.eos_id = self.data.manifest["tokenizer"].get("boundary_token_id") if eos_id is None else eos_id
        if self.eos_id is None:
            raise DataError(f"{folder}: the tokenizer has no eos/sep token to separate documents; pass eos_id")
        self.stream = self.data.tokens + self.data.documents  # (S,) tokens + one eos per document
        if len(self) == 0:
            raise DataError(f"{folder} split {split!r}: {int(self.stream.sum()):,} tokens make fewer than one "
                            f"batch of {batch_size} x {self.block} tokens per rank ({self.world_size} ranks)")

    def _settings(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "eos_id": self.eos_id}

    def num_samples(self) -> int:
        return int(self.stream.sum()) // self.block

    # Blocks are cut from one stream of whole documents, so consecutive blocks come from the same document: the
    # bundled Austen corpus has about 3,300 tokens per document (a chapter), and a batch of 16 consecutive
    # 129-token blocks held one or two chapters, correlated examples that made a causal LM learn less per step
    # than one trained on blocks drawn at random (HF Trainer's sampler; held-out loss 5.42 against 5.33 after
    # 200 steps of gpt-tiny, benchmarks/training_jobs.py). The blocks are therefore shuffled within windows of
    # WINDOW_BLOCKS (a shuffle buffer): a batch's blocks come from all over a window of 1,024 blocks (132K tokens
    # at length 128), and a window stays within one or two shards, so reading stays local. The window counts
    # samples, not batches, so the order is the same for any batch size and number of ranks.
    WINDOW_BLOCKS = 1024

    def _epoch_index(self, epoch: int, index: np.ndarray) -> np.ndarray:
        if not self.shuffle:
            return index
        size, n = self.WINDOW_BLOCKS, self.num_samples()
        window = index // size
        out = np.empty_like(index)
        for w in np.unique(window):
            start = int(w) * size
            perm = self._cached(("window", epoch, int(w)), lambda: np.random.default_rng(
                [self.seed, epoch, 2, int(w)]).permutation(min(size, n - start)))
            sel = window == w
            out[sel] = start + perm[index[sel] - start]
        return out

    def _layout(self, epoch: int, shard: int):
        """Shard ``shard`` in epoch order: stream offsets (D+1,), token starts (D,), lengths (D,)."""
        def build():
            offsets = self.data.arrays(shard)[1]
            perm = self._permutation(epoch, shard, len(offsets) - 1)
            starts, lengths = offsets[:-1][perm], (offsets[1:] - offsets[:-1])[perm]
            cum = np.zeros(len(perm) + 1, dtype=np.int64)
            np.cumsum(lengths + 1, out=cum[1:])
            return cum, starts, lengths
        return self._cached(("layout", epoch, shard), build)

    def _samples(self, epoch: int, index: np.ndarray) -> torch.Tensor:
        order = self._cached(("order", epoch), lambda: self._shard_order(epoch))
        shard_start = np.concatenate([[0], np.cumsum(self.stream[order])])  # (S+1,) in epoch order
        pos = (index[:, None] * self.block + np.arange(self.block)).ravel()  # (B*L,) stream positions
        out = np.empty(pos.size, dtype=np.int64)
        where = np.searchsorted(shard_start, pos, side="right") - 1
        for s in np.unique(where):
            sel = where == s
            cum, starts, lengths = self._layout(epoch, int(order[s]))
            local = pos[sel] - shard_start[s]
            doc = np.searchsorted(cum, local, side="right") - 1
            offset = local - cum[doc]
            is_eos = offset >= lengths[doc]
            tokens = self.data.arrays(int(order[s]))[0]
            src = starts[doc] + np.minimum(offset, lengths[doc] - 1)
            out[sel] = np.where(is_eos, self.eos_id, tokens[src])
        return torch.from_numpy(out.reshape(len(index), self.block))


def sentence_segments(tokens: np.ndarray, offsets: np.ndarray, max_len: int,
                      end_ids) -> tuple[np.ndarray, np.ndarray]:
    """Cut documents into segments of at most ``max_len`` tokens at sentence ends: greedily, each segment
    takes as many whole sentences as fit (a sentence ends at, and includes, a token of ``end_ids``; a
    document's end closes its last one). A sentence longer than ``max_len`` is cut at ``max_len`` tokens.

    Args:
        tokens: (N,) a shard's tokens. offsets: (D + 1,) document boundaries. end_ids: sentence-end ids.
    Returns:
        ``(start, length)``, both (U,) int64, in file order; empty documents give no segment.
    """
    ends = np.flatnonzero(np.isin(tokens, np.asarray(list(end_ids), dtype=np.int64))) + 1  # exclusive ends
    cuts = np.union1d(ends, offsets)  # (C,) sorted places a segment may end
    starts, lengths = [], []
    start, last = int(offsets[0]), int(offsets[-1])
    while start < last:
        doc_end = int(offsets[np.searchsorted(offsets, start, side="right")])  # a segment never crosses it
        limit = min(start + max_len, doc_end)
        end = int(cuts[np.searchsorted(cuts, limit, side="right") - 1])  # the furthest cut that fits
        end = end if end > start else limit
        starts.append(start)
        lengths.append(end - start)
        start = end
    return np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)


class DocumentDataset(_ShardDataset):
    """Per-document samples for objectives that need whole documents (MLM segments, T5 / BART denoising).

    Each document is cut into segments of at most ``max_len`` tokens; a batch is a :class:`DocumentBatch`: a
    list of ``batch_size`` 1-D int64 tensors (segment lengths vary; no special tokens are added) that also
    carries its epoch and each segment's fixed identity.

    Args:
        folder: output folder of ``lmforge data prepare``.
        max_len: longest segment, in tokens.
        batch_size: segments per batch.
        split, seed, shuffle, rank, world_size: as for :class:`PackedDataset`.
        sentence_end_ids: cut at sentence ends (:func:`sentence_segments`) instead of every ``max_len`` tokens;
            counting the segments then reads every token once, at construction.

    Example (as for :class:`PackedDataset`, the module's example runs this)::

        ds = DocumentDataset("data/corpus", max_len=510, batch_size=16)
        [x.shape for x in next(iter(ds))][:2]  # [torch.Size([510]), torch.Size([87])]: segments vary
    """

    kind = "documents"

    def __init__(self, folder: str | Path, max_len: int, batch_size: int, *, split: str = "train", seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 sentence_end_ids=None) -> None:
        super().__init__(folder, split=split, batch_size=batch_size, seed=seed, shuffle=shuffle, rank=rank,
                         world_size=world_size)
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be >= 1")
        self.max_len = max_len
        self.sentence_end_ids = None if sentence_end_ids is None else sorted({int(i) for i in sentence_end_ids})
        # Segments per shard; reading every offsets file once is O(documents), done at construction.
        if self.sentence_end_ids is None:
            self.units = np.array([int(((self.data.lengths(s) + max_len - 1) // max_len).sum())
                                   for s in range(len(self.data))], dtype=np.int64)  # (S,)
        else:
            self.units = np.array([len(self._cut(s)[0]) for s in range(len(self.data))], dtype=np.int64)
        self.data._open.clear()
        if len(self) == 0:
            raise DataError(f"{folder} split {split!r}: {int(self.units.sum()):,} segments make fewer than one "
                            f"batch of {batch_size} per rank ({self.world_size} ranks)")

    def _settings(self) -> dict[str, Any]:
        # Only when set, so that checkpoints written before the option existed still resume.
        return {"max_len": self.max_len, **({"sentence_end_ids": self.sentence_end_ids}
                                            if self.sentence_end_ids is not None else {})}

    def num_samples(self) -> int:
        return int(self.units.sum())

    def _cut(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Segments of ``shard`` in file order: token start (U,) and length (U,)."""
        tokens, offsets = self.data.arrays(shard)
        if self.sentence_end_ids is not None:
            return sentence_segments(tokens, offsets, self.max_len, self.sentence_end_ids)
        lengths = offsets[1:] - offsets[:-1]
        count = (lengths + self.max_len - 1) // self.max_len  # (D,)
        doc = np.repeat(np.arange(len(lengths)), count)  # (U,)
        first = np.repeat(np.cumsum(count) - count, count)
        seg = np.arange(len(doc)) - first  # segment number inside its document
        start = offsets[:-1][doc] + seg * self.max_len
        return start, np.minimum(self.max_len, lengths[doc] - seg * self.max_len)

    def _segments(self, epoch: int, shard: int):
        """Segments of ``shard`` in epoch order: token start (U,) and length (U,)."""
        def build():
            start, length = self._cut(shard)
            perm = self._permutation(epoch, shard, len(start))
            return start[perm], length[perm]
        return self._cached(("segments", epoch, shard), build)

    def _samples(self, epoch: int, index: np.ndarray) -> DocumentBatch:
        order = self._cached(("order", epoch), lambda: self._shard_order(epoch))
        unit_start = np.concatenate([[0], np.cumsum(self.units[order])])
        where = np.searchsorted(unit_start, index, side="right") - 1
        shard_offset = np.concatenate([[0], np.cumsum(self.data.tokens)])  # (S+1,) in file order
        out, ids = [], []
        for g, s in zip(index.tolist(), where.tolist()):
            shard = int(order[s])
            start, length = self._segments(epoch, shard)
            u = g - unit_start[s]
            tokens = self.data.arrays(shard)[0][start[u]:start[u] + length[u]]
            out.append(torch.from_numpy(tokens.astype(np.int64)))
            ids.append(int(shard_offset[shard] + start[u]))
        return DocumentBatch(out, epoch=epoch, sample_ids=ids)


class StatefulLoader:
    """DataLoader workers for a shard dataset, keeping its resumable state in the main process.

    A plain ``DataLoader`` iterates copies of the dataset in its workers, so the dataset in the main
    process never learns how far they got. This wrapper counts the batches it hands out, so
    :meth:`state_dict` is exact with any ``num_workers``.

    Args:
        dataset: a :class:`PackedDataset` or :class:`DocumentDataset`.
        num_workers: worker processes (0: load in this process).
        pin_memory: pin batches for faster host-to-GPU copies.
        prefetch_factor: batches each worker loads ahead.

    Example (the module's example runs this, and resumes from the saved state, on a corpus it makes)::

        loader = StatefulLoader(PackedDataset("data/corpus", 256, 8), num_workers=2)
        for step, batch in enumerate(loader):  # batch: (8, 257)
            if step == 100: Path("loader.json").write_text(json.dumps(loader.state_dict()))
    """

    def __init__(self, dataset: _ShardDataset, num_workers: int = 0, pin_memory: bool = False,
                 prefetch_factor: int | None = None) -> None:
        self.dataset, self.num_workers = dataset, num_workers
        self.pin_memory, self.prefetch_factor = pin_memory, prefetch_factor

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator:
        ds = self.dataset
        if self.num_workers == 0:
            yield from ds
            return
        if ds.batch >= len(ds):
            ds.epoch, ds.batch = ds.epoch + 1, 0
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                            prefetch_factor=self.prefetch_factor)
        for batch in loader:
            ds.batch += 1
            yield batch
        ds.epoch, ds.batch = ds.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
