"""Corpus ingestion, sharding and streaming loaders.

    sources.py   read .txt / .jsonl / .csv / .tsv / .parquet (+ .gz / .zst) into documents
    prepare.py   tokenise documents into uint16/uint32 shards + offsets + manifest.json (resumable)
    loader.py    PackedDataset (causal LM blocks), DocumentDataset (segments), StatefulLoader (workers)

The function ``prepare`` lives in :mod:`lmforge.data.prepare` and is not re-exported here, so that
``lmforge.data.prepare`` stays the module.

Example:
    >>> import pathlib, tempfile
    >>> from lmforge.data import PackedDataset
    >>> from lmforge.data.prepare import prepare
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
    >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
    >>> _ = prepare([d / "corpus.txt"], tok, d / "data", progress=False)
    >>> next(iter(PackedDataset(d / "data", seq_len=16, batch_size=8))).shape  # (B, seq_len + 1)
    torch.Size([8, 17])
"""

from lmforge.data.loader import DocumentDataset, PackedDataset, ShardSet, StatefulLoader
from lmforge.data.prepare import choose_dtype, read_manifest, verify
from lmforge.data.sources import DataError, iter_documents, resolve_inputs

__all__ = [
    "DataError", "DocumentDataset", "PackedDataset", "ShardSet", "StatefulLoader", "choose_dtype",
    "iter_documents", "read_manifest", "resolve_inputs", "verify",
]
