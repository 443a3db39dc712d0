"""When a sequence ends: an end-of-sequence token, or a stop string in its generated text.

A sequence ends *with* the token that ends it: the EOS token is the last generated token, and the
token that completes a stop string is kept (as in HF); :func:`cut_at_stop` then cuts the text right
after the first stop string, so the text ends with it.

Stop strings are matched on decoded text, not on token ids: the same string can be spelled by many
token sequences, and one token can complete a stop string and carry on past it ("\\n\\nThe" ends a
"\\n\\n" stop).

Example:
    >>> import torch
    >>> eos = EosCriterion([2, 5])
    >>> eos(torch.tensor([1, 2, 5, 7])).tolist()
    [False, True, True, False]
    >>> cut_at_stop("an answer.\\n\\nQ: next", ["\\n\\n"])
    'an answer.\\n\\n'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class EosCriterion:
    """tokens (N,) -> bool (N,): which tokens end their sequence."""

    def __init__(self, eos_ids: Sequence[int]):
        self.ids = list(eos_ids)
        self._table: torch.Tensor | None = None

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if len(self.ids) == 1:
            return tokens == self.ids[0]  # one comparison: the common case stays one kernel per step
        if self._table is None or self._table.device != tokens.device:
            self._table = torch.tensor(self.ids, device=tokens.device)
        return torch.isin(tokens, self._table)


class StopStrings:
    """Finds stop strings in decoded generated text.

    Args:
        stops: the strings.
        decode: ids (a list) -> text, e.g. ``lambda ids: tokenizer.decode(ids)``.

    Call with the generated ids of some sequences (``M`` lists) to get M bools. Decoding each sequence
    whole is O(length) per step, which the tokenizer's Rust decoder makes cheap for the lengths a
    stop string guards; decoding only a tail would break multi-byte characters and leading spaces.
    """

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]):
        self.stops = list(stops)
        self.decode = decode

    def __bool__(self) -> bool:
        return bool(self.stops)

    def __call__(self, sequences: Sequence[Sequence[int]]) -> list[bool]:
        return [any(s in self.decode(list(ids)) for s in self.stops) for ids in sequences]


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest point where a stop string has appeared (unchanged when none has).

    That point is the earliest *end* of an occurrence: it is where token-by-token generation stopped.
    """
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text
