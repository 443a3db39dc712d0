"""Tokenise a corpus into sharded token files: ``lmforge data prepare``.

Layout of the output folder::

    manifest.json        counts, dtype, checksums, settings, the training tokens' unigram entropy
                         (:mod:`lmforge.data.unigram`); ``"complete": true`` once finished
    tokenizer/           copy of the tokenizer used (so the folder is self-describing)
    train/00000.bin      tokens of the chunk's documents, concatenated: raw ``uint16``/``uint32``, shape (N,)
    train/00000.idx      document offsets into the .bin: raw ``uint64``, shape (D + 1,), first 0, last N
    val/00000.bin ...    the same for the documents of the chunk that fall in the validation split

Read a shard with ``np.memmap(path, dtype=manifest["dtype"], mode="r")``; document ``i`` is
``tokens[idx[i]:idx[i + 1]]``. No special tokens are stored: loaders insert the boundary token (eos).

How it works. Documents are read in input order and cut into *chunks* of about ``shard_mb`` MB of
UTF-8 text; chunk ``k`` becomes the shard pair ``train/k`` and ``val/k`` (a split with no documents
in a chunk gets no file). A document goes to the validation split when a keyed hash of its text falls
below ``val_fraction``, so the split is deterministic, independent of document order, and duplicated
documents never straddle train and val. Because chunk boundaries depend only on the text, a rerun
after a crash re-reads the inputs, skips the chunks the manifest lists as finished, and produces
byte-identical shards. Every file is written to a temporary name and renamed into place
(``os.replace``), and the manifest is rewritten the same way after each chunk, so a killed run leaves
only complete shards behind.

Throughput. Tokenisation runs in ``tokenizers``' Rust thread pool (``encode_batch_fast`` on batches of
a few MB of text, all cores); a helper thread encodes batch ``i + 1`` while this thread reads the next
batch and converts batch ``i`` to numpy, which keeps the cores busy. (A pool of 2 processes, each
encoding single-threaded and returning numpy arrays, was measured against this on 35 MB on 2 cores,
5 interleaved runs each: no faster, and it pickles all text out and all ids back.)

Example:
    >>> import pathlib, tempfile
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
    >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
    >>> manifest = prepare([d / "*.txt"], tok, d / "data", val_fraction=0.01, progress=False)
    >>> manifest["splits"]["train"]["documents"], manifest["splits"]["val"]["documents"]
    (397, 3)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from lmforge.data.sources import DataError, iter_documents, resolve_inputs
from lmforge.data.unigram import unigram_entropy
from lmforge.errors import InputFileNotFound
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, replace_dir, staging_dir
from lmforge.utils.lock import LOCK_FILE, OWNER_FILE, RunFolderLock, remove_stale_temporaries
from lmforge.utils.manifest import sha256_file

SPLITS = ("train", "val")
MANIFEST = "manifest.json"
FORMAT = "lmforge-shards"
UINT16_LIMIT = 1 << 16
# Batches encoding at once. One already keeps the Rust pool busy: the next batch is queued before this
# thread converts the previous one, so encoding never waits for Python.
ENCODERS = 1


def choose_dtype(vocab_size: int, dtype: str = "auto") -> str:
    """Storage dtype for token ids: ``uint16`` when every id fits (vocab ≤ 65,536), else ``uint32``.

    Raises:
        DataError: ``dtype="uint16"`` was forced but the vocabulary is larger.
    """
    if dtype == "auto":
        return "uint16" if vocab_size <= UINT16_LIMIT else "uint32"
    if dtype == "uint16" and vocab_size > UINT16_LIMIT:
        raise DataError(f"--dtype uint16 cannot hold this vocabulary: {vocab_size:,} tokens, ids up to "
                        f"{vocab_size - 1:,} > 65,535; use --dtype uint32 or auto")
    if dtype not in ("uint16", "uint32"):
        raise DataError(f"--dtype {dtype!r}: use auto, uint16 or uint32")
    return dtype


def _val_threshold(fraction: float) -> int:
    return int(fraction * (1 << 64))


def _hash(text: bytes, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text, digest_size=8, key=key).digest(), "little")


def _is_val(text: bytes, key: bytes, threshold: int) -> bool:
    # A keyed hash (not an RNG over positions): membership depends only on the text and the seed.
    return _hash(text, key) < threshold


# Corpora up to this size are read twice when needed, so that a small one keeps a validation document.
SMALL_CORPUS_BYTES = 64_000_000


def _threshold_keeping_one(paths, text_field: str, key: bytes, threshold: int) -> int:
    """``threshold``, raised just enough to put one document in validation when none falls below it.

    With ``--val-fraction 0.01`` a corpus of 138 documents expects 1.4 validation documents and gets none a
    quarter of the time; pre-training then runs without evaluation. Raising the threshold to just above the
    smallest hash moves the one text with that hash (and its duplicates) to validation and keeps the split a
    function of the texts and the seed alone, so a resumed run makes the same one.

    Bad input is left to the main pass, which reports it after writing the chunks before it: this pass reads
    bad bytes as U+FFFD (so a rerun with ``--errors replace`` finds the same threshold) and gives up on
    anything else.
    """
    hashes: set[int] = set()
    try:
        for text in iter_documents(paths, text_field=text_field, errors="replace"):
            h = _hash(text.encode("utf-8", "surrogatepass"), key)
            if h < threshold:
                return threshold
            hashes.add(h)
    except DataError:
        return threshold
    return min(hashes) + 1 if len(hashes) >= 2 else threshold  # one distinct text: nothing to hold out


def _write_array(path: Path, array: np.ndarray) -> str:
    """Write ``array``'s raw bytes atomically; return their sha256."""
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _clean_temporaries(out: Path) -> None:
    # A SIGKILL between writing a temporary file and renaming it leaves the temporary behind.
    for folder in (out, *(out / s for s in SPLITS)):
        if folder.is_dir():
            for tmp in folder.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)


