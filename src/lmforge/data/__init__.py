"""Corpus ingestion, sharding and streaming loaders.

    sources.py   read .txt / .jsonl / .csv / .tsv / .parquet (+ .gz / .zst) into documents
    prepare.py   tokenise documents into uint16/uint32 shards + offsets + manifest.json (resumable)
    loader.py    PackedDataset (causal LM blocks), DocumentDataset (segments), StatefulLoader (workers)

The function ``prepare`` lives in :mod:`lmforge.data.prepare` and is not re-exported here, so that
``lmforge.data.prepare`` stays the module.

Example:
    >>> from lmforge.data import PackedDataset
    >>> from lmforge.data.prepare import prepare
    >>> prepare(["corpus.txt"], "my-tokenizer", "data/corpus")  # doctest: +SKIP
    >>> batch = next(iter(PackedDataset("data/corpus", seq_len=128, batch_size=8)))  # (8, 129)  # doctest: +SKIP
"""

import importlib

# Names resolve on first use, so that importing the file readers (``lmforge.data.sources``, which the
# tokenizer trainer uses) does not import the shard writer, which imports the tokenizer.
_LAZY = {
    "DocumentDataset": "loader", "PackedDataset": "loader", "ShardSet": "loader", "StatefulLoader": "loader",
    "choose_dtype": "prepare", "read_manifest": "prepare", "verify": "prepare",
    "DataError": "sources", "iter_documents": "sources", "resolve_inputs": "sources",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"lmforge.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lmforge.data' has no attribute {name!r}")
