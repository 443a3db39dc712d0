"""A tiny policy folder, preference pairs and prompts for the alignment tests (each step takes milliseconds).

The pairs prefer a polar-positive word over a polar-negative one after a few filler words, so a few DPO steps
move the margin; the prompts are the same openings.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lmforge import checkpoint
from task_helpers import FILL, NEG, POS, body, tokenizer, train_config


def pair_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.sample(FILL, 3)), "chosen": " " + rng.choice(POS),
             "rejected": " " + rng.choice(NEG)} for _ in range(n)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(policy folder, tokenizer, pairs file, prompts file): a 2-layer gpt with the toy vocabulary."""
    folder = tmp_path_factory.mktemp("align")
    tok = tokenizer(folder, "gpt")
    model = body("gpt", tok)
    checkpoint.save(model, folder / "policy", tokenizer=tok)
    pairs = write_jsonl(folder / "pairs.jsonl", pair_rows(32))
    prompts = write_jsonl(folder / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pair_rows(16, seed=1)])
    return folder / "policy", tok, pairs, prompts


def config(out: Path, steps: int = 6, **changes):
    settings = dict(eval_every=0, save_every=steps, lr=1e-3, batch_size=4)
    settings.update(changes)
    return train_config(steps, **settings).updated({"out": str(out)})


def vowel_share(prompts, responses, rows) -> list[float]:
    """A dense toy reward: the share of vowels in the response (any random policy gets a signal from it)."""
    return [sum(c in "aeiou" for c in r) / max(len(r), 1) for r in responses]
