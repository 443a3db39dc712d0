"""Reading task data: TSV, CSV, JSONL and CoNLL files (optionally ``.gz``), Parquet/Arrow files and Hugging Face
dataset folders (:mod:`lmforge.tasks.columnar`), or a shipped data set by name.

Every row remembers where it came from, so that each complaint names the file and the row::

    data/dev.tsv: row 17 (line 18): label 'neutral' does not occur in the training data (labels: 0, 1)
    data/train.csv: no column 'sentence'; the columns are: id, text, label

Rows are numbered from 1 in file order, skipping the header: a TSV's row ``n`` is on line ``n + 1``; a JSONL
row is one non-empty line; a CoNLL row is one sentence (a block of ``token<TAB>...<TAB>tag`` lines ended by a
blank line; ``-DOCSTART-`` lines are skipped). A shipped data set is named ``NAME:SPLIT``, e.g.
``rt-sentiment:train`` (see :mod:`lmforge.datasets`); a public benchmark's split, e.g. ``glue/cola:dev``, is
read from the user's folder in its official layout (:mod:`lmforge.datasets.benchmarks`).

:class:`ExampleBatches` turns encoded examples into shuffled batches for the Trainer: every batch is a pure
function of ``(seed, epoch, batch index)``, and ``state_dict()`` / ``load_state_dict()`` make a resumed
run draw exactly the batches the uninterrupted one would have.

Example:
    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "a.tsv"
    >>> _ = f.write_text("text\\tlabel\\ngood film\\t1\\nbad film\\t0\\n")
    >>> table = read_table(f)
    >>> table.columns, table.rows[1]["text"], table.where(1)
    (['text', 'label'], 'bad film', 'a.tsv: row 2 (line 3)')
    >>> batches = ExampleBatches(list(range(5)), batch_size=2, seed=0)
    >>> [len(b) for b in batches]
    [2, 2, 1]
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from lmforge import datasets
from lmforge.datasets import benchmarks
from lmforge.tasks import columnar
from lmforge.utils.text import normalize_text
from lmforge.errors import InputFileNotFound, LmforgeError, UserInputError
from lmforge.utils.io import not_utf8, strip_bom, visible

FORMATS = ("tsv", "csv", "jsonl", "conll")


class TaskDataError(LmforgeError, ValueError):
    """Task data cannot be used; the message names the file, and the row when one is at fault."""


@dataclass
class Table:
    """Rows of one data file.

    Attributes:
        path: where the rows came from (a file path or ``NAME:SPLIT``).
        rows: one dict per row (values are strings, numbers or lists, as the format gives them).
        columns: the column names, in file order.
        lines: line number (1-based) of each row in the file; None where lines mean nothing (data sets).
    """

    path: str
    rows: list[dict[str, Any]]
    columns: list[str]
    lines: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def head(self, n: int) -> "Table":
        """The first ``n`` rows, with their line numbers.

        >>> Table("t.tsv", [{"a": 1}, {"a": 2}, {"a": 3}], ["a"], [2, 3, 4]).head(2).lines
        [2, 3]
        """
        return Table(self.path, self.rows[:n], self.columns, self.lines[:n])

    @property
    def name(self) -> str:
        return Path(self.path).name if Path(self.path).exists() else self.path

    def where(self, i: int) -> str:
        """``"file.tsv: row 3 (line 4)"`` for row index ``i`` (0-based)."""
        line = self.lines[i] if i < len(self.lines) else None
        return f"{self.name}: row {i + 1}" + (f" (line {line})" if line is not None else "")

    def require(self, *columns: str | None) -> None:
        """Raise TaskDataError for the first column that the rows do not have."""
        for column in columns:
            if column is not None and column not in self.columns:
                raise TaskDataError(f"{self.name}: no column {column!r}; the columns are: "
                                    f"{', '.join(map(visible, self.columns))}"
                                    " (choose others with --text-column, --text-pair-column, --label-column, "
                                    "--target-column)")


def _open(path: Path) -> io.TextIOBase:
    """The file's text, normalised as corpora are (:func:`lmforge.utils.text.normalize_text`: no BOM, LF line
    ends); bad UTF-8 or a damaged ``.gz`` is a TaskDataError naming the file."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as raw:
            data = raw.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TaskDataError(f"{path.name}: not a readable .gz file ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskDataError(str(not_utf8(path, data))) from None
    return io.StringIO(normalize_text(text), newline="")


def detect_format(path: str | Path) -> str:
    """``tsv``, ``csv``, ``jsonl`` or ``conll`` from the file name (``.gz`` is looked through)."""
    name = Path(path).name.lower().removesuffix(".gz")
    suffix = name.rsplit(".", 1)[-1] if "." in name else ""
    aliases = {"tsv": "tsv", "tab": "tsv", "csv": "csv", "jsonl": "jsonl", "ndjson": "jsonl", "json": "jsonl",
               "conll": "conll", "bio": "conll", "iob": "conll"}
    if suffix not in aliases:
        raise TaskDataError(f"{path}: cannot tell the format from the name; use a .tsv, .csv, .jsonl or .conll "
                            "file (optionally .gz), a .parquet/.arrow file or a dataset folder (DIR:SPLIT)")
    return aliases[suffix]


def _read_delimited(path: Path, delimiter: str) -> Table:
    # The csv module tracks physical lines itself, so quoted fields with newlines keep the numbering right.
    with _open(path) as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise TaskDataError(f"{path.name}: the file is empty (expected a header line and rows)") from None
        except csv.Error as exc:
            raise TaskDataError(f"{path.name}: line 1: {exc}") from exc
        header = [h.strip() for h in strip_bom(header)]
        if len(set(header)) != len(header):
            raise TaskDataError(f"{path.name}: line 1: repeated column names in the header {header}")
        rows, lines = [], []
        start = reader.line_num + 1
        try:
            for values in reader:
                if not values or all(not v.strip() for v in values):
                    start = reader.line_num + 1
                    continue
                if len(values) != len(header):
                    raise TaskDataError(f"{path.name}: row {len(rows) + 1} (line {start}): {len(values)} fields, "
                                        f"but the header has {len(header)} ({', '.join(header)})")
                rows.append(dict(zip(header, values)))
                lines.append(start)
                start = reader.line_num + 1
        except csv.Error as exc:
            raise TaskDataError(f"{path.name}: line {reader.line_num}: {exc}") from exc
    return Table(str(path), rows, header, lines)


def _read_jsonl(path: Path) -> Table:
    rows, lines, columns = [], [], {}
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                where = f"{path.name}: row {len(rows) + 1} (line {number})"
                raise TaskDataError(f"{where}: not valid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise TaskDataError(f"{path.name}: row {len(rows) + 1} (line {number}): expected a JSON object, "
                                    f"got {type(row).__name__}")
            columns.update(dict.fromkeys(row))
            rows.append(row)
            lines.append(number)
    return Table(str(path), rows, list(columns), lines)


def _read_conll(path: Path) -> Table:
    rows, lines = [], []
    tokens, tags, first = [], [], None
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith("-DOCSTART-"):
                if tokens:
                    rows.append({"tokens": tokens, "tags": tags})
                    lines.append(first)
                tokens, tags, first = [], [], None
                continue
            parts = line.split("\t") if "\t" in line else line.split()
            if len(parts) < 2:
                raise TaskDataError(f"{path.name}: row {len(rows) + 1} (line {number}): expected 'token<TAB>tag', "
                                    f"got {line!r}")
            tokens.append(parts[0])
            tags.append(parts[-1])
            first = first or number
    if tokens:
        rows.append({"tokens": tokens, "tags": tags})
        lines.append(first)
    return Table(str(path), rows, ["tokens", "tags"], lines)


def benchmark_table(name: str, split: str, data_dir: str | Path | None = None) -> Table:
    """One split of a public benchmark, read in its official layout from ``data_dir`` (else the suite's
    environment variable); see :mod:`lmforge.datasets.benchmarks`."""
    try:
        file, rows, lines = benchmarks.read(name, split, data_dir)
    except ValueError as exc:
        raise TaskDataError(str(exc)) from exc
    if not rows:
        raise TaskDataError(f"{file}: no rows")
    return Table(str(file), rows, list(dict.fromkeys(k for r in rows for k in r)), lines)


def _known_name(name: str) -> bool:
    return name in benchmarks.LAYOUTS or name in datasets.names()


def _read_dataset(name: str, split: str) -> Table:
    if name in benchmarks.LAYOUTS:  # a public benchmark, from the user's folder
        return benchmark_table(name, split)
    try:
        info = datasets.info(name)
    except ValueError as exc:
        raise TaskDataError(str(exc)) from exc
    rows = datasets.load(name, split)
    columns = list(info.columns) or (list(rows[0]) if rows else [])
    # The shipped loader converts label/score; the task code expects the file's text, as from a TSV.
    return Table(f"{name}:{split}", rows, columns, [None] * len(rows))


def read_table(source: str | Path, format: str | None = None) -> Table:
    """All rows of a data file (or ``NAME:SPLIT`` shipped data set).

    Args:
        source: a ``.tsv``/``.csv``/``.jsonl``/``.conll`` file (``.gz`` allowed), ``rt-sentiment:dev``, or data
            kept as Parquet/Arrow: ``FILE.parquet``, a ``save_to_disk`` folder, ``DIR:SPLIT`` of a DatasetDict or
            a dataset snapshot (:mod:`lmforge.tasks.columnar`).
        format: override the format guessed from the file name.

    Raises:
        TaskDataError: an empty file, a malformed row (named by row and line), an unknown format.
        FileNotFoundError: no such file.
    """
    text = str(source)
    path = Path(text)
    named = not path.exists() and ":" in text and ("/" not in text and "\\" not in text
                                                   or text.partition(":")[0] in benchmarks.LAYOUTS)
    # A shipped or benchmark name wins over a folder of the same name in the working directory.
    stored = None if named and _known_name(text.partition(":")[0]) else columnar.parse(text)
    if stored is not None:
        try:
            where, rows, columns = columnar.read(text)
        except columnar.ColumnarDataError as exc:
            raise TaskDataError(str(exc)) from None
        table = Table(where, rows, columns, [None] * len(rows))
    elif named:
        name, _, split = text.partition(":")
        table = _read_dataset(name, split or "train")
    elif not path.is_file():
        raise InputFileNotFound(f"{path}: no such data file")
    else:
        kind = format or detect_format(path)
        if kind not in FORMATS:
            raise TaskDataError(f"{path}: unknown format {kind!r}; choose one of {', '.join(FORMATS)}")
        readers = {"tsv": lambda p: _read_delimited(p, "\t"), "csv": lambda p: _read_delimited(p, ","),
                   "jsonl": _read_jsonl, "conll": _read_conll}
        table = readers[kind](path)  # _open reads every format: bad UTF-8 is a TaskDataError naming the byte
    if not table.rows:
        raise TaskDataError(f"{table.name}: no rows (the file is empty or holds only a header)")
    return table


def warn(message: str) -> None:
    """Data warnings go to stderr as one line, so that the CLI can show them without a traceback."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- batches
class ExampleBatches:
    """Shuffled batches over in-memory examples, with exact resume; optionally a mixture of several sets.

    Args:
        examples: the examples (anything the collator accepts), or, for a mixture, one list per task.
        batch_size: examples per batch; the last batch of an epoch may be smaller.
        seed: the order of epoch ``e`` comes from ``np.random.default_rng([seed, e])``.
        shuffle: False keeps file order (evaluation).
        rates: for a mixture, each task's share of an epoch (T5's mixing rates; normalised here). An epoch
            holds as many examples as all the sets together; task ``m`` contributes ``round(N * rate_m)`` of
            them, drawn without replacement from its set (cycling through it when the rate asks for more).
        bucket: with ``length``, sort each window of ``bucket`` batches' worth of shuffled examples by length
            before cutting it into batches, then shuffle the batches: similar lengths share a batch, so less
            padding is computed (often 1.5-2x fewer tokens), while the batches stay random. 0 = off.
        length: example -> its length (default: ``len(example["input_ids"])``).
    """

    def __init__(self, examples: Sequence, batch_size: int, seed: int = 0, shuffle: bool = True,
                 rates: Sequence[float] | None = None, bucket: int = 0, length=None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.sources = [list(s) for s in examples] if rates is not None else [list(examples)]
        if rates is not None and len(rates) != len(self.sources):
            raise ValueError("rates needs one number per example set")
        total = sum(rates) if rates is not None else 1.0
        self.rates = [r / total for r in rates] if rates is not None else [1.0]
        if not any(self.sources):
            raise UserInputError("no examples to batch")
        self.batch_size, self.seed, self.shuffle, self.bucket = batch_size, seed, shuffle, bucket
        self.length = length or (lambda e: len(e["input_ids"]))
        self.epoch, self.batch = 0, 0
        self._order: tuple[int, list[tuple[int, int]]] | None = None

    def _epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        """(set, index) pairs of epoch ``epoch``, in batch order."""
        if self._order is not None and self._order[0] == epoch:
            return self._order[1]
        rng = np.random.default_rng([self.seed, epoch])
        n_all = sum(len(s) for s in self.sources)
        items: list[tuple[int, int]] = []
        for k, source in enumerate(self.sources):
            if not source:
                continue
            want = len(source) if len(self.sources) == 1 else max(1, round(n_all * self.rates[k]))
            # Cycle through fresh permutations of this set until it has contributed its share.
            while want > 0:
                perm = rng.permutation(len(source)) if self.shuffle else np.arange(len(source))
                items.extend((k, int(i)) for i in perm[:want])
                want -= len(source)
        if self.shuffle and len(self.sources) > 1:
            items = [items[i] for i in rng.permutation(len(items))]
        if self.shuffle and self.bucket:
            window, bs = self.bucket * self.batch_size, self.batch_size
            batches = []
            for w in range(0, len(items), window):
                chunk = sorted(items[w:w + window], key=lambda ki: self.length(self.sources[ki[0]][ki[1]]))
                batches.extend(chunk[b:b + bs] for b in range(0, len(chunk), bs))
            # Only the last batch may be short; keep it last so that every other batch is full.
            full = [b for b in batches if len(b) == bs]
            items = [x for j in rng.permutation(len(full)) for x in full[j]] + [x for b in batches if len(b) < bs
                                                                              for x in b]
        self._order = (epoch, items)
        return items

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-len(self._epoch_order(self.epoch)) // self.batch_size)

    def __iter__(self) -> Iterator[list]:
        """The remaining batches of the current epoch; the next ``iter`` starts the following epoch."""
        while True:
            order = self._epoch_order(self.epoch)
            start = self.batch * self.batch_size
            if start >= len(order):
                self.epoch, self.batch = self.epoch + 1, 0
                return
            self.batch += 1
            yield [self.sources[k][i] for k, i in order[start:start + self.batch_size]]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("seed"), state.get("batch_size")) != (self.seed, self.batch_size):
            raise UserInputError(f"the checkpoint's data order used seed {state.get('seed')} and batch size "
                                 f"{state.get('batch_size')}, not {self.seed} and {self.batch_size}")
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
