"""One writer per run folder: an exclusive lock held for the whole run.

The lock is an OS file lock (``flock``, through the ``filelock`` library) on ``FOLDER/.lmforge.lock``,
so it disappears with the process that holds it: a run killed with ``kill -9`` never leaves a stale lock
behind. The holder's PID is written beside it, so a second process can say who holds the folder.

Holding the lock also makes the folder's leftover temporary files safe to remove: only a writer that is
no longer running can have left them (see :func:`remove_stale_temporaries`).

Example:
    >>> import tempfile
    >>> from lmforge.errors import RunLocked
    >>> folder = tempfile.mkdtemp()
    >>> with RunFolderLock(folder):
    ...     try:
    ...         RunFolderLock(folder).acquire()
    ...     except RunLocked as exc:
    ...         print("refused:", "in use by lmforge process" in str(exc))
    refused: True
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import filelock

from lmforge.errors import RunLocked
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_write_text

LOCK_FILE = ".lmforge.lock"
OWNER_FILE = ".lmforge.lock.pid"


class RunFolderLock:
    """Exclusive lock on a run folder; a context manager. Creates the folder if it is missing.

    Args:
        folder: the run folder.

    Raises:
        RunLocked: another live process holds the folder (the message names its PID).
        EnvironmentFault: the folder cannot be created or written.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._lock = filelock.FileLock(self.folder / LOCK_FILE, timeout=0)

    def holder(self) -> str:
        """The PID written by the process that holds the lock, or ``'unknown'``."""
        try:
            return (self.folder / OWNER_FILE).read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            return "unknown"

    def acquire(self) -> "RunFolderLock":
        created = not self.folder.exists()
        with environment_errors(self.folder, "lock the run folder"):
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                self._lock.acquire()
            except filelock.Timeout:
                raise RunLocked(f"{self.folder}: in use by lmforge process {self.holder()}; wait for it to "
                                f"finish or stop it, or choose another folder") from None
            try:
                # Atomically: a process refused at this moment must read a whole PID, never an empty file.
                atomic_write_text(self.folder / OWNER_FILE, f"{os.getpid()}\n")
            except BaseException:
                # A full or read-only disk refuses the owner file: give the lock back, and leave no folder
                # behind that this call created (it holds nothing but the lock file).
                self._lock.release()
                if created:
                    shutil.rmtree(self.folder, ignore_errors=True)
                raise
        remove_stale_temporaries(self.folder)
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            (self.folder / OWNER_FILE).unlink(missing_ok=True)
            self._lock.release()

    def __enter__(self) -> "RunFolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def remove_stale_temporaries(folder: str | Path, name: str | None = None) -> list[Path]:
    """Clean up after a writer that died mid-write; call only while holding the folder's lock, or, with
    ``name``, for the one output ``folder/name`` a command without a lock is about to write.

    The atomic-write helpers write ``.NAME.*.tmp`` siblings and rename them into place, and move a
    replaced folder aside to ``.NAME.old`` until its successor is in place. A ``.tmp`` left behind is
    half-written and goes. A ``.NAME.old`` whose ``NAME`` exists is a replaced copy and goes; one
    whose ``NAME`` is missing is the only complete copy (the writer died between the two renames) and
    is renamed back. Returns the paths removed or restored.
    """
    folder = Path(folder)
    touched = []
    stem = glob.escape(name) if name else "*"
    for path in sorted(folder.glob(f".{stem}.*.tmp")):
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        touched.append(path)
    for old in sorted(folder.glob(f".{stem}.old")):
        current = old.with_name(old.name[1:-len(".old")])
        if current.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        else:
            os.replace(old, current)
        touched.append(old)
    return touched
