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
