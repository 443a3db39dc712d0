"""One generation request as the scheduler sees it: prompt ids, per-row sampling settings, and where its
tokens go.

Each row of a running batch picks its next token with its own settings: greedy (argmax) or sampled
from softmax(logits / temperature) after top-k / top-p (the filters of
:mod:`lmforge.generation.sampling`), from its own seeded generator, so a seeded request samples the same
tokens whatever else shares the batch.

A job with ``echo`` also gets its prompt scored: the prefill's logits at every prompt position give each
prompt token's log-probability given the tokens before it (:meth:`Job.score_prompt`, an :class:`Echo`
event before its first token). A job of at most one new token needs no KV-cache row: the scheduler
scores it in a plain forward and picks its token from the last position (:meth:`Job.prefill_only`).

Text is decoded whole at each token (multi-byte characters and tokenizer spacing stay right, as in
:class:`lmforge.generation.TextStream`). A stop string ends the request; as in OpenAI's API the text
stops *before* it, and a tail of text that might begin a stop string is held back until it cannot.

Example:
    >>> visible_text("an answer.\\n\\nQ: next", ["\\n\\n"])
    ('an answer.', True)
    >>> visible_text("an answer.\\n", ["\\n\\n"])      # might be the start of "\\n\\n": held back
    ('an answer.', False)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.generation import GenerationConfig, LogitsPipeline

_ids = itertools.count()


def visible_text(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """(the text that may be shown, whether a stop string ended it): cut before the earliest stop string,
    else without a trailing part that could still grow into one, or an incomplete character."""
    found = [text.find(s) for s in stops if s in text]
    if found:
        return text[:min(found)], True
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    text = text[:len(text) - hold]
    return text.rstrip("\ufffd") if text.endswith("\ufffd") else text, False


GREEDY_BELOW = 1e-4  # a smaller temperature decodes greedily (see Job.__post_init__)

@dataclass
class Token:
    """What one step produced for a job: the token, the new text it shows, and its log-probabilities."""

    id: int
    text: str
    logprob: float | None = None
    top: dict[int, float] | None = None  # the most likely ids -> log-probability, when asked


@dataclass
class Echo:
    """A job's prompt as its prefill scored it. Per prompt token: its log-probability given the tokens before it
    and the most likely ids at that position (id -> log-probability); the first token has neither (None).
    ``logprobs`` and ``top`` are None when the request asked for no log-probabilities."""

    ids: list[int]
    logprobs: list[float | None] | None = None
    top: list[dict[int, float] | None] | None = None


@dataclass
class Job:
    """A generation request (see the module docstring).

    Args:
        ids: prompt token ids.
        max_new_tokens: tokens to generate at most.
        temperature: 0 = greedy; else sampling at this temperature.
        top_p, top_k: sampling filters (1.0 / None = off).
        seed: seeds this job's own generator (None: the global RNG).
        eos_ids: ids that end the job (not shown as text).
        stops: stop strings.
        logprobs: None, or how many top alternatives to report per token (0: only the chosen one's).
        echo: score the prompt too (an :class:`Echo`, with log-probabilities when ``logprobs`` is not None).
        decode: ids -> text.
        emit: called from the scheduler thread with an :class:`Echo` (``echo`` jobs, first), each :class:`Token`,
            then once with ``("done", reason)``
            (``"stop"``, ``"length"``, ``"cancelled"``, ``"timeout"``) or ``("error", exception)``.
        timeout: seconds the job may run from submission.
    """

    ids: list[int]
    max_new_tokens: int
    decode: Callable[[list[int]], str]
    emit: Callable[[Any], None]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    eos_ids: Sequence[int] = ()
    stops: Sequence[str] = ()
    logprobs: int | None = None
    echo: bool = False
    timeout: float | None = None
    key: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)
    error_id: str | None = None  # set when the job failed: the id its 500 answer and the log share
    reason: str | None = None  # why it ended: stop, length, cancelled, timeout (None while running; error)
    generated: int = 0  # tokens chosen, an ending EOS included (usage counts it)
    shown: str = ""
    submitted: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # Below GREEDY_BELOW, logits / temperature overflows float32 to inf (softmax then gives NaN); sampling's
        # limit as the temperature goes to 0 is the argmax, so such a job decodes greedily.
        sampling = self.temperature >= GREEDY_BELOW
        config = GenerationConfig(strategy="sample" if sampling else "greedy", temperature=self.temperature or 1.0,
                                  top_p=self.top_p if sampling else 1.0, top_k=self.top_k if sampling else None)
        self.sampling = sampling
        self.processors = LogitsPipeline(config, sampling)
        self.generator = None
        self.deadline = self.submitted + self.timeout if self.timeout else None

    def cancel(self) -> None:
        """Ask the scheduler to drop this job at its next step (thread-safe)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    @property
    def prefill_only(self) -> bool:
        """Whether one forward over the prompt does the whole job (at most one new token: no cache row needed)."""
        return self.max_new_tokens <= 1

    @property
    def wants_prompt_logits(self) -> bool:
        """Whether the prefill must keep the logits of every prompt position, not only the last."""
        return self.echo and self.logprobs is not None

    def score_prompt(self, logits: torch.Tensor | None) -> Echo:
        """The prompt's :class:`Echo` from the prefill's logits (T, V) (raw, before sampling settings, as
        vLLM's prompt logprobs); ``logits`` may be None when no log-probabilities were asked."""
        if not self.wants_prompt_logits:
            return Echo(list(self.ids))
        logp = logits.float().log_softmax(-1)[:-1]  # (T-1, V): position t predicts prompt token t+1
        nxt = torch.tensor(self.ids[1:], dtype=torch.long, device=logp.device)[:, None]  # (T-1, 1)
        chosen = logp.gather(1, nxt)[:, 0].tolist()  # (T-1,)
        top: list[dict[int, float] | None] = [None]
        if self.logprobs:
            values, ids = logp.topk(min(self.logprobs, logp.shape[-1]), dim=-1)  # (T-1, k)
            top += [dict(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
        else:
            top += [{} for _ in chosen]
        return Echo(list(self.ids), [None, *chosen], top)

    def choose(self, logits: torch.Tensor, argmax: int | None = None) -> tuple[Token, str | None]:
        """Pick the next token from logits (V,); return it and the finish reason, if it ends the job.
        ``argmax``: the logits' argmax, when the caller took it already (a greedy job then needs nothing else)."""
        if argmax is not None and not self.sampling and not self.processors and self.logprobs is None:
            return self._accept(argmax, None, None)
        scores = logits.float()[None]  # (1, V)
        if self.processors:
            scores = self.processors(scores, None, None)
        if self.sampling:
            if self.generator is None and self.seed is not None:
                self.generator = torch.Generator(scores.device).manual_seed(self.seed)
            token = int(torch.multinomial(scores.softmax(-1), 1, generator=self.generator))
        else:
            token = int(scores.argmax(-1))
        logprob = top = None
        if self.logprobs is not None:
            logp = scores.log_softmax(-1)[0]  # (V,)
            logprob = float(logp[token])
            if self.logprobs:
                values, ids = logp.topk(min(self.logprobs, logp.shape[0]))
                top = dict(zip(ids.tolist(), values.tolist()))
        return self._accept(token, logprob, top)

    def _accept(self, token: int, logprob: float | None, top: dict[int, float] | None) -> tuple[Token, str | None]:
        """Record the chosen ``token``: its new text, and the finish reason if it ends the job."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.generated += 1
        if token in self.eos_ids:
            return Token(token, "", logprob, top), "stop"
        self.tokens.append(token)
        text, stopped = visible_text(self.decode(self.tokens), self.stops)
        piece = text[len(self.shown):] if text.startswith(self.shown) else ""
        self.shown = text if piece or stopped else self.shown
        if stopped:
            return Token(token, piece, logprob, top), "stop"
        if len(self.tokens) >= self.max_new_tokens:
            final = self.decode(self.tokens)  # whatever was held back (a partial stop string) is text after all
            tail = final[len(self.shown):] if final.startswith(self.shown) else ""
            self.shown = final
            return Token(token, piece + tail, logprob, top), "length"
        return Token(token, piece, logprob, top), None
