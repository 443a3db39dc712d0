"""What the price tag costs a training run: the time spent in its per-step accounting, and its one-off FLOP check.

A real ``Trainer`` pre-trains ``gpt-tiny`` (causal LM, batch 8 × 128, bf16 autocast where the CPU has native bf16,
else fp32) on the bundled corpus for ``--steps`` steps. Every call the loop makes into the price tag
(``step_flops``, ``rank_values``, ``add``, ``record``: the analytic FLOPs of the step, the clock and energy
counters, the running totals, the metrics fields) is timed with ``perf_counter`` from inside the same process, so
the ratio below is measured on the same steps it is a share of: a busy host slows both sides alike.

The first step differs: it runs under ``torch.utils.flop_counter.FlopCounterMode`` once, to check the analytic
count. Its extra time (the first step's time minus the median step, an upper bound: the first step also warms
the allocator) is reported as a share of a 1,000-step run.

Usage:
    python benchmarks/price_tag_overhead.py             # 60 steps
    python benchmarks/price_tag_overhead.py --quick     # 12 steps

Output: the per-step accounting share, the one-off share, then one JSON line. Target: under 1% per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import prepared_corpus, train_precision  # noqa: E402

import torch  # noqa: E402

from lmforge.training import TrainConfig  # noqa: E402
from lmforge.training.pretrain import build_pretraining  # noqa: E402

ACCOUNTING = ("step_flops", "rank_values", "add", "record")
TARGET = 0.01


def timed_methods(obj, names: tuple[str, ...], spent: dict[str, float]) -> None:
    """Wrap ``obj``'s methods ``names`` so that every call adds its seconds to ``spent[name]``."""
    for name in names:
        method = getattr(obj, name)
        spent[name] = 0.0

        def wrapper(*args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - start

        setattr(obj, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="training steps (default 60; 12 with --quick)")
    p.add_argument("--quick", action="store_true", help="12 steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    args = p.parse_args(argv)
    steps = args.steps or (12 if args.quick else 60)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = prepared_corpus(root, 200_000, 2000)
        config = TrainConfig.from_dict(dict(
            model="gpt-tiny", objective="clm", data=str(data), out=str(root / "run"), max_steps=steps,
            batch_size=8, seq_len=128, warmup=2, eval_every=0, save_every=0, precision=train_precision(),
            progress=False, tensorboard=False, device="cpu"))
        trainer = build_pretraining(config).trainer
        spent: dict[str, float] = {}
        timed_methods(trainer.price_tag, ACCOUNTING, spent)
        step_times: list[float] = []
        original = trainer.train_step

        def train_step():
            start = time.perf_counter()
            try:
                return original()
            finally:
                step_times.append(time.perf_counter() - start)

        trainer.train_step = train_step
        began = time.perf_counter()
        trainer.fit()
        loop = time.perf_counter() - began
    total = sum(spent.values())
    per_step = total / steps
    median = statistics.median(step_times[1:])
    share = total / loop
    first_extra = max(step_times[0] - median, 0.0)
    one_off = first_extra / (first_extra + 1000 * median)
    print(f"price tag accounting: {per_step * 1e6:,.0f} us per step, {share:.3%} of the loop "
          f"({steps} steps of gpt-tiny, batch 8 x 128, median step {median * 1e3:.1f} ms, {args.threads} thread(s)); "
          f"target under {TARGET:.0%}: {'met' if share < TARGET else 'NOT met'}")
    print("per call: " + ", ".join(f"{name} {seconds / steps * 1e6:,.0f} us" for name, seconds in spent.items()))
    print(f"one-off FLOP check (first step under FlopCounterMode): +{first_extra * 1e3:.0f} ms at most, "
          f"{one_off:.3%} of a 1,000-step run")
    print(json.dumps({"benchmark": "price_tag_overhead", "steps": steps, "threads": args.threads,
                      "accounting_s": total, "by_method_s": spent, "loop_s": loop, "accounting_share": share,
                      "accounting_us_per_step": per_step * 1e6, "median_step_s": median,
                      "first_step_extra_s": first_extra, "one_off_share_1000_steps": one_off,
                      "target": TARGET, "met": share < TARGET}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
