"""Atomic writes: a killed process leaves either the old file/folder or the new one, never half of one.

Everything lmforge writes goes through these helpers: write into a temporary sibling, flush it to
disk, then ``os.replace`` it over the destination (a single atomic rename on POSIX).

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write_text(d / "a.txt", "hello")
    >>> (d / "a.txt").read_text()
    'hello'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator
from lmforge.errors import InputFileNotFound, UserInputError

from lmforge.utils.faults import environment_errors
from lmforge.utils.text import normalize_text


def _fsync_dir(path: Path) -> None:
    # The rename itself lives in the directory entry; syncing the parent makes it durable.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    # The process umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _user_mode(path: Path) -> None:
    """Give a file or folder made by mkstemp/mkdtemp (0600/0700) the mode plain open()/mkdir() give."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary sibling, fsync, rename.

    A full disk or an unwritable folder raises :class:`~lmforge.errors.EnvironmentFault` naming
    ``path``, and the previous file (if any) is left as it was.
    """
    path = Path(path)
    with environment_errors(path, "write"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            _user_mode(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_mapping_file(path: str | Path, what: str = "config", yaml_always: bool = False) -> object:
    """Parse a .json or .yaml/.yml file (any name with ``yaml_always``); errors name the file (``what`` says what
    kind it should be). The text is normalised first (:func:`~lmforge.utils.text.normalize_text`).

    Raises FileNotFoundError for a missing file and ValueError for one that does not parse.
    """
    import json

    import yaml

    path = Path(path)
    if not path.is_file():
        raise InputFileNotFound(f"{path}: no such {what} file")
    data = path.read_bytes()
    is_yaml = yaml_always or path.suffix in (".yaml", ".yml")
    try:
        text = normalize_text(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 4]
        raise UserInputError(f"{path}: not UTF-8 at byte {exc.start} ({bad!r}); save it as UTF-8") from None
    try:
        return yaml.safe_load(text) if is_yaml else json.loads(text)
    # ValueError: YAML values its constructors reject (a date such as 2024-13-45); RecursionError: nesting
    # deeper than the parsers' recursion.
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        raise UserInputError(f"{path}: not valid {'YAML' if is_yaml else 'JSON'}: {exc}") from exc


@contextlib.contextmanager
def atomic_dir(path: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``path``, on any error it is removed.

    The previous folder (if any) is renamed aside first and deleted only after the new one is in
    place, so an interruption at any moment leaves a complete folder under ``path`` or its ``.old``
    sibling, never a partial one under ``path``.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: already exists (pass overwrite=True to replace it)")
    with environment_errors(path, "create"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with environment_errors(path, "write"):
            yield tmp
            _finish_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _finish_dir(tmp: Path, path: Path) -> None:
    """Make ``tmp``'s files durable, then swap it in for ``path`` (see :func:`atomic_dir`)."""
    _user_mode(tmp)
    for child in tmp.rglob("*"):
        if child.is_file():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
            _user_mode(child)
        elif child.is_dir():
            _user_mode(child)
    old = path.with_name(f".{path.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old)
