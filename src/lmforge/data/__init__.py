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

from lmforge.data.loader import DocumentDataset, PackedDataset, ShardSet, StatefulLoader
from lmforge.data.prepare import choose_dtype, read_manifest, verify
from lmforge.data.sources import DataError, iter_documents, resolve_inputs

__all__ = [
    "DataError", "DocumentDataset", "PackedDataset", "ShardSet", "StatefulLoader", "choose_dtype",
    "iter_documents", "read_manifest", "resolve_inputs", "verify",
]
