"""Command-line plumbing shared by every verb: ``KEY=VALUE`` options and flags generated from a dataclass.

Example:
    >>> split_key_value("r=16", "--peft-option", "r=16")
    ('r', '16')
    >>> key_values(["n_layers=2", "bias=false", "name="], "--override")
    {'n_layers': 2, 'bias': False, 'name': None}
    >>> key_values(["n_layers"], "--override")
    Traceback (most recent call last):
    ...
    lmforge.errors.UserInputError: --override 'n_layers': expected KEY=VALUE, e.g. --override n_layers=2
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, Iterable, Mapping, Sequence

import yaml

from lmforge.errors import UserInputError


def split_key_value(text: str, flag: str, example: str = "n_layers=2") -> tuple[str, str]:
    """``"KEY=VALUE"`` -> ``(KEY, VALUE)``, both stripped; a missing ``=`` or key names ``flag`` and an example."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserInputError(f"{flag} {text!r}: expected KEY=VALUE, e.g. {flag} {example}")
    return key.strip(), value.strip()


def key_values(pairs: Iterable[str] | None, flag: str, example: str = "n_layers=2") -> dict[str, Any]:
    """``["n_layers=2", "bias=false"]`` -> ``{"n_layers": 2, "bias": False}``: values read as YAML scalars, an
    empty value is None."""
    out = {}
    for pair in pairs or []:
        key, value = split_key_value(pair, flag, example)
        try:
            out[key] = yaml.safe_load(value) if value else None
        except yaml.YAMLError as exc:
            raise UserInputError(f"{flag} {pair!r}: cannot read the value ({exc})") from exc
    return out


def add_dataclass_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                        options: Sequence[tuple[str, str]], defaults: Mapping[str, Any] | None = None,
                        choices: Mapping[str, Sequence[str]] | None = None) -> None:
    """One flag per ``(field, help)`` of dataclass ``cls``: its type from the annotation, its default shown.

    A bool field off by default becomes ``--field``; one on by default becomes ``--no-field``, and its help
    says what ``--no-field`` does (the caller writes it so). ``defaults`` overrides the dataclass's defaults as
    shown in the help; the parser's own default is left alone (verbs parse with ``argument_default=SUPPRESS``,
    so only the flags given reach the config).
    """
    hints = typing.get_type_hints(cls)
    instance = cls()
    shown = {**{f: getattr(instance, f) for f in hints if hasattr(instance, f)}, **(defaults or {})}
    for key, text in options:
        flag = "--" + key.replace("_", "-")
        default = shown.get(key)
        kind = typing.get_args(hints[key])[0] if typing.get_args(hints[key]) else hints[key]
        if kind is bool and default:
            parser.add_argument(f"--no-{key.replace('_', '-')}", dest=key, action="store_false", help=text)
        elif kind is bool:
            parser.add_argument(flag, dest=key, action="store_true", help=text)
        else:
            allowed = (choices or {}).get(key)
            parser.add_argument(flag, dest=key, type=kind, choices=allowed,
                                help=text + ("" if default is None else f" (default: {default})"),
                                metavar=None if allowed else key.upper().replace("_", "-"))
