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


def _tmp_prefix(path: Path) -> str:
    # The writer's PID in the name tells a live writer's temporary from a dead one's
    # (lmforge.utils.lock.remove_stale_temporaries removes only the latter).
    return f".{path.name}.{os.getpid()}-"


def _user_mode(path: Path, umask: int | None = None) -> None:
    """Give a file or folder made by mkstemp/mkdtemp (0600/0700) the mode plain open()/mkdir() give."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~(_umask() if umask is None else umask))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary sibling, fsync, rename.

    A full disk or an unwritable folder raises :class:`~lmforge.errors.EnvironmentFault` naming
    ``path``, and the previous file (if any) is left as it was.
    """
    _replace_with(Path(path), lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_with(path: str | Path, writer: Callable[[str], object]) -> Path:
    """Let a library write ``path`` atomically: ``writer`` gets a temporary sibling's name to write (say,
    ``lambda f: faiss.write_index(index, f)``), which is then flushed to disk and renamed over ``path``.

    The library's own errors that carry an errno (safetensors' "os error 28", faiss' "No space left on
    device") become the same :class:`~lmforge.errors.EnvironmentFault` naming ``path`` as Python's, and the
    previous file (if any) is left as it was.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> atomic_write_with(f, lambda name: pathlib.Path(name).write_text("hi")).read_text()
        'hi'
    """
    return _replace_with(Path(path), writer)


def _replace_with(path: Path, writer: Callable[[str], object]) -> Path:
    """The one atomic replace: ``writer`` fills a temporary sibling, which is fsynced and renamed over ``path``."""
    with environment_errors(path, "write"):
        _create_folder(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_tmp_prefix(path), suffix=".tmp")
        os.close(fd)
        try:
            writer(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            _user_mode(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    _fsync_dir(path.parent)
    return path


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
    create_folder(path)
    return path


_CREATED: list[Path] = []  # the folders this process made, in order: the only ones it may ever remove


def create_folder(path: str | Path) -> bool:
    """Create the folder ``path`` (and its parents) if missing; True if this call made it.

    Of several processes creating one folder at once, exactly one is told True (its ``mkdir`` won), so a
    command can tell a folder it made from one it found, however close together the two started
    (:func:`created_since`).
    """
    with environment_errors(path, "create the folder"):
        return _create_folder(Path(path))


def _create_folder(path: Path) -> bool:
    """:func:`create_folder` without the error translation (for a caller that names its own operation)."""
    path = Path(path).absolute()
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    made = False
    for folder in reversed(missing):  # each one made by exactly one process: that one records it
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            made = False
            continue
        _CREATED.append(folder)
        made = True
    if not missing and not path.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    return made


def creation_mark() -> int:
    """A mark for :func:`created_since`: how many folders this process has made so far."""
    return len(_CREATED)


def created_since(path: str | Path, mark: int) -> bool:
    """Whether this process made the folder ``path`` (:func:`create_folder`) after ``mark``."""
    return Path(path).absolute() in _CREATED[mark:]


def foreign_entries(path: str | Path, own_kind: Callable[[Path], bool]) -> list[str]:
    """What a folder about to be replaced holds that is not of the kind being written: ``[]`` when ``path``
    is missing, empty (lmforge's own lock and leftover temporaries aside) or ``own_kind(path)``; else the
    names of its entries, so that the refusal can show what would have been lost."""
    path = Path(path)
    if not path.is_dir():
        return []
    names = sorted(p.name for p in path.iterdir() if not (p.name.startswith(".lmforge.lock") or (
        p.name.startswith(".") and p.name.endswith((".tmp", ".old")))))
    return [] if not names or own_kind(path) else names


def refuse_foreign_folder(path: str | Path, own_kind: Callable[[Path], bool], kind: str,
                          flag: str | None = None) -> None:
    """Refuse to replace the folder ``path`` unless it is missing, empty or ``own_kind(path)``: lmforge never
    deletes a folder of something else (a user's files, a run folder) to write ``kind`` in its place.

    Raises:
        UserInputError: ``path`` holds something else; the message names what it holds.
    """
    names = foreign_entries(path, own_kind)
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise UserInputError(f"{flag + ' ' if flag else ''}{path}: not empty and not {kind} (it holds {shown}); "
                             f"lmforge replaces only {kind} there, so choose a new folder or empty this one")


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
        _create_folder(path.parent)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=_tmp_prefix(path), suffix=".tmp"))
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
        _create_folder(path.parent)
        return Path(tempfile.mkdtemp(dir=path.parent, prefix=_tmp_prefix(path), suffix=".tmp"))


@contextlib.contextmanager
def staged_files(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write the files of the folder ``path`` into; when the block succeeds
    they move into ``path`` (made if missing), each replacing its namesake, and the other files of ``path`` stay.

    For an output folder the user may keep other files in (``lmforge attention --out``): a full disk or a kill
    while the files are drawn leaves ``path`` as it was, never a mix of old and new maps.
    """
    path = Path(path)
    tmp = staging_dir(path)
    try:
        with environment_errors(path, "write"):
            yield tmp
            if not path.exists():
                _finish_dir(tmp, path)
                return
            umask = _umask()
            files = [child for child in sorted(tmp.rglob("*")) if child.is_file()]
            for child in files:
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
            for child in files:  # renames only from here on: no new data to find room for
                target = path / child.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                _user_mode(child, umask)
                os.replace(child, target)
                _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
