"""What the experiment runner costs a cell: its wall time against the training steps it ran.

A one-cell grid (``gpt-tiny`` causal LM on the bundled corpus, evaluated once, after its last step) is run by
``lmforge experiment run`` in a process of its own, timed from the command's start to its end: the runner's
start-up, the cell's process, imports, data and model loading, the stage's final evaluation and the writing of
results. Against it: the training loop's own seconds, read from the cell's ``metrics.jsonl`` (``wall_s`` of its
last step, the price tag's loop clock). The overhead is the rest, as a share of the command's time; the issue's
budget is under 10% of a 2-minute cell, so ``--steps`` is chosen for about two minutes on a 2-core CPU.

Usage:
    python benchmarks/experiment_overhead.py              # about 2 minutes of training
    python benchmarks/experiment_overhead.py --steps 20   # a short check

Output: the two times, the share, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(ROOT))
from benchmarks.common import prepared_corpus, src_env  # noqa: E402
from lmforge.training.logging import read_metrics  # noqa: E402

BUDGET = 0.10

GRID = """command: pretrain
description: one cell, for timing the runner
settings:
  model: gpt-tiny
  objective: clm
  data: {data}
  overrides: {{n_layers: 2, d_model: 128, n_heads: 4, d_ff: 512, max_seq_len: 128, dropout: 0.0}}
  seq_len: 128
  batch_size: 8
  lr: 1.0e-3
  warmup: 5
  eval_every: {steps}
  eval_batches: 10
  save_every: 0
axes:
  - name: position
    variants:
      - {{name: rope, overrides: {{position: rope}}}}
seeds: [0]
budget: {{steps: {steps}}}
metrics: [eval_loss]
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2600, help="training steps of the cell (default %(default)s)")
    args = p.parse_args(argv)
    env = src_env()
    lmforge = [sys.executable, "-m", "lmforge.cli.main"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = prepared_corpus(work, 400_000, 2000)
        (work / "grid.yaml").write_text(GRID.format(data=data, steps=args.steps), encoding="utf-8")
        start = time.perf_counter()
        proc = subprocess.run(lmforge + ["experiment", "run", str(work / "grid.yaml"), "--out", str(work / "exp"),
                                         "--threads", "2"], env=env, capture_output=True, text=True)
        command_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"the experiment failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        metrics = sorted((work / "exp").rglob("metrics.jsonl"))
        loop_s = read_metrics(metrics[0])[-1]["wall_s"]
    overhead = command_s - loop_s
    load = os.getloadavg()[0]
    share = overhead / command_s
    print(f"lmforge experiment run, one cell of {args.steps} steps: {command_s:.1f} s; its training steps "
          f"{loop_s:.1f} s; runner and cell overhead {overhead:.1f} s = {share:.1%} of the cell "
          f"(budget under {BUDGET:.0%}: {'met' if share < BUDGET else 'NOT met'}); load average {load:.1f}")
    print(json.dumps({"benchmark": "experiment_overhead", "steps": args.steps, "command_s": command_s,
                      "loop_s": loop_s, "overhead_s": overhead, "overhead_share": share, "budget": BUDGET,
                      "met": share < BUDGET, "load_average": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
