"""Task mixtures: the training and evaluation tables of a task or of a text2text mixture, and the rate at
which each task of a mixture is sampled.

A mixture (``TaskSpec.mixture``) names each task's own ``train``/``eval`` files; its tasks are sampled
in proportion to their size, capped and tempered (:func:`lmforge.tasks.text2text.mixing_rates`).

Example:
    >>> from lmforge.tasks.data import Table
    >>> from lmforge.tasks.spec import TaskSpec
    >>> table = Table("mem", [{"text": "a", "label": "x"}], ["text", "label"])
    >>> train, evals = task_tables(TaskSpec(task="classify"), table, None)
    >>> list(train), evals
    ([''], {})
"""

from __future__ import annotations

from lmforge.config import ConfigError
from lmforge.tasks.data import Table, read_table
from lmforge.tasks.spec import TaskSpec
from lmforge.tasks.text2text import mixing_rates


def as_table(source) -> Table:
    """``source`` as a :class:`Table`: a Table, or a data file / ``NAME:SPLIT`` to read."""
    return source if isinstance(source, Table) else read_table(source)


def task_tables(spec: TaskSpec, train, eval) -> tuple[dict[str, Table], dict[str, Table]]:
    """name -> Table for training and evaluation ("" for a single task)."""
    if not spec.mixture:
        if train is None:
            raise ConfigError("no training data: pass a data file (--train)")
        return {"": as_table(train)}, ({"": as_table(eval)} if eval is not None else {})
    if train is not None or eval is not None:
        raise ConfigError("a mixture names its own files (train/eval per entry); do not pass --train/--eval too")
    trains, evals = {}, {}
    for entry in spec.mixture:
        if not entry.get("train"):
            raise ConfigError(f"mixture task {entry['name']!r} has no 'train' file")
        trains[entry["name"]] = as_table(entry["train"])
        if entry.get("eval"):
            evals[entry["name"]] = as_table(entry["eval"])
    return trains, evals


def mixture_rates(spec: TaskSpec, sizes: list[int]) -> list[float]:
    """The sampling rate of each task of ``spec``'s mixture, given their numbers of training examples."""
    return mixing_rates(sizes, spec.mixing_cap, spec.mixing_temperature)
