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
import re
from pathlib import Path
from typing import Iterator

from lmforge.errors import EnvironmentFault

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


_TEMPORARY = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}\.tmp$")  # tempfile's names: 8 random characters


@contextlib.contextmanager
def environment_errors(path: str | Path, operation: str) -> Iterator[None]:
    """Re-raise a fixable OSError inside the block as an :class:`EnvironmentFault` naming ``path``."""
    try:
        yield
    except OSError as exc:
        fault = as_fault(exc, path, operation)
        if fault is exc:
            raise
        raise fault from exc
