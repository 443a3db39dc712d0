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
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

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


def _user_mode(path: Path, umask: int | None = None) -> None:
    """Give a file or folder made by mkstemp/mkdtemp (0600/0700) the mode plain open()/mkdir() give."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~(_umask() if umask is None else umask))


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


def atomic_save_npy(path: str | Path, array) -> None:
    """Write a NumPy array as a ``.npy`` file atomically (``np.save`` in place would truncate the old file first)."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def make_folder(path: str | Path) -> Path:
    """Create the folder ``path`` (and its parents) if missing and return it.

    A file in the way, a read-only disk or a full one raises :class:`~lmforge.errors.EnvironmentFault`
    naming ``path``.

    Example:
        >>> import tempfile, pathlib
        >>> taken = pathlib.Path(tempfile.mkdtemp()) / "taken"
        >>> _ = taken.write_text("a file")
        >>> try:
        ...     make_folder(taken)
        ... except OSError as exc:
        ...     print(str(exc).replace(str(taken), "TAKEN"))
        cannot create the folder TAKEN: it is a file, not a folder; remove it or choose another path
    """
    path = Path(path)
    with environment_errors(path, "create the folder"):
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def removed_on_failure(path: str | Path, keep: Callable[[Path], bool] = lambda path: False) -> Iterator[Path]:
    """Remove the folder ``path`` when the block fails, if the block created it and ``keep(path)`` is false.

    A command that fails before its first step leaves no folder holding only its settings behind; a folder
    that existed before is never removed, and ``keep`` spares one worth keeping (say, one with checkpoints
    to resume from).
    """
    path = Path(path)
    existed = path.exists()
    try:
        yield path
    except BaseException:
        if not existed and path.is_dir() and not keep(path):
            shutil.rmtree(path, ignore_errors=True)
        raise


def visible(name: str) -> str:
    """``name`` as it reads, or its ``repr`` when it holds invisible characters (a BOM, a tab, trailing spaces).

    Example:
        >>> print(visible("label"), visible("\\ufefftext"), visible("text "))
        label '\\ufefftext' 'text '
    """
    return name if name.isprintable() and name == name.strip() and name else repr(name)


def strip_bom(header: list[str]) -> list[str]:
    """A CSV/TSV header without the byte-order mark an editor may have put before its first name."""
    return [header[0].removeprefix("\ufeff"), *header[1:]] if header else header


def read_text_file(path: str | Path, what: str = "") -> str:
    """The text of a UTF-8 file, normalised as every input is (no BOM, LF line ends); a one-line error (prefixed
    by ``what``, e.g. a flag) names the file when it is missing, is a folder or is not UTF-8 (with the byte
    offset of the first bad byte).

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "p.txt"
        >>> _ = f.write_bytes(b"caf\\xe9")
        >>> try:
        ...     read_text_file(f, "--prompt-file")
        ... except UserInputError as exc:
        ...     print(str(exc).replace(str(f), "p.txt"))
        --prompt-file p.txt: not UTF-8 at byte 3 (b'\\xe9'); save it as UTF-8
    """
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    if path.is_dir():
        raise UserInputError(f"{name}: is a folder, not a file; give a file")
    if not path.is_file():
        raise InputFileNotFound(f"{name}: no such file")
    with environment_errors(path, "read"):
        data = path.read_bytes()
    try:
        return normalize_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise not_utf8(name, data) from None


def not_utf8(name: str | Path, data: bytes) -> UserInputError:
    """The error for a file ``name`` whose bytes ``data`` are not UTF-8: it names the first bad byte's offset."""
    try:
        data.decode("utf-8")
        start = len(data)
    except UnicodeDecodeError as exc:
        start = exc.start
    return UserInputError(f"{name}: not UTF-8 at byte {start} ({data[start:start + 4]!r}); save it as UTF-8")


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
    text = read_text_file(path)
    is_yaml = yaml_always or path.suffix in (".yaml", ".yml")
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
    if path.exists() and not path.is_dir():
        with environment_errors(path, "write the folder"):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
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


def staging_dir(path: str | Path) -> Path:
    """A new empty temporary sibling of the folder ``path`` to build its replacement in, for a build that does
    not fit in one ``with`` block; :func:`replace_dir` swaps it in, and removing it abandons the build."""
    path = Path(path)
    with environment_errors(path, "create"):
        path.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))


def replace_dir(tmp: str | Path, path: str | Path) -> None:
    """Swap the finished staging folder ``tmp`` (from :func:`staging_dir`) in for ``path``, as :func:`atomic_dir`
    does."""
    with environment_errors(path, "write"):
        _finish_dir(Path(tmp), Path(path))


def _finish_dir(tmp: Path, path: Path) -> None:
    """Make ``tmp``'s files durable, then swap it in for ``path`` (see :func:`atomic_dir`)."""
    umask = _umask()  # read once: reading it means setting it, twice per call
    _user_mode(tmp, umask)
    for child in tmp.rglob("*"):
        if child.is_file():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
        _user_mode(child, umask)
    old = path.with_name(f".{path.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old)
