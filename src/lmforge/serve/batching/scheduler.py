"""The scheduler: one thread that runs every running generation request's decode step together.

Iteration-level scheduling (Orca, Yu et al. 2022): before each decode step, waiting jobs join free rows
of the :class:`~lmforge.generation.slots.SlotBatch` (their prompts prefilled, those of one length in one
forward, and their first tokens chosen);
then one forward over all rows gives every job its next token, each chosen with the job's own settings
(:class:`~lmforge.serve.batching.job.Job`); a job that ends, is cancelled (its client went away) or
runs past its deadline leaves, freeing its row at once.

    submit(job) --> waiting (deque, at most max_queue) --> rows (at most max_batch) --> done / cancelled
                        QueueFull beyond it                 one forward per step

A job of at most one new token (scoring a prompt: ``max_tokens`` 0 or 1 with ``echo``, as evaluation
clients send) needs no row: it waits in its own queue, and each turn of the loop runs one forward over a
batch of them (right-padded, at most ``score_tokens`` padded tokens; causal attention keeps the padding out
of every real position) between two decode steps. So scoring requests neither wait for a free row nor
stall the running generations: each loop turn does one scoring forward and one decode step. Models whose
MoE layers drop tokens over a capacity are batched only with prompts of the same length (padding would take
capacity).

Admission counts every open job against ``max_batch + max_queue``: a request is taken whole or refused
whole (:class:`QueueFull`, answered 429 while the server is busy), and one that could never fit even on an
idle server is :class:`TooLarge` (answered 400 naming the limits), never a 429 a client would retry forever.

The model runs only on this thread (torch releases the GIL inside its kernels, so the server's event
loop stays responsive); jobs report back through their ``emit`` callback. Per step the Python work is
kept off the per-row path where it can be: one argmax over the batch gives every plain greedy row its
token, and only rows that sample or report log-probabilities look at their own logits. An exception
while choosing one job's token fails that job only; one in the batched forward fails the jobs in that
batch, and the scheduler goes on with fresh rows.

With ``compile=True`` the decode steps run through compiled graphs (:class:`SlotBatch` with
``compile=True``); :meth:`Scheduler.start` compiles them before the first request (or falls back to
eager steps, with a warning, where compiling fails).

Example:
    >>> import torch, lmforge
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1).eval()
    >>> engine = Scheduler(model, max_batch=2, max_queue=4, max_len=32).start()
    >>> got = []
    >>> job = Job([5, 6, 7], max_new_tokens=3, decode=lambda ids: "", emit=got.append)
    >>> engine.submit(job); engine.wait_idle(timeout=30); engine.stop()
    True
    >>> got[-1]
    ('done', 'length')
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable

import torch

from lmforge.generation.slots import SlotBatch
from lmforge.nn.linear import decoding_weights
from lmforge.serve.batching.job import Job

SCORE_TOKENS = 4096  # padded prompt tokens per scoring forward (more when one prompt is longer)


class QueueFull(Exception):
    """The waiting queue holds ``max_queue`` jobs already (the server answers 429)."""


class TooLarge(Exception):
    """A request of more jobs than the scheduler ever holds at once (``max_batch + max_queue``): never runnable."""


class Draining(Exception):
    """The scheduler is shutting down and takes no new jobs (the server answers 503)."""


def error_id() -> str:
    """A short id that ties a failed request's 500 answer to the traceback in the server's log."""
    return uuid.uuid4().hex[:12]


class Scheduler:
    """Continuous batching over one model (see the module docstring).

    Args:
        model: a decoder with an LM head.
        max_batch: rows decoded at once.
        max_queue: jobs that may wait for a row; more are refused with :class:`QueueFull`.
        max_len: prompt + generated tokens a job may reach (the server checks requests against it).
        observe: called with ``(event, value)`` for metrics: ``("queue", n)``, ``("batch", n)``,
            ``("tokens", n)`` (a decode step over n rows), ``("finished", job)``.
        decode_weights: weights to multiply in their decoding forms while the scheduler runs eager steps
            (those that ``generate`` uses, so tokens equal its own).
        compile: decode steps through compiled graphs (see the module docstring).
    """

    def __init__(self, model, max_batch: int, max_queue: int, max_len: int,
                 observe: Callable[[str, object], None] | None = None, decode_weights=(), compile: bool = False):
        self.model = model.eval()
        self.max_batch, self.max_queue, self.max_len = max_batch, max_queue, max_len
        self.observe = observe or (lambda event, value: None)
        self.decode_weights = list(decode_weights)
        self.compile = compile
        self.rows = SlotBatch(model, max_batch, max_len, compile=compile)
        self.waiting: deque[Job] = deque()
        self.scoring: deque[Job] = deque()  # jobs of at most one new token: one plain forward each, no row
        # Logits of one scoring forward are (rows, T, V) floats: a few thousand positions bound their memory.
        self.score_tokens = max(max_len, SCORE_TOKENS)
        mc = model.config
        self.pad_ok = not (getattr(mc, "moe_experts", 0) and (getattr(mc, "moe_capacity_factor", None)
                                                               or getattr(mc, "moe_expert_capacity", None)))
        self.running: dict[int, Job] = {}
        self.last: dict[int, int] = {}  # job key -> its newest token (fed at the next step)
        self.cond = threading.Condition()
        self.draining = False
        self._stop = False
        self._open = 0  # jobs submitted and not yet ended (waiting, being admitted, or running)
        self.thread = threading.Thread(target=self._loop, name="lmforge-scheduler", daemon=True)

    # ------------------------------------------------------------------ the server's side
    def start(self) -> "Scheduler":
        """Start the thread (after compiling the decode steps, with ``compile=True``)."""
        if self.compile:
            with torch.inference_mode():
                self.compile = self.rows.warm_up()
        self.thread.start()
        return self

    @property
    def capacity(self) -> int:
        """Jobs the scheduler holds at once: running rows plus waiting places."""
        return self.max_batch + self.max_queue

    def submit(self, job: Job) -> None:
        """Queue ``job``; raise :class:`QueueFull` or :class:`Draining` instead when it cannot be taken."""
        self.submit_many([job])

    def submit_many(self, jobs: list[Job]) -> None:
        """Queue all of ``jobs`` (one request's prompts x choices) or none: raise :class:`TooLarge` if they
        could never fit, :class:`QueueFull` if they do not fit now, :class:`Draining` when shutting down."""
        with self.cond:
            if self.draining:
                raise Draining("the server is shutting down")
            if len(jobs) > self.capacity:
                raise TooLarge(f"{len(jobs)} jobs (prompts x n) in one request, but the server holds at most "
                               f"max_batch + max_queue = {self.max_batch} + {self.max_queue} = {self.capacity}")
            if self._open + len(jobs) > self.capacity:
                raise QueueFull(f"{self._open} requests are already running or waiting "
                                f"(max_batch + max_queue = {self.capacity})")
            for job in jobs:
                (self.scoring if job.prefill_only else self.waiting).append(job)
            self._open += len(jobs)
            self.observe("queue", len(self.waiting) + len(self.scoring))
            self.cond.notify()

    @property
    def busy(self) -> int:
        """Jobs waiting or running."""
        with self.cond:
            return self._open

    def drain(self) -> None:
        """Refuse new jobs from now on; the queued and running ones still finish."""
        with self.cond:
            self.draining = True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no job waits or runs; False if ``timeout`` seconds passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.busy:
            if end is not None and time.monotonic() > end:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        """End the thread (jobs still running are cancelled)."""
        with self.cond:
            self._stop = True
            self.cond.notify()
        self.thread.join(timeout=30)

    # ------------------------------------------------------------------ the scheduler thread
    def _loop(self) -> None:
        # The compiled graph multiplies by the weights as they are: the decoding forms are for eager steps.
        with torch.inference_mode(), decoding_weights([] if self.compile else self.decode_weights):
            while True:
                with self.cond:
                    while not self._stop and not self.waiting and not self.scoring and not self.running:
                        self.cond.wait()
                    if self._stop:
                        break
                self._admit()
                if self.scoring:
                    self._score()
                if self.running:
                    self._step()
        for job in list(self.running.values()) + list(self.waiting) + list(self.scoring):
            job.emit(("done", "cancelled"))

    def _admit(self) -> None:
        """Waiting jobs take the free rows; prompts of one length are prefilled together."""
        while self.rows.free:
            jobs = []
            with self.cond:
                while self.waiting and len(jobs) < self.rows.free:
                    jobs.append(self.waiting.popleft())
                if not jobs:
                    break
                self.observe("queue", len(self.waiting) + len(self.scoring))
            now, groups = time.monotonic(), {}
            for job in jobs:
                if job.cancelled or job.expired(now):
                    job.reason = "cancelled" if job.cancelled else "timeout"
                    self._ended(job)
                    job.emit(("done", job.reason))
                else:
                    groups.setdefault(len(job.ids), []).append(job)
            for group in groups.values():
                self._join(group)
        self.observe("batch", len(self.running))

    def _join(self, jobs: list[Job]) -> None:
        """Prefill ``jobs`` (prompts of one length) in one forward, and choose their first tokens; if that
        fails, each alone, so that a prompt that fails fails only its own job."""
        keep = any(job.wants_prompt_logits for job in jobs)
        try:
            items = [(job.key, job.ids) for job in jobs]
            logits = self.rows.join_many(items, all_positions=True) if keep else self.rows.join_many(items)
        except Exception as exc:
            if len(jobs) == 1:
                self._fail(jobs[0], exc)
                return
            for job in jobs:
                self._join([job])
            return
        for job, row in zip(jobs, logits):
            self.running[job.key] = job
            if job.echo:
                try:
                    job.emit(job.score_prompt(row))
                except Exception as exc:
                    self._fail(job, exc)
                    continue
            self._advance(job, row[-1] if keep else row)

    def _score(self) -> None:
        """One forward over the next scoring jobs (at least one; at most ``score_tokens`` padded tokens): the
        oldest ones in order, or, where padding is not neutral, the oldest and those of its length. Each gets
        its prompt's :class:`~lmforge.serve.batching.job.Echo` and, if it asked for one, the token chosen from
        its last position; then it ends."""
        jobs, rest, longest, now = [], deque(), 0, time.monotonic()
        with self.cond:
            for job in self.scoring:
                if job.cancelled or job.expired(now):
                    job.reason = "cancelled" if job.cancelled else "timeout"
                    self._open -= 1
                    self.observe("finished", job)
                    job.emit(("done", job.reason))
                    continue
                T = len(job.ids)
                fits = not jobs or ((len(jobs) + 1) * max(longest, T) <= self.score_tokens
                                    and (not rest if self.pad_ok else T == longest))
                if fits:
                    jobs.append(job)
                    longest = max(longest, T)
                else:
                    rest.append(job)
            self.scoring = rest
            self.observe("queue", len(self.waiting) + len(self.scoring))
        if jobs:
            self._score_batch(jobs, longest)

    def _score_batch(self, jobs: list[Job], longest: int) -> None:
        device = next(self.model.parameters()).device
        ids = torch.zeros(len(jobs), longest, dtype=torch.long, device=device)  # (B, T): right-padded with id 0
        for i, job in enumerate(jobs):
            ids[i, :len(job.ids)] = torch.tensor(job.ids, device=device)
        try:
            logits = self.model(ids).logits  # (B, T, V)
        except Exception as exc:
            if len(jobs) == 1:
                self._fail(jobs[0], exc, leave=False)
                return
            for job in jobs:
                self._score_batch([job], len(job.ids))
            return
        for job, row in zip(jobs, logits):
            T = len(job.ids)
            try:
                if job.echo:
                    job.emit(job.score_prompt(row[:T]))
                if job.max_new_tokens == 0:
                    self._finish(job, "length")
                    continue
                token, reason = job.choose(row[T - 1])
            except Exception as exc:
                self._fail(job, exc, leave=False)
                continue
            job.emit(token)
            self._finish(job, reason or "length")

    def _step(self) -> None:
        keys = list(self.rows.keys)
        tokens = torch.tensor([self.last[k] for k in keys])
        try:
            logits = self.rows.step(tokens)  # (n, V): one forward for every running job
        except Exception as exc:
            for key in keys:
                self._fail(self.running[key], exc, leave=False)
            self.rows = SlotBatch(self.model, self.max_batch, self.max_len, compile=self.rows.compiled)
            self.running.clear()
            self.observe("batch", 0)
            return
        self.observe("tokens", len(keys))
        greedy = logits.argmax(-1).tolist()  # every plain greedy row's token, in one op
        now = time.monotonic()
        for key, row, best in zip(keys, logits, greedy):
            job = self.running[key]
            if job.cancelled or job.expired(now):
                self._finish(job, "cancelled" if job.cancelled else "timeout")
            else:
                self._advance(job, row, best)
        self.observe("batch", len(self.running))

    def _advance(self, job: Job, logits: torch.Tensor, argmax: int | None = None) -> None:
        """Choose ``job``'s next token (``argmax``: that of ``logits``, if known) and hand it over; end the job
        when it is done."""
        try:
            token, reason = job.choose(logits, argmax)
        except Exception as exc:
            self._fail(job, exc)
            return
        job.emit(token)
        if reason is None and len(job.ids) + len(job.tokens) >= self.max_len:
            reason = "length"
        if reason is not None:
            self._finish(job, reason)
        else:
            self.last[job.key] = token.id

    def _finish(self, job: Job, reason: str) -> None:
        self._leave(job)
        job.reason = reason
        self._ended(job)
        job.emit(("done", reason))

    def _fail(self, job: Job, exc: Exception, leave: bool = True) -> None:
        job.error_id = error_id()
        print(f"lmforge serve: error {job.error_id} in a generation request:\n{traceback.format_exc()}",
              flush=True)
        if leave:
            self._leave(job)
        self._ended(job)
        job.emit(("error", exc))

    def _ended(self, job: Job) -> None:
        # Before the job's last event: a client that has its answer may send the next request at once, and
        # the scheduler must not count this job against it.
        self.observe("finished", job)
        with self.cond:
            self._open -= 1

    def _leave(self, job: Job) -> None:
        if job.key in self.running:
            del self.running[job.key]
            self.last.pop(job.key, None)
            if job.key in self.rows.keys:
                self.rows.leave(job.key)