def _verified_chunks(out: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The finished chunks whose files are present with the right sizes (a prefix of the list)."""
    itemsize = np.dtype(manifest["dtype"]).itemsize
    good = []
    for chunk in manifest.get("chunks", []):
        for split in SPLITS:
            shard = chunk.get(split)
            if shard and not ((out / shard["bin"]).is_file() and (out / shard["idx"]).is_file()
                              and (out / shard["bin"]).stat().st_size == shard["tokens"] * itemsize
                              and (out / shard["idx"]).stat().st_size == (shard["documents"] + 1) * 8):
                return good
        good.append(chunk)
    return good


def _summarise(manifest: dict[str, Any]) -> None:
    for split in SPLITS:
        shards = [c[split] for c in manifest["chunks"] if c.get(split)]
        manifest["splits"][split] = {"shards": len(shards), "tokens": sum(s["tokens"] for s in shards),
                                     "documents": sum(s["documents"] for s in shards)}


class _Chunk:
    """Token buffers of the chunk being tokenised, per split."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.arrays: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        self.lengths: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.documents = 0  # documents read into this chunk (both splits, empty ones included)
        self.text_bytes = 0
        self.empty = 0  # documents that tokenised to nothing (not stored)


def _add_encoded(chunk: _Chunk, encodings, is_val: list[bool], dtype: np.dtype) -> None:
    ids = [e.ids for e in encodings]
    for split, want in (("train", False), ("val", True)):
        docs = [x for x, v in zip(ids, is_val) if v is want and x]
        if docs:
            lengths = list(map(len, docs))
            chunk.lengths[split].extend(lengths)
            chunk.arrays[split].append(np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype,
                                                   count=sum(lengths)))
    chunk.empty += sum(1 for x in ids if not x)


