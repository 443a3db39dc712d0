"""Task data kept as Parquet, Arrow, or a Hugging Face ``datasets`` folder, read into task rows.

Where people keep a GLUE-style set today, and how a task reads it (``--train``, ``--eval``, ``--data``)::

    given                   what it is                                           read by
    FILE.parquet            one Parquet file                                     pyarrow.parquet
    FILE.arrow              one Arrow IPC file (stream or file format)           pyarrow.ipc
    DIR                     a ``Dataset.save_to_disk`` folder (state.json)       datasets.load_from_disk
    DIR:SPLIT               a ``DatasetDict.save_to_disk`` folder                datasets.load_from_disk
                            (dataset_dict.json, one subfolder per split)
    DIR:SPLIT               a dataset snapshot's folder of .parquet/.arrow       pyarrow (no ``datasets``)
                            files, e.g. data/train-00000-of-00001.parquet,
                            train/data-00000-of-00001.arrow, sst2/validation/0000.parquet

``datasets`` (the optional extra ``lmforge[datasets]``) is imported only for a ``save_to_disk`` folder; a
snapshot's Arrow files are the IPC *stream* format that ``datasets`` writes, read by pyarrow alone.

A snapshot file's split is the folder it sits in (below a top-level ``data/``; the Hub's ``partial-`` prefix
dropped), else its name without the shard suffix (``train-00000-of-00002`` -> ``train``) or, for a cache name
like ``glue-train.arrow``, the name's last ``-`` part. The shards of a split are read in name order.

Values come back as the columns hold them: a ``ClassLabel`` is its integer (``0``/``1``, as GLUE's TSVs write
it), a nested ``answers`` column a dict; the task code reads labels as text, so ``1`` and ``"1"`` are one class.

Example:
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "data").mkdir()
    >>> rows = pa.table({"sentence": ["good", "bad"], "label": [1, 0]})
    >>> pq.write_table(rows, d / "data" / "train-00000-of-00001.parquet")
    >>> where, rows, columns = read(f"{d}:train")
    >>> rows, columns
    ([{'sentence': 'good', 'label': 1}, {'sentence': 'bad', 'label': 0}], ['sentence', 'label'])
    >>> read(f"{d}:test")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lmforge.tasks.columnar.ColumnarDataError: ...: no split 'test' (expected data/test-*.parquet, ...; the splits here: train)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

SUFFIXES = (".parquet", ".arrow")
DATASET_DICT, DATASET_STATE = "dataset_dict.json", "state.json"
_SHARD = re.compile(r"-\d+(?:-of-\d+)?$")  # train-00000-of-00004, train-3


class ColumnarDataError(LmforgeError, ValueError):
    """A Parquet/Arrow file or dataset folder cannot be read as task rows; the message names it."""


def parse(source: str | Path) -> tuple[Path, str | None] | None:
    """``(path, split)`` when ``source`` is a Parquet/Arrow file, a folder, or ``FOLDER:SPLIT``; else None.

    >>> parse("notes.tsv") is None, parse("rt-sentiment:train") is None
    (True, True)
    """
    text = str(source)
    path = Path(text)
    if path.is_dir() or (path.is_file() and path.suffix.lower() in SUFFIXES):
        return path, None
    head, sep, split = text.rpartition(":")
    if sep and head and split and not re.search(r"[/\\]", split) and Path(head).is_dir():
        return Path(head), split
    return None


def absolute(source: str) -> str:
    """``source`` with its file or folder made absolute (``DIR:SPLIT`` keeps its split), so that a saved run's
    settings still name it from another working directory; anything else unchanged."""
    parsed = parse(source)
    if parsed is None:
        return source
    path, split = parsed
    return str(path.resolve()) + (f":{split}" if split else "")


def read(source: str | Path) -> tuple[str, list[dict[str, Any]], list[str]]:
    """``(where, rows, columns)`` of a Parquet/Arrow file or a dataset folder (see the module docstring).

    ``where`` names the data in messages: the file, or ``FOLDER:SPLIT``.

    Raises:
        ColumnarDataError: an unreadable file, a folder with no such split (naming what was expected), a
            folder that holds a split in several places, ``datasets`` missing for a ``save_to_disk`` folder.
    """
    parsed = parse(source)
    if parsed is None:
        raise ColumnarDataError(f"{source}: not a .parquet/.arrow file or a dataset folder")
    path, split = parsed
    if path.is_file():
        return str(path), *_rows(_read_file(path), path.name)
    where = f"{path}:{split}" if split else str(path)
    if (path / DATASET_DICT).is_file() or (path / DATASET_STATE).is_file():
        return where, *_rows(_load_from_disk(path, split), where)
    return where, *_rows(_read_snapshot(path, split), where)


# ------------------------------------------------------------------------------------------- files
def _read_file(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() == ".parquet":
            return pq.read_table(path)
        with open(path, "rb") as f:  # datasets writes the stream format; the file format opens with ARROW1
            file_format = f.read(6) == b"ARROW1"
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source) if file_format else pa.ipc.open_stream(source)
            return reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        kind = "Parquet" if path.suffix.lower() == ".parquet" else "Arrow IPC"
        raise ColumnarDataError(f"{path}: not a readable {kind} file ({exc})") from None


def _rows(table, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        rows = table.to_pylist()
    except UnicodeDecodeError as exc:
        raise ColumnarDataError(f"{where}: a text column holds invalid UTF-8 ({exc})") from None
    return rows, list(table.column_names)


# ------------------------------------------------------------------------------------------- save_to_disk
def _load_from_disk(path: Path, split: str | None):
    """A ``save_to_disk`` folder's split as a pyarrow Table, through ``datasets`` (which applies its indices)."""
    if (path / DATASET_DICT).is_file():
        try:
            splits = [str(s) for s in json.loads((path / DATASET_DICT).read_text(encoding="utf-8"))["splits"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ColumnarDataError(f"{path / DATASET_DICT}: not a DatasetDict's split list ({exc})") from None
        if split is None:
            raise ColumnarDataError(f"{path}: a DatasetDict saved with save_to_disk (splits: {', '.join(splits)}); "
                                    f"name the split, e.g. {path}:{splits[0] if splits else 'train'}")
        if split not in splits:
            raise ColumnarDataError(f"{path}: no split {split!r} (expected {path / split}/, as {DATASET_DICT} "
                                    f"lists it; the splits here: {', '.join(splits)})")
        path = path / split
    elif split is not None:
        raise ColumnarDataError(f"{path}:{split}: {path} is one Dataset saved with save_to_disk (no {DATASET_DICT}), "
                                f"so it has no split {split!r}; give {path} without ':{split}'")
    try:
        import datasets
    except ImportError:
        raise ColumnarDataError(f"{path}: a folder written by datasets' save_to_disk; reading it needs the "
                                "'datasets' package: pip install 'lmforge[datasets]'") from None
    try:
        dataset = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise ColumnarDataError(f"{path}: not a readable save_to_disk folder ({exc})") from None
    if isinstance(dataset, datasets.DatasetDict):  # DIR/SPLIT itself held a DatasetDict
        raise ColumnarDataError(f"{path}: holds a DatasetDict (splits: {', '.join(dataset)}), not one split")
    return dataset.with_format("arrow")[:]


# ------------------------------------------------------------------------------------------- snapshots
def split_of(relative: Path) -> str:
    """The split a snapshot file belongs to, from its path below the snapshot folder.

    >>> [split_of(Path(p)) for p in ("data/train-00000-of-00001.parquet", "validation/data-00000-of-00001.arrow",
    ...  "sst2/partial-test/0000.parquet", "dev_matched.parquet", "glue-train.arrow")]
    ['train', 'validation', 'test', 'dev_matched', 'train']
    """
    folders = list(relative.parts[:-1])
    if folders and folders[0] == "data":
        folders = folders[1:]
    if folders:
        return folders[-1].removeprefix("partial-")
    stem = _SHARD.sub("", Path(relative.name).stem)
    return stem.rsplit("-", 1)[-1]


def _data_files(folder: Path) -> list[Path]:
    """The snapshot's .parquet/.arrow files, below ``folder``; hidden folders (.cache, .git) and datasets' cache
    files (``cache-*.arrow``, results of ``map``) are not data."""
    files = []
    for file in sorted(folder.rglob("*")):
        relative = file.relative_to(folder)
        if (file.suffix.lower() in SUFFIXES and file.is_file() and not file.name.startswith("cache-")
                and not any(part.startswith(".") for part in relative.parts)):
            files.append(relative)
    return files


def _read_snapshot(folder: Path, split: str | None):
    import pyarrow as pa

    files = _data_files(folder)
    splits = sorted({split_of(f) for f in files})
    if not files:
        raise ColumnarDataError(f"{folder}: is a folder, not a file; give a .tsv, .csv, .jsonl or .conll file, or "
                                f"a dataset folder (with .parquet/.arrow files, or save_to_disk's {DATASET_DICT} "
                                f"or {DATASET_STATE})")
    if split is None:
        raise ColumnarDataError(f"{folder}: a dataset folder with splits {', '.join(splits)}; name the split, "
                                f"e.g. {folder}:{splits[0]}")
    chosen = [f for f in files if split_of(f) == split]
    if not chosen:
        raise ColumnarDataError(f"{folder}: no split {split!r} (expected data/{split}-*.parquet, {split}/*.arrow or "
                                f"{split}.parquet; the splits here: {', '.join(splits)})")
    places = sorted({str(f.parent) for f in chosen})
    if len(places) > 1:
        first = Path(places[0])
        hint = f"; name one, e.g. {folder / first.parent}:{split}" if first.parent != Path(".") else ""
        raise ColumnarDataError(f"{folder}: split {split!r} is in {len(places)} folders "
                                f"({', '.join(str(folder / p) for p in places)}){hint}")
    kinds = {f.suffix.lower() for f in chosen}
    if len(kinds) > 1:
        raise ColumnarDataError(f"{folder}: split {split!r} has both .parquet and .arrow files in "
                                f"{folder / places[0]}; keep one copy")
    tables = [_read_file(folder / f) for f in chosen]
    try:
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    except pa.ArrowInvalid as exc:
        raise ColumnarDataError(f"{folder}:{split}: its files do not share columns ({exc})") from None
