"""Input text normalised one way everywhere: no byte-order mark, LF line ends.

Corpora (``data prepare``, tokenizer training), task tables (``finetune``) and config files are all read
through :func:`normalize_text` or its incremental form :class:`TextNormalizer`, so a file saved by a Windows
editor gives the same documents, rows and settings as its Unix twin.
"""

from __future__ import annotations


class TextNormalizer:
    """Normalise text that arrives in pieces: drop a leading BOM (U+FEFF), turn CRLF and lone CR into LF.

    A CR at the end of a piece is held back until the next one shows whether an LF follows it, so the result
    does not depend on where the pieces were cut. ``final=True`` marks the last piece.

    Example:
        >>> norm = TextNormalizer()
        >>> norm("\\ufeffa\\r"), norm("\\nb\\rc\\r", final=True)
        ('a', '\\nb\\nc\\n')
    """

    def __init__(self) -> None:
        self._start, self._cr = True, False

    def __call__(self, text: str, final: bool = False) -> str:
        if self._cr:
            text, self._cr = "\r" + text, False
        if self._start and text:
            text, self._start = text.removeprefix("\ufeff"), False
        if text.endswith("\r") and not final:
            text, self._cr = text[:-1], True
        return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_text(text: str) -> str:
    """``text`` without a leading BOM and with LF line ends: what every lmforge reader does to input text.

    Example:
        >>> normalize_text("\\ufefffirst\\r\\nsecond\\rthird")
        'first\\nsecond\\nthird'
    """
    return TextNormalizer()(text, final=True)
