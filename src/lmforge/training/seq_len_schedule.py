"""A sequence-length schedule: one run trained at several input lengths in turn, optimizer and LR schedule kept.

BERT (Devlin et al. 2019, appendix A.2) pre-trains "with sequence length of 128 for 90% of the steps", then "the
rest 10% of the steps of sequence of 512 to learn the positional embeddings", with the batch held at 256
*sequences*. ``seq_len_schedule: "128:0.9,512:0.1"`` (``--seq-len-schedule``) does the same:

* **Phases count optimizer steps**, as BERT does: phase ``k`` starts at step ``floor(max_steps * (f_1 + ... +
  f_{k-1}) + 1/2)``, computed with exact fractions (``0.9`` is 9/10, so 1000 steps switch at step 900, never 899
  from a rounding error). Every phase must get at least one step.
* **The batch stays in sequences** (``batch_size`` x ``grad_accum``), as in BERT: a step at 512 reads 4x the
  tokens (and far more than 4x the attention FLOPs) of a step at 128. Each step's FLOPs are counted from its own
  batches' shapes, so the price tag charges each phase what it cost.
* **The data moves on, it does not restart**: each phase reads batches of its own length (packed blocks or
  document segments), and a new phase starts in the epoch the previous one was in, at the same share of it
  (batch ``ceil(b * n_new / n_old)`` of ``n_new``, after ``b`` of ``n_old``). Document order is shared by every
  length (same seed), so for packed blocks that is the same place in the token stream, to within one shuffle
  window.
* **One objective** carries its random state across the switch (a copy per length is built, since some cut
  their inputs to the length, e.g. NSP's pairs, and the state is handed on at the switch).
* **Evaluation** runs at the longest length throughout, the length the model is being trained for, so the eval
  curve is one curve across the switch.
* **Resume is exact** before, at and after a switch: the step counter, the position of every phase's data and
  the switch steps are in the checkpoint. The schedule is a trajectory setting (``--resume`` refuses to change
  it), and ``--resume --max-steps N`` is refused when ``N`` would move a switch (:func:`moved_switch`); an
  extension that keeps every switch step only lengthens the last phase.

Example:
    >>> schedule = parse_seq_len_schedule("128:0.9,512:0.1")
    >>> schedule
    [(128, Fraction(9, 10)), (512, Fraction(1, 10))]
    >>> phase_starts(schedule, 1000), phase_starts(schedule, 15)
    ([0, 900], [0, 14])
    >>> parse_seq_len_schedule("128:0.9,512:0.2")
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: seq_len_schedule='128:0.9,512:0.2': the fractions sum to 1.1, not 1
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterator

from lmforge.config import ConfigError
from lmforge.errors import UserInputError


def parse_seq_len_schedule(text: str, key: str = "seq_len_schedule") -> list[tuple[int, Fraction]]:
    """``"LEN:FRACTION,LEN:FRACTION,..."`` -> ``[(length, fraction), ...]``: lengths >= 2 and strictly increasing,
    fractions in (0, 1] (decimals or ``a/b``) summing to exactly 1. Raises ConfigError naming the bad item."""
    items = [item.strip() for item in str(text).split(",")]
    schedule: list[tuple[int, Fraction]] = []
    for i, item in enumerate(items, 1):
        where = f"{key}={text!r}: item {i} {item!r}"
        length, sep, share = item.partition(":")
        if not sep:
            raise ConfigError(f"{where} is not LENGTH:FRACTION (e.g. 128:0.9,512:0.1)")
        try:
            length_value = int(length.strip())
        except ValueError:
            raise ConfigError(f"{where}: length {length.strip()!r} is not an integer") from None
        try:
            fraction = Fraction(share.strip())
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"{where}: fraction {share.strip()!r} is not a number") from None
        if length_value < 2:
            raise ConfigError(f"{where}: length must be >= 2")
        if not 0 < fraction <= 1:
            raise ConfigError(f"{where}: fraction must be in (0, 1]")
        if schedule and length_value <= schedule[-1][0]:
            raise ConfigError(f"{where}: lengths must increase, and {length_value} follows {schedule[-1][0]}")
        schedule.append((length_value, fraction))
    total = sum(f for _, f in schedule)
    if total != 1:
        raise ConfigError(f"{key}={text!r}: the fractions sum to {float(total):.10g}, not 1")
    return schedule


def phase_starts(schedule: list[tuple[int, Fraction]], max_steps: int) -> list[int]:
    """The optimizer step (0-based count of steps done) at which each phase starts; the first is 0."""
    starts, done = [], Fraction(0)
    for _, fraction in schedule:
        starts.append(math.floor(done * max_steps + Fraction(1, 2)))
        done += fraction
    return starts


def check_phase_steps(text: str, max_steps: int, key: str = "seq_len_schedule") -> None:
    """Refuse a schedule in which a phase gets no step of ``max_steps`` (ConfigError naming the item)."""
    schedule = parse_seq_len_schedule(text, key)
    ends = phase_starts(schedule, max_steps)[1:] + [max_steps]
    for i, (start, end, (length, fraction)) in enumerate(zip(phase_starts(schedule, max_steps), ends, schedule), 1):
        if end <= start:
            raise ConfigError(f"{key}={text!r}: item {i} '{length}:{fraction}' gets no step of max_steps={max_steps}; "
                              "raise max_steps or its fraction")


def moved_switch(schedule: str, saved_max_steps: int, max_steps: int) -> str | None:
    """Why resuming a run of ``schedule`` over ``saved_max_steps`` with ``max_steps`` is refused (its switch
    steps would move), or None when they stay (an extension that only lengthens the last phase)."""
    before, after = (phase_starts(parse_seq_len_schedule(schedule), n) for n in (saved_max_steps, max_steps))
    if before == after:
        return None
    return (f"the run switches sequence length at step(s) {', '.join(map(str, before[1:]))} of "
            f"max_steps={saved_max_steps}; max_steps={max_steps} would move the switch to "
            f"{', '.join(map(str, after[1:]))}: resume with --max-steps {saved_max_steps}")


def refuse_moved_switch(out: Any, saved: Any, given: Any) -> None:
    """Raise UserInputError when resuming ``out`` (TrainConfig ``saved``) with ``given`` would move a switch of
    its ``seq_len_schedule``; read-only, so a refusal writes nothing."""
    if saved.seq_len_schedule and given.seq_len_schedule == saved.seq_len_schedule:
        why = moved_switch(saved.seq_len_schedule, saved.max_steps, given.max_steps)
        if why:
            raise UserInputError(f"--out {out}: cannot resume: {why}")


class PhasedData:
    """The training batches of a sequence-length schedule: phase ``k``'s source until its last step, then the next.

    Args:
        sources: one raw-batch source per phase (e.g. :class:`~lmforge.data.PackedDataset` of each length), each
            re-iterable, with ``state_dict``/``load_state_dict`` for exact resume.
        lengths: the model input length of each phase (logged as ``seq_len``).
        starts: :func:`phase_starts`; ``grad_accum``: raw batches per optimizer step.
        max_steps: the run's, kept to name it when a resume would move the switch.

    :meth:`step_record` gives the Trainer the step's ``seq_len`` (and ``seq_len_switch`` on a phase's first step).
    """

    kind = "seq_len_schedule"

    def __init__(self, sources: list[Any], lengths: list[int], starts: list[int], grad_accum: int,
                 max_steps: int) -> None:
        if not len(sources) == len(lengths) == len(starts):
            raise ValueError(f"{len(sources)} sources, {len(lengths)} lengths and {len(starts)} phase starts")
        self.sources, self.lengths, self.starts = list(sources), list(lengths), list(starts)
        self.grad_accum, self.max_steps = grad_accum, max_steps
        self.consumed = 0  # raw batches handed out so far
        self.entered = 0  # the newest phase whose data position has been set (a phase is entered once)

    def phase_of(self, batch: int) -> int:
        """The phase of raw batch ``batch`` (0-based): that of its optimizer step."""
        step = batch // self.grad_accum
        return max(k for k, start in enumerate(self.starts) if start <= step)

    @property
    def phase(self) -> int:
        """The phase of the batch handed out last (of the next one, before any)."""
        return self.phase_of(max(self.consumed - 1, 0))

    @property
    def seq_len(self) -> int:
        return self.lengths[self.phase]

    def step_record(self) -> dict[str, Any]:
        """What the step just drawn adds to its metrics record: ``seq_len``, and ``seq_len_switch`` ("128->512") on
        the first step of every phase after the first."""
        k = self.phase
        step = (self.consumed - 1) // self.grad_accum
        record: dict[str, Any] = {"seq_len": self.lengths[k]}
        if k and step == self.starts[k]:
            record["seq_len_switch"] = f"{self.lengths[k - 1]}->{self.lengths[k]}"
        return record

    def _enter(self, k: int) -> None:
        # The new phase continues the old one's epoch at the same share of it (module docstring).
        old, new = self.sources[k - 1], self.sources[k]
        before, after = _state(old), _state(new)
        if isinstance(before, dict) and isinstance(after, dict) and {"epoch", "batch"} <= before.keys() & after.keys():
            n_old, n_new = len(old), len(new)
            batch = -(-int(before["batch"]) * n_new // n_old) if n_old else 0
            new.load_state_dict({**after, "epoch": int(before["epoch"]), "batch": batch})
        self.entered = k

    def __iter__(self) -> Iterator:
        active, batches = None, None
        try:
            while True:
                k = self.phase_of(self.consumed)
                if k != active:
                    if batches is not None:
                        batches.close()  # e.g. a DataLoader's workers of the phase just left
                    if k > self.entered:
                        self._enter(k)
                    active, batches = k, iter(self.sources[k])
                try:
                    batch = next(batches)
                except StopIteration:  # an epoch of this phase ended: the next one
                    batches = iter(self.sources[k])
                    try:
                        batch = next(batches)
                    except StopIteration:
                        raise UserInputError(f"the training data of length {self.lengths[k]} yielded no batches") \
                            from None
                self.consumed += 1  # before yielding: a state saved now resumes after this batch
                yield batch
        finally:
            if batches is not None:
                batches.close()

    def state_dict(self) -> dict[str, Any]:
        first = _state(self.sources[0])
        where = {k: first[k] for k in ("rank", "world_size") if isinstance(first, dict) and k in first}
        return {"kind": self.kind, "consumed": self.consumed, "entered": self.entered, "lengths": self.lengths,
                "starts": self.starts, "max_steps": self.max_steps, **where,
                "phases": [_state(s) for s in self.sources]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`; a schedule that differs is refused (UserInputError)."""
        if not isinstance(state, dict) or state.get("kind") != self.kind:
            raise UserInputError("cannot resume: the checkpoint was trained without a seq_len_schedule; resume "
                                 "without --seq-len-schedule, or start a new run")
        if state["lengths"] != self.lengths:
            raise UserInputError(f"cannot resume: the run's sequence lengths are {state['lengths']}, the schedule "
                                 f"given has {self.lengths}")
        if state["starts"] != self.starts:
            raise UserInputError(f"cannot resume: the run switches sequence length at step(s) "
                                 f"{', '.join(map(str, state['starts'][1:]))} of max_steps={state['max_steps']}; "
                                 f"max_steps={self.max_steps} would move the switch to "
                                 f"{', '.join(map(str, self.starts[1:]))}: resume with --max-steps "
                                 f"{state['max_steps']}")
        for source, saved in zip(self.sources, state["phases"]):
            if saved is not None and hasattr(source, "load_state_dict"):
                source.load_state_dict(saved)
        self.consumed, self.entered = int(state["consumed"]), int(state["entered"])


