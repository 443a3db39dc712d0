"""Tiny grids for the experiment-runner tests: a 1-layer, d_model 32 decoder on prepared Austen shards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from lmforge.cli.main import main

TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}
WALL_CLOCK = ("seconds",)


def grid_text(data: Path, axes: list[dict], seeds=(0, 1), steps: int = 20, **extra) -> str:
    """A pretrain grid over ``data`` with ``axes``; ``extra`` adds or replaces grid fields."""
    grid = {
        "command": "pretrain",
        "settings": {"model": "gpt-tiny", "objective": "clm", "data": str(data), "overrides": dict(TINY),
                     "seq_len": 32, "batch_size": 2, "eval_every": steps, "eval_batches": 2, "save_every": 2,
                     "precision": "fp32", "device": "cpu", "lr": 3e-3, "warmup": 2},
        "axes": axes, "seeds": list(seeds), "budget": {"steps": steps},
        "metrics": ["eval_loss", "eval_ppl"], **extra,
    }
    return yaml.safe_dump(grid, sort_keys=False)


POSITION_AXIS = {"name": "pos", "variants": [{"overrides": {"position": "rope"}},
                                             {"overrides": {"position": "alibi"}}]}
LR_AXIS = {"name": "lr", "variants": [{"name": "low", "lr": 1e-3}, {"name": "high", "lr": 3e-3}]}


def write_grid(folder: Path, text: str, name: str = "grid.yaml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(*args) -> int:
    return main(["experiment", "run", *map(str, args)])


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def comparable(out: Path) -> list[dict]:
    """The result rows without wall-clock fields and the thread count."""
    return [{k: v for k, v in r.items() if k not in (*WALL_CLOCK, "threads")} for r in rows(out)]


def tree_state(folder: Path) -> dict[str, tuple[int, str]]:
    """mtime and sha256 of every file under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}
