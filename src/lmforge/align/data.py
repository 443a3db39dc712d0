"""Alignment data: preference pairs and prompts, read with row-numbered errors before anything is written.

    pairs    JSONL (or TSV/CSV), one row per comparison: {"prompt": ..., "chosen": ..., "rejected": ...}
    prompts  JSONL with a "prompt" field, a TSV/CSV with a prompt column, a shipped NAME:SPLIT, or a .txt file
             (one prompt a line)

A pair with a missing or empty field, or whose chosen and rejected texts are the same, is refused with one
line naming the file, the row and the field; so is a prompt that leaves no room for a response in the
policy's context.

Example:
    >>> import json, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "pairs.jsonl"
    >>> _ = path.write_text(json.dumps({"prompt": "The film", "chosen": " was great", "rejected": " bored me"}))
    >>> read_pairs(path)[0]["chosen"]
    ' was great'
"""

from __future__ import annotations

from pathlib import Path

from lmforge.errors import UserInputError
from lmforge.tasks.data import Table, read_table
from lmforge.utils.io import read_text_file

PAIR_FIELDS = ("prompt", "chosen", "rejected")


def field_text(table: Table, i: int, field: str, allow_empty: bool = False) -> str:
    """Row ``i``'s ``field`` as text; missing, not text (a JSON number, list, object or boolean) or empty
    (unless allowed) is an error naming the file, row and field."""
    value = table.rows[i].get(field)
    if value is None:
        raise UserInputError(f"{table.where(i)}: field {field!r} is missing")
    if not isinstance(value, str):
        kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
            type(value), type(value).__name__)
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise UserInputError(f"{table.where(i)}: field {field!r} is {kind} ({shown}), not text; write it as a "
                             "JSON string")
    if not allow_empty and not value.strip():
        raise UserInputError(f"{table.where(i)}: field {field!r} is empty")
    return value


def read_pairs(source: str | Path, prompt_field: str = "prompt") -> list[dict[str, str]]:
    """Rows ``{"prompt", "chosen", "rejected"}`` of a preference file (the prompt may be empty)."""
    table = read_table(source)
    pairs = []
    for i in range(len(table)):
        prompt = field_text(table, i, prompt_field, allow_empty=True)
        chosen, rejected = field_text(table, i, "chosen"), field_text(table, i, "rejected")
        if chosen == rejected:
            raise UserInputError(f"{table.where(i)}: fields 'chosen' and 'rejected' are the same text; a "
                                 "preference needs two different responses (drop the row)")
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "where": table.where(i)})
    if not pairs:
        raise UserInputError(f"{source}: no pairs")
    return pairs


def read_prompts(source: str | Path, field: str = "prompt") -> list[dict[str, str]]:
    """``[{"prompt", "where"}]`` from a prompt file (see the module docstring); extra fields are kept (an
    ``answer`` for a verifiable reward)."""
    if str(source).endswith(".txt"):
        lines = read_text_file(source, "prompts").splitlines()
        rows = [{"prompt": line, "where": f"{source}: line {n + 1}"} for n, line in enumerate(lines) if line.strip()]
    else:
        table = read_table(source)
        table.require(field)
        rows = [{**table.rows[i], "prompt": field_text(table, i, field, allow_empty=True), "where": table.where(i)}
                for i in range(len(table))]
    if not rows:
        raise UserInputError(f"{source}: no prompts")
    return rows


def check_prompt_length(ids: list[int], where: str, context: int, room: int = 1) -> None:
    """Refuse a prompt that leaves fewer than ``room`` response tokens in the policy's ``context``."""
    if len(ids) + room > context:
        raise UserInputError(f"{where}: the prompt is {len(ids)} tokens, and the policy's context is {context} "
                             f"(max_seq_len), leaving no room for {room} response token(s); shorten the prompt")
