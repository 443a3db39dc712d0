"""Arithmetic word problems with worked rationales, generated from fixed seeds: the chain-of-thought task.

Wei et al. 2022 ("Chain-of-Thought Prompting Elicits Reasoning in Large Language Models") prompt with word
problems (GSM8K) whose demonstrations write out the steps before the answer. Here the problems are small enough
to generate and check: a running total changed by two more numbers, worked left to right::

    text       Mia has 3 apples. She gets 4 more. Then she gives away 2. How many apples does she have now?
    rationale  3 plus 4 is 7. 7 minus 2 is 5.
    target     5

Numbers are 1..9 and a subtraction never takes more than there is (it becomes an addition), so every running
total is a whole number >= 0. :func:`draw` and :func:`solve` are the generator and the solver; GRPO's verifiable
sums (:func:`lmforge.align.grpo.arithmetic_prompts`) are drawn with them too.

Splits (:func:`split`): ``train`` (the demonstration pool) and ``test`` (the queries), each from its own seed,
each without repeated problems, and no test problem (its numbers and operations) occurs in train: a query's
answer is never shown in a demonstration.

Example:
    >>> rows = problems(2, seed=0)
    >>> rows == problems(2, seed=0), sorted(rows[0])
    (True, ['rationale', 'target', 'text'])
    >>> solve([3, 4, 2], ["+", "-"])
    [(3, '+', 4, 7), (7, '-', 2, 5)]
    >>> rationale(solve([3, 4, 2], ["+", "+"]))
    '3 plus 4 is 7. 7 plus 2 is 9.'
"""

from __future__ import annotations

import functools
import random
from typing import Sequence

from lmforge.data.sources import DataError

WORDS = {"+": "plus", "-": "minus", "*": "times"}
NAMES = (("Mia", "she"), ("Tom", "he"), ("Ana", "she"), ("Sam", "he"), ("Lea", "she"), ("Ben", "he"))
THINGS = ("apples", "coins", "books", "marbles", "stamps", "shells")
SPLITS = {"train": (1000, 1000), "test": (2000, 200)}  # split -> (seed, problems)
TERMS = 3


def draw(rng: random.Random, terms: int, low: int, high: int, ops: str) -> tuple[list[int], list[str]]:
    """``terms`` numbers in ``[low, high]``, then ``terms - 1`` operations from ``ops``, in that order from
    ``rng``."""
    numbers = [rng.randint(low, high) for _ in range(terms)]
    return numbers, [rng.choice(ops) for _ in range(terms - 1)]


def solve(numbers: Sequence[int], ops: Sequence[str]) -> list[tuple[int, str, int, int]]:
    """The steps left to right: ``(total so far, op, next number, new total)``; the answer is the last total."""
    steps, total = [], numbers[0]
    for op, b in zip(ops, numbers[1:]):
        new = total + b if op == "+" else total - b if op == "-" else total * b
        steps.append((total, op, b, new))
        total = new
    return steps


def rationale(steps: Sequence[tuple[int, str, int, int]]) -> str:
    """One sentence per step: ``"3 plus 4 is 7. 7 minus 2 is 5."``"""
    return " ".join(f"{a} {WORDS[op]} {b} is {c}." for a, op, b, c in steps)


def _story(rng: random.Random, numbers: Sequence[int], ops: Sequence[str]) -> str:
    name, pronoun = rng.choice(NAMES)
    things = rng.choice(THINGS)
    moves = [f"{pronoun.capitalize()} gets {b} more." if op == "+" else f"{pronoun.capitalize()} gives away {b}."
             for op, b in zip(ops, numbers[1:])]
    moves[1:] = [f"Then {m[0].lower()}{m[1:]}" for m in moves[1:]]
    return " ".join([f"{name} has {numbers[0]} {things}.", *moves,
                     f"How many {things} does {pronoun} have now?"])


def problems(n: int, seed: int, terms: int = TERMS, exclude: frozenset = frozenset()) -> list[dict[str, str]]:
    """``n`` distinct word problems ``{text, target, rationale}`` from ``random.Random(seed)``; problems whose
    (numbers, operations) are in ``exclude`` are skipped."""
    return _problems(n, seed, terms, exclude)[0]


def _problems(n: int, seed: int, terms: int, exclude: frozenset) -> tuple[list[dict[str, str]], set]:
    rng = random.Random(seed)
    rows, seen = [], set(exclude)
    while len(rows) < n:
        numbers, ops = draw(rng, terms, 1, 9, "+-")
        total = numbers[0]
        for i, b in enumerate(numbers[1:]):  # a word problem cannot give away more than there is
            if ops[i] == "-" and b > total:
                ops[i] = "+"
            total = total + b if ops[i] == "+" else total - b
        story = _story(rng, numbers, ops)  # drawn for a repeat too: each problem is one fixed stretch of draws
        key = (tuple(numbers), tuple(ops))
        if key in seen:
            continue
        seen.add(key)
        steps = solve(numbers, ops)
        rows.append({"text": story, "target": str(steps[-1][-1]), "rationale": rationale(steps)})
    return rows, seen - set(exclude)


def split(name: str) -> list[dict[str, str]]:
    """The rows of split ``train`` (the demonstration pool) or ``test`` (the queries)."""
    if name not in SPLITS:
        raise DataError(f"the arithmetic task has no split {name!r} (splits: {', '.join(SPLITS)})")
    return [dict(row) for row in _split(name)]


@functools.lru_cache(maxsize=None)
def _split(name: str) -> tuple[dict[str, str], ...]:
    held: frozenset = frozenset()
    if name != "train":
        train_seed, train_n = SPLITS["train"]
        held = frozenset(_problems(train_n, train_seed, TERMS, frozenset())[1])
    seed, n = SPLITS[name]
    return tuple(problems(n, seed, exclude=held))
