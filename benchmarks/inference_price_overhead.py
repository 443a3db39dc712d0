"""What the inference price tag costs a command: the same work with and without an open ``InferenceTag``.

Two workloads on a random ``gpt-tiny`` (the default preset), CPU, in one process:

- ``decode``: greedy generation of ``--new-tokens`` tokens after a 16-token prompt, batch 1 (many small
  forwards: the worst case for a per-forward hook);
- ``score``: one forward over a batch of 8 x 128 tokens (``evaluate``/``embed``-like).

Each repeat runs the workload once without and once with the tag, in alternating order, so a busy host slows
both sides alike; the medians are compared. The time spent inside the hooks is also timed from inside the same
calls (``perf_counter``), as a share of the tagged time: the direct measure, less noisy than a difference of
medians. The process's CPU time (``time.process_time``) is compared too: on a shared host it moves less than
the wall time. The tag's opening and closing (one clock and energy read each) is included on the tagged side.

Wall and CPU times move by several percent on a shared host, more than the 1% asked of the tag. ``--instructions``
measures instead what load cannot move: the instructions executed, counted by valgrind's callgrind (instructions,
not seconds: repeatable for one binary and input whatever else runs). Each workload runs in its own process with
and without the tag, once with 1 and once with 3 repetitions; the difference of the two counts is two
repetitions' instructions with interpreter start-up and warm-up cancelled, and the tag's overhead is the ratio of
those differences. Slow (valgrind runs ~50x slower): minutes.

Usage:
    python benchmarks/inference_price_overhead.py                  # 15 repeats, wall and CPU time
    python benchmarks/inference_price_overhead.py --quick          # 5 repeats
    python benchmarks/inference_price_overhead.py --instructions   # instruction counts (needs valgrind)

Output: one line per workload, then one JSON line. Target: under 1% of the command's time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import lmforge  # noqa: E402
from lmforge.cost import inference  # noqa: E402

TARGET = 0.01


def hook_timer(spent: list[float]):
    """Wrap the module's two hooks so every call adds its seconds to ``spent[0]``."""
    for name in ("_enter_model", "_after_model", "_after_stack"):
        original = getattr(inference, name)

        def wrapper(*args, _original=original):
            start = time.perf_counter()
            try:
                return _original(*args)
            finally:
                spent[0] += time.perf_counter() - start

        setattr(inference, name, wrapper)


# --instructions also runs a smaller model: the tag's cost is per forward, not per FLOP, so a smaller model makes
# its share larger (a worst case). Its score batch is smaller too (valgrind runs ~50x slower).
SMALL = {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512}


def _workloads(new_tokens: int, small: bool = False):
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", **(SMALL if small else {})).eval()
    V = model.config.vocab_size
    prompt = torch.randint(0, V, (1, 16))
    batch = torch.randint(0, V, (2, 64) if small else (8, 128))
    return model, {
        "decode": lambda: model.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True),
        "score": lambda: model(batch),
    }


def run_once(workload: str, tag: bool, times: int, new_tokens: int, small: bool) -> None:
    """One process's work for ``--instructions``: warm up, then ``times`` repetitions, tagged or not."""
    torch.set_num_threads(1)
    model, workloads = _workloads(new_tokens, small=small)
    work = workloads[workload]
    settings = inference.PriceSettings.resolve("cpu")
    with torch.no_grad():
        work()
        for _ in range(times):
            if tag:
                with inference.InferenceTag(settings, command=workload).watch(model):
                    work()
            else:
                work()


