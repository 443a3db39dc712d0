"""Environment failures as one-line errors: the OSErrors a user can fix become :class:`EnvironmentFault`.

The translation happens where files are written (the atomic-write helpers, run-folder locks), never
with a blanket ``except OSError`` in the CLI, which would also hide lmforge's own bugs. An errno not
listed here (EIO, say) stays a plain ``OSError`` with its traceback: nothing the user can do about it is
known.

Example:
    >>> import errno
    >>> try:
    ...     with environment_errors("/runs/a/model.safetensors", "write"):
    ...         raise OSError(errno.ENOSPC, "No space left on device")
    ... except EnvironmentFault as exc:
    ...     print(exc)
    cannot write /runs/a/model.safetensors: no space left on the device; free some space or choose another folder
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Iterator

from lmforge.errors import EnvironmentFault, LmforgeError

ADVICE = {
    errno.ENOSPC: "no space left on the device; free some space or choose another folder",
    errno.EDQUOT: "the disk quota is used up; free some space or choose another folder",
    errno.EFBIG: "the file grew past this process's file-size limit (ulimit -f); raise it or write less",
    errno.EROFS: "the file system is read-only; choose a writable folder",
    errno.EACCES: "permission denied; choose a folder you can write to, or change its permissions",
    errno.EPERM: "operation not permitted; choose a folder you own",
    errno.EEXIST: "it already exists; remove it or choose another name",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder, not a file; give a file path",
    errno.ENAMETOOLONG: "the name is too long for the file system; choose a shorter path",
}


def as_fault(exc: OSError, path: str | Path, operation: str) -> EnvironmentFault | OSError:
    """The :class:`EnvironmentFault` for ``exc`` when its errno is one a user can fix, else ``exc``."""
    if isinstance(exc, EnvironmentFault) or exc.errno not in ADVICE:
        return exc
    advice = ADVICE[exc.errno]
    path = Path(path)
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        # mkdir says "exists" when the folder or a parent of it is a file: name the file in the way.
        if path.exists() and not path.is_dir() and operation.endswith("folder"):
            advice = "it is a file, not a folder; remove it or choose another path"
        else:
            blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
            if blocker is not None:
                advice = f"{blocker} is a file, not a folder; choose another path"
    return EnvironmentFault(exc.errno, f"cannot {operation} {destination(path)}: {advice}")


def destination(path: str | Path) -> Path:
    """``path`` with each temporary folder of an atomic write (``.NAME.<8 random characters>.tmp``) named as ``NAME``, the
    destination the user chose: a write staged inside another (a model folder inside a checkpoint) fails there.

    Example:
        >>> str(destination("/runs/a/checkpoints/.step-00000004.k2j4_x9a.tmp/model"))
        '/runs/a/checkpoints/step-00000004/model'
    """
    path = Path(path)
    return Path(*(_TEMPORARY.sub(r"\1", part) for part in path.parts))


# tempfile's names: 8 random characters, after the writer's pid where utils.io puts it (``.NAME.PID-<8 random characters>.tmp``)
_TEMPORARY = re.compile(r"^\.(.+)\.(?:\d+-)?[A-Za-z0-9_]{8}\.tmp$")


@contextlib.contextmanager
def environment_errors(path: str | Path, operation: str) -> Iterator[None]:
    """Re-raise a fixable OSError inside the block as an :class:`EnvironmentFault` naming ``path``.

    Writers that are not Python's own file API report the same errno in their own exception types
    (:func:`library_errno`): safetensors' Rust writer, tokenizers, faiss, torch.distributed.checkpoint. They are
    translated too, so a full disk under any library is the same one line.

    Example:
        >>> try:
        ...     with environment_errors("/runs/a/model.safetensors", "write"):
        ...         raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
        ... except EnvironmentFault as exc:
        ...     print(exc)
        cannot write /runs/a/model.safetensors: no space left on the device; free some space or choose another folder
    """
    try:
        yield
    except OSError as exc:
        code = exc.errno if exc.errno is not None else library_errno(exc)
        fault = as_fault(exc if code == exc.errno else OSError(code, str(exc)), path, operation)
        if fault is exc or not isinstance(fault, EnvironmentFault):
            raise
        raise fault from exc
    except LmforgeError:
        raise
    except BaseException as exc:
        # DCP's CheckpointException derives from BaseException; KeyboardInterrupt and SystemExit carry no errno.
        code = library_errno(exc) if isinstance(exc, Exception) or hasattr(exc, "failures") else None
        if code not in ADVICE:
            raise
        raise as_fault(OSError(code, os.strerror(code)), path, operation) from exc


# The errno a library names in its message: Rust's io::Error ("... (os error 28)"), or the C library's words
# (faiss: "write error in F: 10331 != 34320 (No space left on device)").
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_STRERROR = {os.strerror(code): code for code in ADVICE if code not in (errno.EEXIST, errno.EISDIR, errno.ENOTDIR)}


def library_errno(exc: BaseException) -> int | None:
    """The errno a library's exception carries, or None: an OSError's own, the ``(os error N)`` of a Rust
    writer's message (safetensors, tokenizers), the strerror words of a C++ writer's message (faiss), an
    OSError in the exception's cause or context, or one of DCP's per-rank failures.

    Only the errnos a user can fix are read from words (a full disk, a read-only or unwritable folder, a quota,
    a file-size limit); an exception that merely mentions a path or "exists" is not taken for one.

    Example:
        >>> library_errno(RuntimeError("could not open /x/f.faiss for writing: Read-only file system"))
        30
        >>> library_errno(ValueError("shape mismatch")) is None
        True
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno
        message = str(current)
        if (match := _OS_ERROR.search(message)) and int(match.group(1)) in ADVICE:
            return int(match.group(1))
        for words, code in _STRERROR.items():
            if words in message:
                return code
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            todo.extend(pair[0] if isinstance(pair, tuple) else pair for pair in failures.values())
        todo.extend([current.__cause__, current.__context__])
    return None
