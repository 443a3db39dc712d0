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

Usage:
    python benchmarks/inference_price_overhead.py            # 15 repeats
    python benchmarks/inference_price_overhead.py --quick    # 5 repeats

Output: one line per workload, then one JSON line. Target: under 1% of the command's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=None, help="pairs of runs (default 15; 5 with --quick)")
    p.add_argument("--quick", action="store_true", help="5 repeats")
    p.add_argument("--new-tokens", type=int, default=64, help="decode: tokens to generate (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    args = p.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 15)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny").eval()
    V = model.config.vocab_size
    prompt = torch.randint(0, V, (1, 16))
    batch = torch.randint(0, V, (8, 128))
    workloads = {
        "decode": lambda: model.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True),
        "score": lambda: model(batch),
    }
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
