"""Corpus readers: files, globs and folders of text, JSONL, CSV/TSV and Parquet, plain or ``.gz``/``.zst``.

Every reader yields *documents* (strings), in file order:

    format           one document is                                   text comes from
    .txt             a run of lines between empty (blank) lines        the lines, joined by "\\n"
    .jsonl/.ndjson   one JSON object per line                          its ``text_field``
    .csv / .tsv      one row (header line first; csv-module quoting)   the ``text_field`` column
    .parquet         one row                                           the ``text_field`` column

Text is normalised as it is read (:func:`lmforge.utils.text.normalize_text`): a byte-order mark at the start of a file is dropped
and CRLF and lone CR line ends become LF, so a file saved on Windows gives the same documents, and the same
tokens, as its Unix twin. Empty documents are skipped. Any of them may be compressed as ``.gz`` or ``.zst`` (``file.jsonl.zst``).
Bad input fails with a :class:`DataError` naming the file and the place: a non-UTF-8 byte (with its byte
offset; ``errors="replace"`` substitutes U+FFFD instead), a JSON line without the field (with its line
number), a missing column, a missing file or a glob that matches nothing.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("first doc\\nstill first\\n\\nsecond doc\\n")
    >>> _ = (d / "b.jsonl").write_text('{"text": "third"}\\n')
    >>> list(iter_documents(resolve_inputs([d])))
    ['first doc\\nstill first', 'second doc', 'third']
"""

from __future__ import annotations

import codecs
import csv
import glob
import gzip
import io
import json
import re
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from lmforge.utils.text import TextNormalizer
from lmforge.errors import InputFileNotFound, LmforgeError
from lmforge.utils.io import strip_bom, visible

FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv",
           ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".zst")
BLOCK = 1 << 20  # bytes read per call: large enough that Python overhead per block is negligible
# An empty line: a newline, then one or more lines holding nothing but (non-newline) whitespace.
_BOUNDARY = re.compile(r"\n(?:[^\S\n]*\n)+")

# Documents can be long single CSV fields; the csv module's default limit is 128 KiB.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class DataError(LmforgeError, ValueError):
    """Bad or unreadable input; the message names the file and the line or byte offset."""


def split_format(path: str | Path) -> tuple[str | None, str | None]:
    """``(format, compression)`` of a file name, e.g. ``("jsonl", ".zst")``; format None if unsupported."""
    name = Path(path).name.lower()
    compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
    if compression:
        name = name[: -len(compression)]
    return FORMATS.get(Path(name).suffix), compression


def _supported_list() -> str:
    return ", ".join(FORMATS) + " (optionally .gz or .zst)"


def resolve_inputs(inputs: str | Path | Iterable[str | Path]) -> list[Path]:
    """Expand files, globs and folders (recursively, hidden files skipped) into a sorted, de-duplicated list.

    Raises:
        FileNotFoundError: a path does not exist or a glob matches nothing.
        DataError: a file has an unsupported format, a folder holds no supported file, or nothing was given.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    out: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.is_file() and split_format(f)[0]
                           and not any(part.startswith(".") for part in f.relative_to(path).parts))
            if not found:
                raise DataError(f"{path}: folder holds no input files (supported: {_supported_list()})")
            out.extend(found)
        elif path.is_file():
            if split_format(path)[0] is None:
                raise DataError(f"{path}: unsupported input format (supported: {_supported_list()})")
            out.append(path)
        elif glob.has_magic(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(item), recursive=True)
                           if Path(p).is_file() and split_format(p)[0])
            if not found:
                raise InputFileNotFound(f"no input files match {str(item)!r}")
            out.extend(found)
        else:
            raise InputFileNotFound(f"input not found: {item}")
    if not out:
        raise DataError("no input files given")
    return list(dict.fromkeys(out))


class _CountingReader(io.RawIOBase):
    """Counts the on-disk bytes read (compressed ones too) so a progress bar can follow any format."""

    def __init__(self, f: BinaryIO, on_bytes: Callable[[int], None] | None) -> None:
        self._f, self._on_bytes = f, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        if n and self._on_bytes:
            self._on_bytes(n)
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def open_binary(path: str | Path, on_bytes: Callable[[int], None] | None = None) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing ``.gz``/``.zst`` transparently.

    Args:
        path: the file.
        on_bytes: called with the number of *on-disk* bytes consumed by each read (for progress bars).
    """
    raw = io.BufferedReader(_CountingReader(open(path, "rb"), on_bytes), buffer_size=BLOCK)
    compression = split_format(path)[1]
    if compression == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == ".zst":
        import zstandard

        # read_across_frames: files written by the `zstd` tool or by appending hold several frames.
        return zstandard.ZstdDecompressor().stream_reader(raw, read_size=BLOCK, read_across_frames=True,
                                                          closefd=True)
    return raw