def _instructions(args: list[str]) -> int:
    """Instructions executed by ``python THIS_FILE ARGS`` under callgrind (its ``summary:`` line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r"(summary|totals): (\d+)", line)
                if m:
                    return int(m.group(2))
    raise RuntimeError("callgrind wrote no summary line")


def count_instructions(new_tokens: int) -> int:
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    result = {"benchmark": "inference_price_overhead", "mode": "instructions", "small": SMALL,
              "new_tokens": new_tokens, "workloads": {}}
    # decode is the tag's worst case (a forward per token); score's one forward is timed by the default mode
    for name, size in (("decode", "small"), ("decode", "gpt-tiny"), ("score", "small")):
        counts = {}
        for tag in ("off", "on"):
            for times in (1, 3):
                counts[tag, times] = _instructions(["--one", name, "--tag", tag, "--times", str(times),
                                                    "--new-tokens", str(new_tokens), "--size", size])
        name = f"{name} ({size})"
        plain = counts["off", 3] - counts["off", 1]
        tagged = counts["on", 3] - counts["on", 1]
        row = {"instructions_without": plain / 2, "instructions_with": tagged / 2, "overhead": tagged / plain - 1}
        result["workloads"][name] = row
        print(f"{name:18s} instructions per run: without {plain / 2:.4g}  with {tagged / 2:.4g}  "
              f"overhead {row['overhead']:+.3%}")
    result["within_target"] = all(w["overhead"] < TARGET for w in result["workloads"].values())
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=None, help="pairs of runs (default 15; 5 with --quick)")
    p.add_argument("--quick", action="store_true", help="5 repeats")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="decode: tokens to generate (default 64; 16 with --instructions)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions under valgrind's callgrind instead of timing (load-independent)")
    p.add_argument("--one", choices=("decode", "score"), help=argparse.SUPPRESS)  # one --instructions process
    p.add_argument("--tag", choices=("on", "off"), default="off", help=argparse.SUPPRESS)
    p.add_argument("--times", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--size", choices=("small", "gpt-tiny"), default="small", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.new_tokens is None:
        args.new_tokens = 16 if (args.instructions or args.one) else 64
    if args.one:
        run_once(args.one, args.tag == "on", args.times, args.new_tokens, args.size == "small")
        return 0
    if args.instructions:
        return count_instructions(args.new_tokens)
    repeats = args.repeats or (5 if args.quick else 15)
    torch.set_num_threads(args.threads)
    model, workloads = _workloads(args.new_tokens)
    spent = [0.0]
    hook_timer(spent)
    settings = inference.PriceSettings.resolve("cpu")
    result = {"benchmark": "inference_price_overhead", "repeats": repeats, "threads": args.threads,
              "model": "gpt-tiny", "new_tokens": args.new_tokens, "workloads": {}}
    with torch.no_grad():
        for name, work in workloads.items():
            work()  # warm-up: allocator, kernels
            plain, tagged, hooks, cpu = [], [], [], {False: [], True: []}
            for r in range(repeats):
                for with_tag in ((False, True) if r % 2 == 0 else (True, False)):
                    spent[0] = 0.0
                    cpu_start = time.process_time()
                    start = time.perf_counter()
                    if with_tag:
                        with inference.InferenceTag(settings, command=name).watch(model):
                            work()
                    else:
                        work()
                    seconds = time.perf_counter() - start
                    cpu[with_tag].append(time.process_time() - cpu_start)
                    (tagged if with_tag else plain).append(seconds)
                    if with_tag:
                        hooks.append(spent[0] / seconds)
            a, b = statistics.median(plain), statistics.median(tagged)
            ca, cb = statistics.median(cpu[False]), statistics.median(cpu[True])
            row = {"median_s_without": a, "median_s_with": b, "overhead": b / a - 1,
                   "median_cpu_s_without": ca, "median_cpu_s_with": cb, "cpu_overhead": cb / ca - 1,
                   "hook_share": statistics.median(hooks)}
            result["workloads"][name] = row
            print(f"{name:7s} without {a * 1e3:8.2f} ms  with {b * 1e3:8.2f} ms  overhead {row['overhead']:+.2%}  "
                  f"(CPU time {row['cpu_overhead']:+.2%})  time in the hooks {row['hook_share']:.2%}  "
                  f"(medians of {repeats})")
    result["within_target"] = all(w["hook_share"] < TARGET for w in result["workloads"].values())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