def _write_chunk(out: Path, chunk: _Chunk, dtype: np.dtype) -> dict[str, Any]:
    record: dict[str, Any] = {"index": chunk.index, "documents_read": chunk.documents,
                              "text_bytes": chunk.text_bytes, "empty_documents": chunk.empty}
    for split in SPLITS:
        if not chunk.lengths[split]:
            record[split] = None
            continue
        tokens = np.concatenate(chunk.arrays[split]) if chunk.arrays[split] else np.zeros(0, dtype)
        offsets = np.zeros(len(chunk.lengths[split]) + 1, dtype=np.uint64)
        np.cumsum(chunk.lengths[split], out=offsets[1:])
        name = f"{split}/{chunk.index:05d}"
        record[split] = {"bin": f"{name}.bin", "idx": f"{name}.idx", "tokens": int(tokens.size),
                         "documents": len(chunk.lengths[split]),
                         "sha256": _write_array(out / f"{name}.bin", tokens),
                         "idx_sha256": _write_array(out / f"{name}.idx", offsets)}
    return record


def prepare(
    inputs: str | Path | Iterable[str | Path],
    tokenizer: Tokenizer | str | Path,
    out_dir: str | Path,
    *,
    val_fraction: float = 0.01,
    seed: int = 0,
    text_field: str = "text",
    errors: str = "strict",
    dtype: str = "auto",
    shard_mb: float = 64.0,
    batch_mb: float = 4.0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenise ``inputs`` into shards under ``out_dir`` (see the module docstring), resuming if possible.

    Args:
        inputs: files, globs or folders (formats of :mod:`lmforge.data.sources`).
        tokenizer: a :class:`~lmforge.tokenization.Tokenizer` or a path :meth:`Tokenizer.load` accepts.
        out_dir: output folder; created if needed.
        val_fraction: expected fraction of documents in the validation split (0 for none); a corpus of at
            most 64 MB with two different documents or more keeps at least one there.
        seed: key of the hash that assigns documents to train/val.
        text_field: JSONL field / CSV, TSV, Parquet column holding the text.
        errors: ``"strict"`` or ``"replace"`` for non-UTF-8 bytes.
        dtype: ``"auto"``, ``"uint16"`` or ``"uint32"`` (see :func:`choose_dtype`).
        shard_mb: MB of input text per chunk (one train and one val shard each).
        batch_mb: MB of text per ``encode_batch_fast`` call.
        overwrite: replace an ``out_dir`` prepared with other inputs or settings instead of failing.
        progress: show a tqdm progress bar (bytes of input read) on stderr.

    Returns:
        The manifest (also in ``out_dir/manifest.json``).

    Raises:
        DataError: bad input (see :mod:`lmforge.data.sources`), no text at all, a forced dtype that is too
            small, or ``out_dir`` holding a different preparation.
        FileNotFoundError: an input does not exist.
    """
    if not 0 <= val_fraction < 1:
        raise DataError(f"--val-fraction {val_fraction}: must be in [0, 1)")
    if shard_mb <= 0 or batch_mb <= 0:
        raise DataError("--shard-mb and batch_mb must be positive")
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    np_dtype = np.dtype(choose_dtype(tok.vocab_size, dtype))
    paths = resolve_inputs(inputs)
    out = Path(out_dir)

    settings = {
        "tokenizer_sha256": tok.sha256(), "dtype": np_dtype.name, "val_fraction": val_fraction, "seed": seed,
        "text_field": text_field, "shard_bytes": int(shard_mb * 1e6),
        "inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                   for p in paths],
    }
    fingerprint = _fingerprint(settings)
    old = _check_foreign(out, fingerprint, settings, overwrite)  # reads only: a refused re-run writes nothing
    if old is not None and old.get("fingerprint") == fingerprint and old.get("complete"):
        return old  # finished: nothing to write, so no lock either (the folder may be read-only by now)
    created = not out.exists()
    with RunFolderLock(out):  # one writer per folder; _start checks again under the lock
        return _prepare(out, fingerprint, settings, overwrite, created, tok, paths, np_dtype, val_fraction, seed,
                        text_field, errors, shard_mb, batch_mb, progress)


def _prepare(out, fingerprint, settings, overwrite, created, tok, paths, np_dtype, val_fraction, seed, text_field,
             errors, shard_mb, batch_mb, progress) -> dict[str, Any]:
    manifest = _start(out, fingerprint, settings, overwrite)
    if manifest.get("complete"):
        return manifest
    final = None
    if manifest.pop("replace", False):
        # Replacing another preparation: build aside and swap in once complete, so a failure (a full disk,
        # Ctrl-C) keeps the old shards.
        remove_stale_temporaries(out.parent, out.name)
        final, out = out, staging_dir(out)
    manifest.update({
        "format": FORMAT, "version": 1, "complete": False, "fingerprint": fingerprint, "dtype": np_dtype.name,
        "settings": settings,
        "tokenizer": {"path": "tokenizer", "sha256": settings["tokenizer_sha256"], "family": tok.family,
                      "kind": tok.kind, "vocab_size": tok.vocab_size,
                      "special_token_ids": tok.special_token_ids(), "boundary_token_id": tok.boundary_id},
        "splits": {s: {} for s in SPLITS},
    })
    try:
        _run(out, manifest, tok, paths, np_dtype, val_fraction, seed, text_field, errors, shard_mb, batch_mb,
             progress)
    except BaseException:
        _clean_temporaries(out)
        if final is not None:
            shutil.rmtree(out, ignore_errors=True)
        elif not manifest["chunks"]:  # nothing finished: leave no trace of this run
            if created:
                shutil.rmtree(out, ignore_errors=True)
            else:
                for name in (*SPLITS, "tokenizer"):
                    shutil.rmtree(out / name, ignore_errors=True)
        raise
    if final is not None:
        _keep_other_files(final, out)
        replace_dir(out, final)
    return manifest


def _check_foreign(out: Path, fingerprint: str, settings: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """The manifest in ``out`` (None if there is none); refuse one of a preparation with other settings."""
    path = out / MANIFEST
    if not path.is_file():
        return None
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("fingerprint") != fingerprint and not overwrite:
        before = old.get("settings", {})
        changed = [k for k in settings if before.get(k) != settings[k]] or ["format"]
        raise DataError(f"{out} holds shards prepared with different {', '.join(changed)}; "
                        "pass --overwrite to replace them or choose another --out")
    return old


LOCK_FILES = (LOCK_FILE, OWNER_FILE)  # the run folder's own lock: never copied into its replacement


def _keep_other_files(old: Path, new: Path) -> None:
    """Copy what the user kept in an output folder being replaced (notes, say) into its replacement."""
    for child in old.iterdir():
        leftover = (child.name.startswith(".") and child.name.endswith((".tmp", ".old"))) or child.name in LOCK_FILES
        if child.name not in (*SPLITS, "tokenizer", MANIFEST) and not leftover and not (new / child.name).exists():
            copy = shutil.copytree if child.is_dir() else shutil.copy2
            copy(child, new / child.name)


def _start(out: Path, fingerprint: str, settings: dict[str, Any], overwrite: bool) -> dict[str, Any]:
    """Load a resumable manifest from ``out`` (or start a fresh one); refuse a foreign preparation."""
    old = _check_foreign(out, fingerprint, settings, overwrite)
    if old is None:
        _clean_temporaries(out)
        return {"chunks": []}
    if old.get("fingerprint") == fingerprint:
        _clean_temporaries(out)
        if old.get("complete"):
            return old
        return {"chunks": _verified_chunks(out, old)}
    return {"chunks": [], "replace": True}  # the old shards stay until the new ones are complete


def _run(out, manifest, tok, paths, np_dtype, val_fraction, seed, text_field, errors, shard_mb, batch_mb,
         progress) -> None:
    from tqdm.auto import tqdm

    done = {c["index"] for c in manifest["chunks"]}
    shard_bytes, batch_bytes = int(shard_mb * 1e6), int(batch_mb * 1e6)
    key = seed.to_bytes(8, "little", signed=True)
    threshold = _val_threshold(val_fraction)
    if threshold > 0 and sum(p.stat().st_size for p in paths) <= SMALL_CORPUS_BYTES:
        threshold = _threshold_keeping_one(paths, text_field, key, threshold)
    counts: dict[str, int] = {}
    bar = tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc="prepare",
               disable=not progress, dynamic_ncols=True)
    encode = tok.backend.encode_batch_fast
    pool = ThreadPoolExecutor(max_workers=ENCODERS, thread_name_prefix="lmforge-encode")
    inflight: deque = deque()  # (chunk, is_val flags, future, closes the chunk)

    def collect() -> None:
        chunk, flags, future, closes = inflight.popleft()
        _add_encoded(chunk, future.result(), flags, np_dtype)
        if closes:
            manifest["chunks"].append(_write_chunk(out, chunk, np_dtype))
            _summarise(manifest)
            atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")

    def submit(chunk: _Chunk, docs: list[str], flags: list[bool], closes: bool) -> None:
        inflight.append((chunk, flags, pool.submit(encode, docs, add_special_tokens=False), closes))
        while len(inflight) > ENCODERS:  # bounded: at most ENCODERS batches in flight
            collect()

    chunk = _Chunk(0)
    docs: list[str] = []
    flags: list[bool] = []
    size = pending = 0
    total_docs = 0
    try:
        tok.save(out / "tokenizer")
        for text in iter_documents(paths, text_field=text_field, errors=errors, on_bytes=bar.update,
                                   counts=counts):
            raw = text.encode("utf-8", "surrogatepass")
            total_docs += 1
            chunk.documents += 1
            chunk.text_bytes += len(raw)
            size += len(raw)
            if chunk.index not in done:  # finished chunks are only counted, never re-tokenised
                docs.append(text)
                flags.append(threshold > 0 and _is_val(raw, key, threshold))
                pending += len(raw)
            closes = size >= shard_bytes
            if docs and (closes or pending >= batch_bytes):
                submit(chunk, docs, flags, closes)
                docs, flags, pending = [], [], 0
            if closes:
                chunk, size = _Chunk(chunk.index + 1), 0
        if total_docs == 0:
            raise DataError(f"no text in the inputs ({', '.join(map(str, paths))}): every file is empty")
        if docs or (size and chunk.index not in done):
            submit(chunk, docs, flags, True)
        while inflight:
            collect()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    for path, n in counts.items():
        if n == 0:
            warnings.warn(f"{path}: no documents (empty file?)", stacklevel=3)
    _summarise(manifest)
    if manifest["splits"]["train"]["tokens"] == 0 and manifest["splits"]["val"]["tokens"] == 0:
        raise DataError("the inputs tokenised to no tokens at all")
    if val_fraction > 0 and manifest["splits"]["val"]["documents"] == 0:
        warnings.warn(f"the validation split is empty ({total_docs} documents, --val-fraction {val_fraction}): "
                      "no held-out loss can be measured; give at least two different documents, a larger "
                      "--val-fraction, or --val-fraction 0 to train without one", stacklevel=3)
    manifest["documents_read"] = total_docs
    # One pass over the finished train shards (seconds per GB): what a context-free model's loss would be.
    manifest["unigram_entropy"] = unigram_entropy(out, manifest)
    manifest["complete"] = True
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of a prepared folder.

    Raises:
        FileNotFoundError: no ``manifest.json``.
        DataError: the preparation is incomplete (rerun ``lmforge data prepare`` to finish it).
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise InputFileNotFound(f"{folder}: no {MANIFEST}; create it with `lmforge data prepare`")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not an lmforge shard manifest")
    if not manifest.get("complete"):
        raise DataError(f"{folder}: preparation incomplete ({len(manifest.get('chunks', []))} chunks done); "
                        "rerun the same `lmforge data prepare` command to finish it")
    return manifest


def verify(folder: str | Path) -> list[str]:
    """Re-hash every shard of a prepared folder; return the problems found (empty list: all good)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    problems = []
    for chunk in manifest["chunks"]:
        for split in SPLITS:
            shard = chunk.get(split)
            for kind in ("bin", "idx") if shard else ():
                path = folder / shard[kind]
                want = shard["sha256" if kind == "bin" else "idx_sha256"]
                if not path.is_file():
                    problems.append(f"{path}: missing")
                    continue
                if sha256_file(path) != want:
                    problems.append(f"{path}: checksum mismatch")
    return problems
