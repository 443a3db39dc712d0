"""Prompt templates: a text with input slots [x] and one answer slot [z] (Liu et al. 2021, "Pre-train, Prompt,
and Predict", section 3.1: prompt addition).

    Template("Review: {x} Overall, it was a {z} movie.")
        .fill("Great acting.")        -> "Review: Great acting. Overall, it was a {z} movie."  (z left open)
        .split("Great acting.")       -> Prompt("Review: Great acting. Overall, it was a", " ", " movie.")

Every ``{name}`` other than ``{z}`` is an input slot, filled in order of first appearance (``{x}`` for single
sentences, ``{x}`` and ``{x2}`` for sentence pairs; any names work). The text before ``{z}`` is what a prefix
(causal / seq2seq) LM conditions on; the text after it is kept only by cloze prompts, where [z] becomes
``[MASK]`` tokens read by a bidirectional encoder. Trailing whitespace before ``{z}`` belongs to the answer
(``" great"``), because BPE vocabularies spell a word differently with and without its leading space.

Example:
    >>> t = Template("Premise: {x} Hypothesis: {x2} Answer: {z}")
    >>> t.slots
    ['x', 'x2']
    >>> t.split("It rains.", "It is wet.")
    Prompt(prefix='Premise: It rains. Hypothesis: It is wet. Answer:', space=' ', suffix='')
    >>> t.fill("It rains.", "It is wet.", z="yes")
    'Premise: It rains. Hypothesis: It is wet. Answer: yes'
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import NamedTuple
from lmforge.errors import UserInputError


class Prompt(NamedTuple):
    """A prompt cut at its answer slot: ``prefix + space + answer + suffix`` is the filled text."""

    prefix: str  # what a prefix LM conditions on (demonstrations included, for few-shot prompts)
    space: str  # whitespace written before the answer; it is tokenised with the answer
    suffix: str  # text after the answer (read only by cloze prompts)

    def with_answer(self, answer: str) -> str:
        return self.prefix + self.space + answer + self.suffix


@dataclass(frozen=True)
class Template:
    """A prompt template; see the module docstring. ``{{`` and ``}}`` write literal braces."""

    text: str

    def __post_init__(self) -> None:
        names = [f for _, f, _, _ in string.Formatter().parse(self.text) if f is not None]
        if any(not n.isidentifier() for n in names):
            raise UserInputError(f"template {self.text!r}: slots are plain names like {{x}}, got {names}")
        if names.count("z") > 1:
            raise UserInputError(f"template {self.text!r} has more than one answer slot {{z}}")
        if not [n for n in names if n != "z"]:
            raise UserInputError(f"template {self.text!r} has no input slot such as {{x}}")

    @property
    def slots(self) -> list[str]:
        """Input slot names in order of first appearance."""
        names = [f for _, f, _, _ in string.Formatter().parse(self.text) if f]
        return list(dict.fromkeys(n for n in names if n != "z"))

    @property
    def has_answer(self) -> bool:
        return "z" in [f for _, f, _, _ in string.Formatter().parse(self.text)]

    def _values(self, texts: tuple[str, ...], named: dict[str, str]) -> dict[str, str]:
        values = dict(zip(self.slots, texts))
        values.update(named)
        missing = [s for s in self.slots if s not in values]
        if len(texts) > len(self.slots) or missing:
            raise UserInputError(f"template {self.text!r} has slots {self.slots}; got {len(texts)} texts, "
                                 f"missing {missing}")
        return values

    def fill(self, *texts: str, z: str | None = None, **named: str) -> str:
        """The prompt with inputs (and the answer, if given) written in; an open answer stays ``{z}``."""
        return self.text.format(**self._values(texts, named), z="{z}" if z is None else z)

    def split(self, *texts: str, **named: str) -> Prompt:
        """The filled prompt cut at ``{z}`` (a template without ``{z}`` gets the answer at its end, after a space)."""
        marker = "\x00z\x00"  # cannot come out of a format of ordinary text
        filled = self.text.format(**self._values(texts, named), z=marker)
        if marker not in filled:
            filled += " " + marker
        before, after = filled.split(marker, 1)
        prefix = before.rstrip()
        return Prompt(prefix, before[len(prefix):], after)
