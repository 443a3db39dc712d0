"""Corpus ingestion, sharding and streaming loaders.

    sources.py   read .txt / .jsonl / .csv / .tsv / .parquet (+ .gz / .zst) into documents
    prepare.py   tokenise documents into uint16/uint32 shards + offsets + manifest.json (resumable)
    loader.py    PackedDataset (causal LM blocks), DocumentDataset (segments as DocumentBatch), StatefulLoader (workers)

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

from lmforge.utils.lazy import lazy_exports

# Names resolve on first use, so that importing the file readers (``lmforge.data.sources``, which the
# tokenizer trainer uses) does not import the shard writer, which imports the tokenizer.
_LAZY = {
    "DocumentBatch": "loader", "DocumentDataset": "loader", "PackedDataset": "loader", "ShardSet": "loader", "StatefulLoader": "loader",
    "choose_dtype": "prepare", "read_manifest": "prepare", "verify": "prepare",
    "DataError": "sources", "iter_documents": "sources", "resolve_inputs": "sources",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
