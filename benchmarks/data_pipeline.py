"""Throughput of the data pipeline: `data prepare` against raw `tokenizers` encode_batch, and the packed loader.

Builds >= 50 MB of text (the shared corpus repeated, in a temp dir), then in one run measures:

* raw ``tokenizers.Tokenizer.encode_batch`` on the documents already in memory (the ceiling: Rust
  parallelism over large batches, nothing else);
* ``lmforge.data.prepare.prepare`` end to end on the files (read, decode, split documents, hash for the
  val split, tokenise, convert to uint16, checksum, write shards atomically);
* the packed loader (``PackedDataset``, seq_len 1024, batch 8): tokens/s of finished batches.

Each tokenisation measurement is repeated (interleaved, so a noisy neighbour hurts both alike) and the
best run of each is reported. Targets: prepare >= 0.8x raw; loader >= 100k tokens/s.

Usage::

    .venv/bin/python benchmarks/data_pipeline.py            # ~55 MB
    .venv/bin/python benchmarks/data_pipeline.py --quick    # ~5 MB

Output: one line per measurement, then one JSON line with every number (read by ``lmforge bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file (python benchmarks/data_pipeline.py): the checkout root is the import root
    sys.path.insert(0, str(ROOT))
from benchmarks.common import run_interleaved  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def build_corpus(folder: Path, target_mb: float) -> list[Path]:
    """Write the shared corpus (or the packaged one) repeated to >= target_mb MB, in ~10 MB .txt files."""
    sources = sorted((SHARED / "corpus").glob("*.txt"))
    if sources:
        text = "\n\n".join(p.read_text(encoding="utf-8").strip("\n") for p in sources) + "\n\n"
    else:  # no shared tree: the corpus shipped in the package
        import gzip

        from lmforge import datasets

        text = gzip.decompress(datasets.path("corpus").read_bytes()).decode("utf-8").strip("\n") + "\n\n"
    data = text.encode("utf-8")
    files, written, target = [], 0, int(target_mb * 1e6)
    while written < target:
        piece = data[: max(1, min(len(data), target - written, 10_000_000))]
        # Cut at a document boundary so every file is well-formed.
        cut = piece.rfind(b"\n\n") + 2 if len(piece) < len(data) else len(piece)
        path = folder / f"part{len(files):03d}.txt"
        path.write_bytes(piece[:cut] if cut > 2 else piece)
        written += path.stat().st_size
        files.append(path)
    return files


def load_tokenizer():
    from lmforge.tokenization import Tokenizer

    if (SHARED / "tokenizers" / "gpt2").is_dir():
        return Tokenizer.load(SHARED / "tokenizers" / "gpt2"), "GPT-2 byte-level BPE (50,257)"
    from lmforge import datasets
    from lmforge.tokenization import train_tokenizer

    tok = train_tokenizer([datasets.path("corpus")], kind="byte-bpe", vocab_size=16384, show_progress=False)
    return tok, "byte-level BPE trained on the packaged corpus (16,384)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~5 MB instead of ~55 MB")
    parser.add_argument("--mb", type=float, default=None, help="MB of text (default 55, quick 5)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tokenisation measurement")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    target = args.mb or (5.0 if args.quick else 55.0)

    from lmforge.data import PackedDataset, iter_documents
    from lmforge.data.prepare import prepare

    tok, tok_name = load_tokenizer()
    tmp = Path(tempfile.mkdtemp(prefix="lmforge-bench-"))
    try:
        files = build_corpus(tmp, target)
        docs = list(iter_documents(files))
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        mb = nbytes / 1e6
        print(f"corpus: {mb:.1f} MB of text, {len(docs):,} documents, {len(files)} files; tokenizer: {tok_name}; "
              f"{os.cpu_count()} CPU cores")
        # Raw baseline batches: the same ~4 MB batches of documents that prepare() sends to the tokenizer.
        batches, batch, size = [], [], 0
        for d in docs:
            batch.append(d)
            size += len(d.encode("utf-8"))
            if size >= 4_000_000:
                batches.append(batch)
                batch, size = [], 0
        batches.append(batch)

        out = tmp / "out"
        runs = iter(range(args.repeats))
        manifest: dict = {}

        def raw_step() -> None:
            for b in batches:
                tok.backend.encode_batch(b, add_special_tokens=False)

        def fast_step() -> None:
            for b in batches:
                tok.backend.encode_batch_fast(b, add_special_tokens=False)

        def prepare_step() -> None:  # a fresh folder per run, so no clean-up is timed
            manifest.update(prepare(files, tok, out / str(next(runs)), val_fraction=0.01, progress=False))

        (raw_times, fast_times, ours_times), _ = run_interleaved([raw_step, fast_step, prepare_step],
                                                                 repeats=args.repeats)
        raw, fast, ours = mb / min(raw_times), mb / min(fast_times), mb / min(ours_times)
        tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"]
        print(f"raw tokenizers encode_batch:      {raw:6.2f} MB/s  (runs: "
              + ", ".join(f"{mb / t:.2f}" for t in raw_times) + ")")
        print(f"raw tokenizers encode_batch_fast: {fast:6.2f} MB/s  (runs: "
              + ", ".join(f"{mb / t:.2f}" for t in fast_times) + ")")
        print(f"lmforge data prepare (end to end): {ours:5.2f} MB/s  (runs: "
              + ", ".join(f"{mb / t:.2f}" for t in ours_times) + f"); {tokens:,} tokens, {manifest['dtype']}")
        print(f"ratio prepare / raw encode_batch: {ours / raw:.2f}x (target >= 0.8)")
        print(f"ratio prepare / raw encode_batch_fast: {ours / fast:.2f}x")

        ds = PackedDataset(out / "0", seq_len=args.seq_len, batch_size=args.batch_size, seed=0)
        n_tokens, t0 = 0, time.perf_counter()
        for batch in ds:
            n_tokens += batch.numel()
            if time.perf_counter() - t0 > (1.0 if args.quick else 3.0):
                break
        rate = n_tokens / (time.perf_counter() - t0)
        print(f"packed loader (seq_len {args.seq_len}, batch {args.batch_size}): {rate:,.0f} tokens/s "
              f"(target >= 100,000)")
        print(json.dumps({"benchmark": "data_pipeline", "mb": round(mb, 2), "tokens": tokens, "tokenizer": tok_name,
                          "raw_mb_s": raw, "raw_fast_mb_s": fast, "prepare_mb_s": ours,
                          "prepare_over_raw": ours / raw, "prepare_over_raw_fast": ours / fast,
                          "loader_tokens_s": rate, "loader_target_tokens_s": 100_000,
                          "loader_seq_len": args.seq_len, "loader_batch_size": args.batch_size}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
