"""One writer per run folder: an exclusive lock held for the whole run.

The lock is an OS file lock (``flock``, through the ``filelock`` library) on ``FOLDER/.lmforge.lock``,
so it disappears with the process that holds it: a run killed with ``kill -9`` never leaves a stale lock
behind. The holder's PID is written beside it, so a second process can say who holds the folder.

The protocol, so that two commands started together on one folder never harm each other:

* Only the holder writes into the folder or cleans it. Holding the lock makes the folder's leftover
  temporary files safe to remove (only a writer that is no longer running can have left them, see
  :func:`remove_stale_temporaries`); the holder's own PID file is written after the lock is taken, so no
  one else can be writing it.
* A command removes a folder only if it created it (its ``mkdir`` won, :func:`~lmforge.utils.io.create_folder`)
  and only while it holds the folder's lock (:func:`removed_on_failure`): a folder another process holds,
  or that it merely found, is never removed.
* Every acquisition waits :data:`GRACE_S` for a holder that lets go at once (a probe,
  :func:`refuse_if_held`), so a probe never turns a run away; a holder that stays is refused after that.

Example:
    >>> import tempfile
    >>> from lmforge.errors import RunLocked
    >>> folder = tempfile.mkdtemp()
    >>> with RunFolderLock(folder):
    ...     try:
    ...         RunFolderLock(folder, wait=0).acquire()
    ...     except RunLocked as exc:
    ...         print("refused:", "in use by lmforge process" in str(exc))
    refused: True
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

import filelock

from lmforge.errors import RunLocked
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_write_text, create_folder, created_since, creation_mark

LOCK_FILE = ".lmforge.lock"
OWNER_FILE = ".lmforge.lock.pid"
GRACE_S = 1.0  # how long an acquisition waits for a holder that lets go at once (a probe, a finishing run)
OWNER_WAIT_S = 3.0  # how long a refused process waits for a new holder to write its PID
_HELD: set[Path] = set()  # the folders this process holds: a process never refuses itself
# The atomic-write helpers name a temporary ``.NAME.PID-<random>.tmp`` (older ones ``.NAME.<random>.tmp``).
_TMP_PID = re.compile(r"\.(\d+)-[^.]*\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class RunFolderLock:
    """Exclusive lock on a run folder; a context manager. Creates the folder if it is missing.

    Args:
        folder: the run folder.
        wait: seconds to wait for a holder that lets go (default: :data:`GRACE_S`, read at each call).

    Raises:
        RunLocked: another live process holds the folder (the message names its PID).
        EnvironmentFault: the folder cannot be created or written.
    """

    def __init__(self, folder: str | Path, wait: float | None = None):
        self.folder = Path(folder)
        self.wait = GRACE_S if wait is None else wait
        self._lock = filelock.FileLock(self.folder / LOCK_FILE, timeout=self.wait)

    def holder(self) -> str:
        """The PID of the process that holds the lock, or ``'unknown'``.

        A holder writes its PID just after it takes the lock, and a holder killed with ``kill -9`` leaves its
        PID behind: a PID that is missing or no longer running is waited for (:data:`OWNER_WAIT_S`), not named.
        """
        deadline = time.monotonic() + OWNER_WAIT_S
        while True:
            try:
                text = (self.folder / OWNER_FILE).read_text(encoding="utf-8").strip()
            except OSError:
                text = ""
            if text.isdigit() and _alive(int(text)):
                return text
            if time.monotonic() > deadline:
                return "unknown"
            time.sleep(0.02)

    def _refused(self) -> RunLocked:
        return RunLocked(f"{self.folder}: in use by lmforge process {self.holder()}; wait for it to finish or "
                         f"stop it, or choose another folder")

    def _take(self) -> None:
        """Take the OS lock, retrying when the folder vanished under us (its creator removed it, see
        :func:`removed_on_failure`): a lock on a removed folder's file would hold nothing."""
        for _ in range(5):
            create_folder(self.folder)
            try:
                self._lock.acquire()
            except filelock.Timeout:
                raise self._refused() from None
            except FileNotFoundError:
                continue  # the folder went between the mkdir and the open
            if (self.folder / LOCK_FILE).is_file():
                return
            self._lock.release()
        raise RunLocked(f"{self.folder}: removed and created again by other processes while this one locked it; "
                        "run one command per folder at a time")

    def acquire(self) -> "RunFolderLock":
        with environment_errors(self.folder, "lock the run folder"):
            mark = creation_mark()
            self._take()
            try:
                # Atomically: a process refused at this moment must read a whole PID, never an empty file.
                atomic_write_text(self.folder / OWNER_FILE, f"{os.getpid()}\n")
            except BaseException:
                # A full or read-only disk refuses the owner file: give the lock back, and leave no folder
                # behind that this call created (it holds nothing but the lock file).
                self._lock.release()
                if created_since(self.folder, mark):
                    shutil.rmtree(self.folder, ignore_errors=True)
                raise
        _HELD.add(self.folder.absolute())
        remove_stale_temporaries(self.folder)
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            (self.folder / OWNER_FILE).unlink(missing_ok=True)
            self._lock.release()
            _HELD.discard(self.folder.absolute())

    def __enter__(self) -> "RunFolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def refuse_if_held(folder: str | Path | None) -> None:
    """Raise :class:`~lmforge.errors.RunLocked` now if another process holds ``folder``, before a command
    spends minutes building what it would then be refused to write. Changes nothing: a folder that was never
    locked is not touched, and the lock is held for an instant only (acquisitions wait :data:`GRACE_S`
    for that). Under torchrun only rank 0 asks, and a process never refuses itself (it may hold the folder
    already, as finetune does before writing a PEFT run's base).

    Raises:
        RunLocked: the folder is held; the message names the holder's PID.
    """
    if not folder or os.environ.get("RANK", "0") != "0" or not (Path(folder) / LOCK_FILE).is_file() \
            or Path(folder).absolute() in _HELD:
        # Under torchrun only rank 0 locks: another rank's probe could find rank 0 holding it already; and a
        # process holding the folder (a command that locked it before it checks) is its rightful writer.
        return
    folder = Path(folder)
    probe = filelock.FileLock(folder / LOCK_FILE, timeout=GRACE_S)
    try:
        probe.acquire()
    except filelock.Timeout:
        raise RunFolderLock(folder)._refused() from None
    except OSError:
        return  # an unreadable folder: the command's own write names the problem
    probe.release()


