"""CNN/DailyMail and XSum, the summarization sets of BART's and PEGASUS's tables, read in their release layouts.

    set      files (under the folder)                                       rows
    cnn_dm   train.csv, validation.csv, test.csv: id, article, highlights   {id, article, highlights}
    xsum     XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json + bbc-summary-data/   {id, document, summary}

CNN/DailyMail is read as the CSV export of the non-anonymised version (See et al. 2017) that Hugging Face's
``cnn_dailymail`` 3.0.0 and its common mirrors ship (the ``cnn_dailymail/`` folder): one article per row, its
highlights one per line. XSum is the folder the official scripts (Narayan et al. 2018, EdinburghNLP/XSum) write:
one ``ID.summary`` file per BBC article, sections headed ``[SN]URL[SN]``, ``[SN]TITLE[SN]``,
``[SN]FIRST-SENTENCE[SN]`` (the summary) and ``[SN]RESTBODY[SN]`` (the document), and the split file mapping
``train``/``validation``/``test`` to IDs. The social-media share lines the BBC pages carry ("Share this with",
"Email" ...) are dropped from the document, as Hugging Face's ``xsum`` loader drops them; IDs whose file the
download did not get are skipped, with one warning that counts them.

Example:
    >>> text = ("[SN]URL[SN]\\nhttp://bbc.co.uk/1\\n[SN]TITLE[SN]\\nT\\n[SN]FIRST-SENTENCE[SN]\\nS.\\n"
    ...         "[SN]RESTBODY[SN]\\nA.\\nB.\\n")
    >>> xsum_sections(text)["FIRST-SENTENCE"], xsum_sections(text)["RESTBODY"]
    ('S.', 'A.\\nB.')
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path
from typing import Any

from lmforge.data.sources import DataError
from lmforge.errors import InputFileNotFound

CNN_DM_COLUMNS = ("id", "article", "highlights")
XSUM_SPLITS = "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json"
XSUM_FOLDER = "bbc-summary-data"
_SHARE_LINES = {"Share this with", "Email", "Facebook", "Messenger", "Twitter", "Pinterest", "WhatsApp", "Linkedin",
                "LinkedIn", "Copy this link", "These are external links and will open in a new window"}
_SECTION = re.compile(r"\[SN\]([A-Z-]+)\[SN\]")


def read_cnn_dm(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """One CNN/DailyMail CSV split (a row per article)."""
    csv.field_size_limit(2**31 - 1)  # an article is one field, longer than the csv module's 128 KiB default
    rows, lines = [], []
    with open(file, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CNN_DM_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{file}: no column {', '.join(missing)} (expected the header id, article, highlights)")
        for row in reader:
            rows.append({c: row[c] for c in CNN_DM_COLUMNS})
            lines.append(reader.line_num)
    return rows, lines


def xsum_sections(text: str) -> dict[str, str]:
    """A ``.summary`` file's sections by name (``URL``, ``TITLE``, ``FIRST-SENTENCE``, ``RESTBODY``)."""
    parts = _SECTION.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}


def read_xsum(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """One XSum split: the IDs the split file lists, each read from ``bbc-summary-data/ID.summary``."""
    try:
        ids = json.loads(file.read_text(encoding="utf-8"))[split]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{file}: expected a JSON object with the split {split!r} (a list of IDs): {exc}") from exc
    folder = file.parent / XSUM_FOLDER
    if not folder.is_dir():
        raise InputFileNotFound(f"{folder}: not found; XSum's articles are read from its ID.summary files")
    rows, absent = [], []
    for name in ids:
        path = folder / f"{name}.summary"
        if not path.is_file():
            absent.append(path)
            continue
        sections = xsum_sections(path.read_text(encoding="utf-8", errors="replace"))
        if "FIRST-SENTENCE" not in sections or "RESTBODY" not in sections:
            raise DataError(f"{path}: no [SN]FIRST-SENTENCE[SN] or [SN]RESTBODY[SN] section")
        body = [line for line in sections["RESTBODY"].splitlines() if line.strip() and line.strip() not in _SHARE_LINES]
        rows.append({"id": str(name), "document": "\n".join(body), "summary": sections["FIRST-SENTENCE"]})
    if absent:
        warnings.warn(f"{folder}: {len(absent)} of the {len(ids)} {split} articles are missing (first: "
                      f"{absent[0].name}); scoring the {len(rows)} present", stacklevel=2)
    return rows, [None] * len(rows)
