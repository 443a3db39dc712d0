"""The prompt forms of ``POST /v1/completions``, as the OpenAI API takes them, and the legacy ``logprobs``
object of its answers (what evaluation clients such as lm-evaluation-harness read).

    "the cat"                   one text                 encoded as ``lmforge generate`` encodes a prompt
    ["the cat", "a dog"]        several texts            one choice (or n) per prompt, in order
    [464, 3797]                 one prompt of token ids  used as given (no BOS added)
    [[464, 3797], [32, 3290]]   several prompts of ids

Anything else (an empty list, a list mixing texts and ids, a float or a bool where an id should be, an id
outside the model's vocabulary) is a :class:`PromptError` naming the place (``prompt``, ``prompt[1]``,
``prompt[0][3]``), which the app answers with a 400.

The ``logprobs`` object has one entry per token (the prompt's first, with ``echo``, then the generated ones):
``tokens`` (each id decoded alone), ``token_logprobs`` (None for the prompt's first token, which nothing
predicts), ``top_logprobs`` (per position the ``logprobs`` most likely tokens and the token itself, so up to
``logprobs + 1`` entries as in OpenAI's API, keyed by text: ids of one text keep the highest; None for the
first prompt token) and ``text_offset`` (where each
token's text starts, counting the decoded tokens' lengths, as vLLM does).

Example:
    >>> parse_prompt([[5, 6], [7]], vocab_size=10)
    [[5, 6], [7]]
    >>> parse_prompt([5, "x"], vocab_size=10)
    Traceback (most recent call last):
    ...
    lmforge.serve.prompts.PromptError: prompt: a list that mixes texts and other values; give a text, a list of texts, a list of token ids or a list of lists of token ids
    >>> legacy_logprobs(["a", "bc"], [None, -1.5], [None, {"x": -0.5}], offset=0)["text_offset"]
    [0, 1]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FORMS = "give a text, a list of texts, a list of token ids or a list of lists of token ids"


class PromptError(ValueError):
    """A prompt in a form the API does not take; ``param`` names where (``prompt``, ``prompt[2]``, ...)."""

    def __init__(self, message: str, param: str = "prompt"):
        super().__init__(f"{param}: {message}")
        self.param = param


def _is_id(value: Any) -> bool:
    # JSON true is no token id; 5.0 is one (JSON Schema's integers include numbers without a fraction)
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def _ids(values: list, vocab_size: int, where: str) -> list[int]:
    if not values:
        raise PromptError(f"an empty list of token ids; {FORMS}", where)
    for i, v in enumerate(values):
        if not _is_id(v):
            raise PromptError(f"{v!r} is not a token id (an integer); {FORMS}", f"{where}[{i}]")
        if not 0 <= v < vocab_size:
            raise PromptError(f"token id {int(v)} is outside the vocabulary (0..{vocab_size - 1})", f"{where}[{i}]")
    return [int(v) for v in values]


def parse_prompt(prompt: Any, vocab_size: int) -> list[str | list[int]]:
    """The prompts of a request: texts, or lists of token ids checked against ``vocab_size``."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        raise PromptError(f"{type(prompt).__name__} is not a prompt; {FORMS}")
    if not prompt:
        raise PromptError(f"an empty list; {FORMS}")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        return [_ids(p, vocab_size, f"prompt[{i}]") for i, p in enumerate(prompt)]
    if any(isinstance(p, str) for p in prompt):
        raise PromptError(f"a list that mixes texts and other values; {FORMS}")
    if any(isinstance(p, list) for p in prompt):
        raise PromptError(f"a list that mixes lists of token ids and other values; {FORMS}")
    return [_ids(prompt, vocab_size, "prompt")]  # each value must be an id: a wrong one is named


def top_strings(alternatives: list[tuple[int, float]], text: Callable[[int], str]) -> dict[str, float]:
    """``top_logprobs`` of one position: token text -> log-probability. Ids whose texts are equal (byte pieces
    of one character all decode to U+FFFD) keep the highest, so ``max(top.values())`` is still the most likely
    token's, and a client's greedy check (lm-evaluation-harness compares a token's logprob with it) holds."""
    top: dict[str, float] = {}
    for i, lp in alternatives:
        s = text(i)
        top[s] = max(lp, top.get(s, lp))
    return top


def legacy_logprobs(tokens: list[str], logprobs: list[float | None], top: list[dict[str, float] | None],
                    offset: int) -> dict:
    """The completions ``logprobs`` object of tokens whose text starts at character ``offset``."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}