@contextlib.contextmanager
def removed_on_failure(path: str | Path, keep: Callable[[Path], bool] = lambda path: False) -> Iterator[Path]:
    """Remove the folder ``path`` when the block fails, if the block created it and ``keep(path)`` is false.

    A command that fails before its first step leaves no folder holding only its settings behind. A folder
    that existed before is never removed, nor one that another process found and locked in the meantime (two
    commands started together on one new folder: only one made it, and the other may be its rightful
    writer); ``keep`` spares one worth keeping (say, one with checkpoints to resume from).
    """
    path = Path(path)
    mark = creation_mark()
    try:
        yield path
    except BaseException:
        if created_since(path, mark) and path.is_dir() and not keep(path):
            _remove_unheld(path)
        raise


def _remove_unheld(path: Path) -> None:
    """Remove the folder ``path`` unless another process holds its lock; removed while holding it, so no
    other process can be writing into it meanwhile."""
    lock = filelock.FileLock(path / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except OSError:  # held by another process (filelock.Timeout is an OSError), or unwritable: it stays
        return
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        lock.release()


def remove_stale_temporaries(folder: str | Path, name: str | None = None) -> list[Path]:
    """Clean up after a writer that died mid-write; call only while holding the folder's lock, or, with
    ``name``, for the one output ``folder/name`` a command without a lock is about to write.

    The atomic-write helpers write ``.NAME.PID-<random>.tmp`` siblings and rename them into place, and move a
    replaced folder aside to ``.NAME.old`` until its successor is in place. A ``.tmp`` left behind is
    half-written and goes, unless the process named in it is still running (another command writing the same
    output right now). A ``.NAME.old`` whose ``NAME`` exists is a replaced copy and goes; one whose ``NAME`` is
    missing is the only complete copy (the writer died between the two renames) and is renamed back. Returns
    the paths removed or restored.
    """
    folder = Path(folder)
    touched = []
    stem = glob.escape(name) if name else "*"
    for path in sorted(folder.glob(f".{stem}.*.tmp")):
        writer = _TMP_PID.search(path.name)
        if writer and int(writer[1]) != os.getpid() and _alive(int(writer[1])):
            continue  # a live writer's file in progress
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        touched.append(path)
    for old in sorted(folder.glob(f".{stem}.old")):
        current = old.with_name(old.name[1:-len(".old")])
        if current.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        else:
            os.replace(old, current)
        touched.append(old)
    return touched
