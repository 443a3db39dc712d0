"""The server's limits, and the checks that apply them before any work is queued.

    max_batch      requests decoded together (rows of the running batch)
    max_queue      requests waiting for a row; one more gets 429 with Retry-After
    max_len        prompt + completion tokens per prompt; more gets 400 naming both numbers (a prompt scored
                   with echo and max_tokens 0 may fill all max_len)
    max_request_tokens
                   prompt + completion tokens of a whole request (every prompt, times n); more gets 413
    max_batch + max_queue
                   generations (prompts x n) of one request; more gets 400 (it could never run), while a
                   request that fits only later gets 429
    timeout        seconds a request may take; then it ends (504, or an error event in a stream)
    max_body       request body bytes; more gets 413

An API key, when set, is compared in constant time (``hmac.compare_digest``), so the time a wrong key
takes to refuse says nothing about how much of it was right.

Example:
    >>> check_length(60, 10, max_len=64)
    Traceback (most recent call last):
    ...
    lmforge.serve.limits.TooLong: this model's maximum context length is 64 tokens; you requested 70 tokens (60 in the prompt, 10 for the completion): shorten the prompt or max_tokens
    >>> key_matches("Bearer s3cret", "s3cret"), key_matches("Bearer guess", "s3cret")
    (True, False)
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from lmforge.errors import UserInputError


class TooLong(UserInputError):
    """A prompt (+ completion) over ``max_len`` tokens."""


@dataclass
class Limits:
    """See the module docstring. ``max_len=None``: the model's ``max_seq_len``."""

    max_batch: int = 16
    max_queue: int = 64
    max_len: int | None = None
    max_request_tokens: int = 1 << 16
    timeout: float = 600.0
    max_body: int = 1 << 20
    retry_after: int = 1  # seconds a refused client is asked to wait

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "max_body", "max_request_tokens"):
            if getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_len is not None and self.max_len < 2:
            raise UserInputError(f"--max-len must be >= 2, got {self.max_len}")
        if not self.timeout > 0:
            raise UserInputError(f"--timeout must be > 0 seconds, got {self.timeout}")



def check_length(prompt_tokens: int, max_tokens: int, max_len: int) -> None:
    """Raise :class:`TooLong` unless prompt + completion fit in ``max_len`` tokens."""
    total = prompt_tokens + max_tokens
    if prompt_tokens < 1 or total > max_len:
        raise TooLong(f"this model's maximum context length is {max_len} tokens; you requested {total} "
                      f"tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion): shorten the "
                      "prompt or max_tokens")


class OverBudget(UserInputError):
    """A request whose prompts and completions together exceed ``max_request_tokens``."""


def check_budget(tokens: int, max_request_tokens: int) -> None:
    """Raise :class:`OverBudget` if a request's ``tokens`` (prompts + completions, times n) exceed the budget."""
    if tokens > max_request_tokens:
        raise OverBudget(f"this request needs {tokens} tokens (its prompts and completions, times n), over the "
                         f"server's per-request budget of {max_request_tokens} (--max-request-tokens): send fewer "
                         "or shorter prompts, or a smaller max_tokens or n")


def key_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (constant-time comparison)."""
    given = (header or "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), key.encode())
