"""How many training tokens a data set holds, for ``lmforge plan --data``: a plan's D beside the data it has.

A folder from ``lmforge data prepare`` records its count in ``manifest.json`` (the train split's tokens, what
pre-training reads), and a folder of such folders (one per language, mBART's layout) holds their sum. Raw text
(a file or a folder of ``.txt``/``.jsonl``/... files, as ``data prepare`` reads them) has no token count until it
is tokenised: it is counted with ``--tokenizer``, documents as ``data prepare`` cuts them and without special
tokens, as the shards would hold them. A byte-per-token guess is not made: it varies 2x with the vocabulary.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "train").mkdir()
    >>> _ = (d / "manifest.json").write_text(json.dumps({"format": "lmforge-shards", "complete": True,
    ...     "splits": {"train": {"tokens": 288000, "documents": 12}, "val": {"tokens": 900, "documents": 1}}}))
    >>> data_tokens(d)
    (288000, 'the train split of the prepared folder')
"""

from __future__ import annotations

from pathlib import Path

from lmforge.data.prepare import MANIFEST, read_manifest
from lmforge.data.sources import iter_documents, resolve_inputs
from lmforge.errors import LmforgeError, UserInputError

BATCH_DOCUMENTS = 256  # documents per encode call: the Rust pool's parallelism, a few MB of text at most


def _prepared(folder: Path) -> int:
    try:
        return int(read_manifest(folder)["splits"]["train"]["tokens"])
    except LmforgeError as exc:
        raise UserInputError(f"--data {folder}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UserInputError(f"--data {folder / MANIFEST}: no train token count ({exc})") from None


def data_tokens(path: str | Path, tokenizer: str | Path | None = None) -> tuple[int, str]:
    """Training tokens in ``path`` and where the count comes from; a path that holds no data raises
    UserInputError naming ``--data`` (or ``--tokenizer``)."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"--data {path}: no such file or folder")
    if path.is_dir() and (path / MANIFEST).is_file():
        return _prepared(path), "the train split of the prepared folder"
    if path.is_dir():
        languages = sorted(p for p in path.iterdir() if p.is_dir() and (p / MANIFEST).is_file())
        if languages:
            return sum(_prepared(p) for p in languages), f"the train splits of its {len(languages)} prepared folders"
    try:
        files = resolve_inputs(path)
    except LmforgeError as exc:
        raise UserInputError(f"--data {path}: neither a folder from `lmforge data prepare` nor text ({exc})") from None
    if tokenizer is None:
        raise UserInputError(f"--data {path}: raw text has no token count; give --tokenizer DIR to count it, or "
                             "prepare it first (lmforge data prepare)")
    from lmforge.tokenization import Tokenizer

    try:
        tok = Tokenizer.load(tokenizer)
    except (LmforgeError, OSError, ValueError) as exc:
        raise UserInputError(f"--tokenizer {tokenizer}: not a tokenizer ({exc})") from None
    total, batch = 0, []
    try:
        for doc in iter_documents(files):
            batch.append(doc)
            if len(batch) == BATCH_DOCUMENTS:
                total += sum(len(e.ids) for e in tok.backend.encode_batch_fast(batch, add_special_tokens=False))
                batch = []
    except LmforgeError as exc:
        raise UserInputError(f"--data {exc}") from None
    if batch:
        total += sum(len(e.ids) for e in tok.backend.encode_batch_fast(batch, add_special_tokens=False))
    return total, f"{len(files)} text file(s), counted with the tokenizer {tokenizer}"
