"""How long the command line takes to answer ``--help``, against ``python -c "import torch"``.

``lmforge --help`` lists the verbs from the verb table (``lmforge.cli._verbs``) without importing a verb module;
``lmforge finetune --help`` imports only finetune's module (which still imports torch, but neither scikit-learn,
scipy, sympy nor pandas). Each command is a fresh process, timed from start to exit; the three take turns
(rotating the order each round) so a busy host slows them alike, and each ratio is a median over the same rounds
against the median of ``import torch``. The first round of each is a warm-up (untimed): the page cache then holds
the same files for all three.

Usage:
    python benchmarks/cli_startup.py              # 5 timed rounds
    python benchmarks/cli_startup.py --quick      # 3 timed rounds

Output: one line per command (median and range of seconds, ratio to import torch), then one JSON line.
Target: each ratio at most 0.3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import run_interleaved, src_env  # noqa: E402

TARGET = 0.3


def lmforge_command() -> list[str]:
    """The installed ``lmforge`` script beside this interpreter (what a user types), else ``python -m``."""
    script = Path(sys.executable).with_name("lmforge")
    if script.is_file():
        return [str(script)]
    found = shutil.which("lmforge")
    return [found] if found else [sys.executable, "-m", "lmforge.cli.main"]


def commands() -> dict[str, list[str]]:
    lmforge = lmforge_command()
    return {"lmforge --help": [*lmforge, "--help"],
            "lmforge finetune --help": [*lmforge, "finetune", "--help"],
            "import torch": [sys.executable, "-c", "import torch"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="3 timed rounds")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    env = src_env(OMP_NUM_THREADS="1")  # this checkout's lmforge, whichever the script would find
    todo = commands()

    def step(command: list[str]):
        def run() -> None:
            subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return run

    steps = [step(c) for c in todo.values()]
    for run in steps:  # warm-up: the page cache holds each one's files before any is timed
        run()
    # The load average, not run_watched's share of other processes: the timed work runs in child processes,
    # which that share would count as others.
    load_start = os.getloadavg()[0]
    times, _ = run_interleaved(steps, repeats=repeats, rotate=True)
    seconds = dict(zip(todo, times))
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    torch_s = medians["import torch"]
    ratios = {name: medians[name] / torch_s for name in todo if name != "import torch"}
    load = os.getloadavg()[0]
    for name in todo:
        ratio = f", {ratios[name]:.3f}x import torch" if name in ratios else ""
        print(f"{name:24s} median {medians[name]:.3f} s (min {min(seconds[name]):.3f}, max "
              f"{max(seconds[name]):.3f}){ratio}")
    met = all(r <= TARGET for r in ratios.values())
    print(f"target each <= {TARGET}x import torch: {'met' if met else 'NOT met'} ({repeats} rounds, 1-minute load "
          f"average {load_start:.2f} at the start, {load:.2f} at the end, on {os.cpu_count()} cores)")
    print(json.dumps({"benchmark": "cli_startup", "repeats": repeats, "command": todo["lmforge --help"][:-1],
                      "seconds": seconds, "median_s": medians,
                      "help_over_import_torch": ratios["lmforge --help"],
                      "finetune_help_over_import_torch": ratios["lmforge finetune --help"],
                      "load_average_1min": [load_start, load], "target": TARGET, "met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