def _where(path: Path, offset: int, line: int) -> str:
    where = "byte" if split_format(path)[1] is None else "byte of the decompressed data"
    return f"{path}: invalid UTF-8 at {where} {offset} (line {line}); pass --errors replace (errors='replace') " \
           "to substitute U+FFFD and continue"


def _iter_txt(path: Path, stream: BinaryIO, errors: str) -> Iterator[str]:
    # Decode big blocks incrementally and split on blank lines with one regex per block: several times
    # faster than a Python loop over lines, and the incremental decoder keeps multi-byte characters
    # that straddle two blocks intact.
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    normalize = TextNormalizer()
    fed = newlines = 0
    head: list[str] = []  # pieces of the document in progress (a long document spans many blocks)
    tail = "\n"  # its trailing whitespace, where a boundary may begin; "\n" so leading blank lines split
    while True:
        block = stream.read(BLOCK)
        pending = len(decoder.getstate()[0])
        try:
            text = normalize(decoder.decode(block, final=not block), final=not block)
        except UnicodeDecodeError as exc:
            line = newlines + exc.object[: exc.start].count(b"\n") + 1
            raise DataError(_where(path, fed - pending + exc.start, line)) from None
        fed += len(block)
        newlines += text.count("\n")
        # At the end, a final "\n" lets a last whitespace-only line (no newline of its own) end the document.
        window = tail + text + ("" if block else "\n")
        parts = _BOUNDARY.split(window)
        if len(parts) > 1:
            head.append(parts[0])
            for doc in ["".join(head)] + parts[1:-1]:
                doc = doc.strip("\r\n")
                if doc.strip():
                    yield doc
            # Keep the boundary's last "\n": whitespace-only lines in the next block still join it.
            head, last = [], "\n" + parts[-1]
        else:
            last = window
        stripped = last.rstrip()
        head.append(stripped)
        tail = last[len(stripped):]
        if not block:
            doc = ("".join(head) + tail).strip("\r\n")
            if doc.strip():
                yield doc
            return


def _iter_lines(path: Path, stream: BinaryIO, errors: str) -> Iterator[tuple[int, str]]:
    """``(line number, decoded, normalised line with its "\\n")`` pairs; decoding errors name the byte offset.
    A line holding lone CRs is several lines after normalisation; they share its number."""
    normalize = TextNormalizer()
    carry = b""
    offset = 0  # byte offset of the start of `carry`
    number = 0
    while True:
        block = stream.read(BLOCK)
        lines = (carry + block).split(b"\n")
        carry = lines.pop() if block else b""
        if not block and lines and lines[-1] == b"":
            lines.pop()
        for raw in lines:
            number += 1
            try:
                text = raw.decode("utf-8", errors)
            except UnicodeDecodeError as exc:
                raise DataError(_where(path, offset + exc.start, number)) from None
            offset += len(raw) + 1
            for piece in normalize(text + "\n", final=True).split("\n")[:-1]:
                yield number, piece + "\n"
        if not block:
            return