class PhasedObjective:
    """One objective across the phases of :class:`PhasedData`: ``objectives[k]`` (built for phase ``k``'s length)
    turns phase ``k``'s batches, and takes over the random state of the one before at the switch."""

    def __init__(self, objectives: list[Any], data: PhasedData) -> None:
        self.objectives, self.data = list(objectives), data
        self.active = 0

    @property
    def base(self) -> Any:
        """The first phase's objective: what the model is built for (the phases differ only in length)."""
        return self.objectives[0]

    def _follow(self) -> Any:
        k = self.data.phase
        if k != self.active:
            state = _state(self.objectives[self.active])
            if state is not None:
                self.objectives[k].load_state_dict(state)
            self.active = k
        return self.objectives[k]

    def __call__(self, raw):
        return self._follow()(raw)

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.active, "state": _state(self.objectives[self.active])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.active = int(state["phase"])
        if state.get("state") is not None:
            self.objectives[self.active].load_state_dict(state["state"])


def base_objective(objective: Any) -> Any:
    """``objective`` itself, or the first phase's objective of a :class:`PhasedObjective`."""
    return objective.base if isinstance(objective, PhasedObjective) else objective


def _state(obj: Any) -> Any:
    return obj.state_dict() if hasattr(obj, "state_dict") else None
