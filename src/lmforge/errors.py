"""The one base class of the errors a user can fix.

An :class:`LmforgeError` is a problem with the user's input, files or environment: a bad config field,
a damaged model folder, a run folder that already holds another run. The command line prints it as one
line (``lmforge VERB: error: ...``) with exit code 2 and no traceback, because its message already names
the file, row or field. Any other exception is a bug in lmforge and is shown with its traceback.

Most subclasses also derive from :class:`ValueError`, so code that caught ``ValueError`` before keeps
working.

Example:
    >>> from lmforge.errors import LmforgeError, UserInputError
    >>> try:
    ...     raise UserInputError("--epochs: must be positive, got -1")
    ... except LmforgeError as exc:
    ...     print(exc)
    --epochs: must be positive, got -1
    >>> issubclass(UserInputError, ValueError)
    True
"""

from __future__ import annotations


class LmforgeError(Exception):
    """A problem the user can fix: printed by the CLI as one line, exit code 2, no traceback."""


class UserInputError(LmforgeError, ValueError):
    """Bad input that no more specific class describes: a flag, an argument or a value in a file."""


class InputFileNotFound(LmforgeError, FileNotFoundError):
    """A file or folder the user named does not exist (still a FileNotFoundError for callers that catch one)."""


class EnvironmentFault(LmforgeError, OSError):
    """The machine refused an operation the user can fix: a full disk, a read-only or unwritable folder,
    a file where a folder should be. Also an :class:`OSError`, with the original ``errno``.

    The message names the path, the operation and what to do; the CLI exits with
    :data:`EXIT_ENVIRONMENT` so scripts can tell it from bad input (:data:`EXIT_USER`).
    """

    def __init__(self, errno_: int, message: str):
        super().__init__(errno_, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class IntegrityError(LmforgeError, ValueError):
    """A file does not hold what its manifest, shard index or header says: damaged or mismatched."""


class RunLocked(LmforgeError):
    """Another live process holds the run folder's lock."""


# Exit codes of the ``lmforge`` command: a script can tell a bug from input it can fix.
EXIT_OK = 0
EXIT_BUG = 1  # an unexpected exception: lmforge printed its traceback
EXIT_USER = 2  # bad input: a flag, a config field, a data row, a damaged or mismatched file
EXIT_ENVIRONMENT = 3  # the machine refused: disk full, read-only folder, a folder held by another run
EXIT_INTERRUPTED = 130  # Ctrl-C