def _iter_jsonl(path: Path, stream: BinaryIO, errors: str, field: str) -> Iterator[str]:
    for number, line in _iter_lines(path, stream, errors):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {number}: invalid JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}: line {number}: expected a JSON object, got {type(obj).__name__}")
        if field not in obj:
            keys = ", ".join(map(str, obj)) or "none"
            raise DataError(f"{path}: line {number}: no field {field!r} (fields: {keys}); "
                            "choose the text field with --text-field")
        value = obj[field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise DataError(f"{path}: line {number}: field {field!r} is {type(value).__name__}, not a string")
        if value:
            yield value


def _iter_csv(path: Path, stream: BinaryIO, errors: str, field: str, delimiter: str) -> Iterator[str]:
    lines = _iter_lines(path, stream, errors)
    reader = csv.reader((text for _, text in lines), delimiter=delimiter)
    header = next(reader, None)
    if header is None:
        return
    header = strip_bom(header)
    if field not in header:
        raise DataError(f"{path}: no column {field!r} in the header (columns: {', '.join(map(visible, header))}); "
                        "choose the text column with --text-field")
    column = header.index(field)
    for row in reader:
        if not row:
            continue
        if column >= len(row):
            raise DataError(f"{path}: line {reader.line_num}: row has {len(row)} fields, "
                            f"column {field!r} is field {column + 1}")
        if row[column]:
            yield row[column]


def _iter_parquet(path: Path, stream: BinaryIO, field: str, on_bytes) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Parquet needs random access: compressed files are decompressed into memory first, plain ones are
    # opened by path (and their progress is reported per batch below).
    compressed = split_format(path)[1] is not None
    source = io.BytesIO(stream.read()) if compressed else str(path)
    try:
        pf = pq.ParquetFile(source)
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DataError(f"{path}: no column {field!r} (columns: {', '.join(names)}); "
                        "choose the text column with --text-field")
    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: column {field!r} has type {kind}, not string")
    row, total, size, reported = 0, max(pf.metadata.num_rows, 1), path.stat().st_size, 0
    for batch in pf.iter_batches(columns=[field], batch_size=8192):
        try:
            values = batch.column(0).to_pylist()
        except UnicodeDecodeError:
            raise DataError(f"{path}: invalid UTF-8 in column {field!r} near row {row}") from None
        row += len(values)
        if on_bytes and not compressed:
            done = size * row // total
            on_bytes(done - reported)
            reported = done
        yield from (v for v in values if v)


def iter_documents(
    paths: Iterable[str | Path],
    *,
    text_field: str = "text",
    errors: str = "strict",
    on_bytes: Callable[[int], None] | None = None,
    counts: dict[str, int] | None = None,
) -> Iterator[str]:
    """Yield the documents of ``paths`` in order (see the module docstring for what a document is).

    Args:
        paths: files (use :func:`resolve_inputs` to expand globs/folders first).
        text_field: field (JSONL) or column (CSV/TSV/Parquet) holding the text.
        errors: ``"strict"`` raises on non-UTF-8 bytes; ``"replace"`` substitutes U+FFFD.
        on_bytes: progress callback, called with the number of on-disk bytes consumed.
        counts: if given, filled with ``{str(path): number of documents}`` as files are finished.

    Raises:
        DataError: bad bytes, JSON, field or column, naming the file and line/byte offset.
    """
    if errors not in ("strict", "replace"):
        raise DataError(f"errors={errors!r}: use 'strict' or 'replace'")
    for path in map(Path, paths):
        fmt = split_format(path)[0]
        if fmt is None:
            raise DataError(f"{path}: unsupported input format (supported: {_supported_list()})")
        n = 0
        with open_binary(path, on_bytes) as stream:
            try:
                if fmt == "txt":
                    docs = _iter_txt(path, stream, errors)
                elif fmt == "jsonl":
                    docs = _iter_jsonl(path, stream, errors, text_field)
                elif fmt in ("csv", "tsv"):
                    docs = _iter_csv(path, stream, errors, text_field, "," if fmt == "csv" else "\t")
                else:
                    docs = _iter_parquet(path, stream, text_field, on_bytes)
                for doc in docs:
                    n += 1
                    yield doc
            except (OSError, EOFError) as exc:
                # gzip/zstd report truncated or corrupt archives as OSError/EOFError.
                if isinstance(exc, FileNotFoundError):
                    raise
                raise DataError(f"{path}: cannot read ({exc})") from None
            except csv.Error as exc:
                raise DataError(f"{path}: malformed {fmt.upper()} ({exc})") from None
        if counts is not None:
            counts[str(path)] = n
