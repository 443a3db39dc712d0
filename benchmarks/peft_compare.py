"""PEFT against full fine-tuning on CPU: rt-sentiment with all-MiniLM-L6-v2 (via from-hf), one run per method.

    method   what trains (besides the new classifier head)             default LR, steps
    full     every weight (the finetune_quality.py "full" run)         5e-5, 400
    lora     LoRA r=8, alpha=16 on W_q, W_v (Hu et al. 2021)           1e-3, 800
    adapter  Houlsby adapters, bottleneck 32, after attention and FFN  1e-3, 800
    prefix   20 key/value prefixes per layer, trained directly         1e-2, 800
    prompt   a 20-token soft prompt, initialised from vocabulary rows  3e-2, 800
    ia3      (IA)^3 rescaling of keys, values and the FFN's activation 3e-3, 800
    bitfit   the biases of every linear and LayerNorm                  3e-3, 800
    qlora    (not by default) LoRA as above on an NF4 base             1e-3, 800
    mam      (not by default) prefix + parallel FFN adapter            1e-3, 800

Every run uses finetune_quality.py's settings (batch 16, 10% warmup then linear decay, bf16 autocast where the
CPU has it, length bucketing, best dev checkpoint every ``--eval-every`` steps, scored on the test split);
PEFT methods may use their own LR and up to twice the steps (``--lr``, ``--peft-steps``). The calibration
point: HF full fine-tuning reached 0.871, HF peft LoRA (r=8, alpha=16, q+v, lr 1e-3, 400 x 16) 0.850.
Target: LoRA within 1.5 points of full fine-tuning with < 1% trainable parameters.

Each method runs in a fresh subprocess, so its peak RSS (the kernel's VmHWM, the whole process: Python, the
model, training, dev evaluations) is its own; as in peft_memory.py the workers run with a fixed glibc mmap
threshold, so RSS follows live memory. Test accuracy is measured after the peak is read, by loading
``OUT/METHOD/best`` the way ``lmforge evaluate`` does (for PEFT: base folder + adapter + head). The wall time
is the training (with its dev evaluations); on a shared machine it is indicative only, and the CPU time (user +
system, all threads) of the same stretch is shown beside it.

Each run checkpoints every ``--save-every`` steps and writes ``OUT/METHOD/result.json`` at the end. ``--reuse``
takes a finished run's result from there when its settings match, and continues a run that was stopped (a
signal, a killed process) from its last checkpoint, exactly (lmforge's resume); its times and peak RSS then
add up over the processes it took. A long comparison on a shared machine can so be completed in sittings.

Output: one line per method, the target line, then one JSON line with every number::

    $ python benchmarks/peft_compare.py --out /tmp/peft-compare
    full     acc 0.8680  trainable 22,714,370 (100.000%)  train  190 s  peak RSS 1234 MB  (best dev 0.86 @ 400)
    lora     acc ...
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/peft_compare.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from benchmarks.common import peak_bytes  # noqa: E402
from benchmarks.finetune_quality import _config, _minilm  # noqa: E402

# method -> (default LR, PeftConfig fields or None for full fine-tuning)
METHODS = {
    "full": (5e-5, None),
    "lora": (1e-3, {"method": "lora", "r": 8, "alpha": 16, "targets": ["q", "v"]}),
    "adapter": (1e-3, {"method": "adapter", "adapter_dim": 32}),
    "prefix": (1e-2, {"method": "prefix", "num_virtual_tokens": 20, "prefix_projection": False}),
    "prompt": (3e-2, {"method": "prompt", "num_virtual_tokens": 20, "prompt_init": "vocab"}),
    "ia3": (3e-3, {"method": "ia3"}),
    "bitfit": (3e-3, {"method": "bitfit"}),
    "qlora": (1e-3, {"method": "qlora", "r": 8, "alpha": 16, "targets": ["q", "v"]}),
    "mam": (1e-3, {"method": "mam", "num_virtual_tokens": 20, "prefix_hidden": 128, "adapter_dim": 64}),
}
DEFAULT_RUNS = "full,lora,adapter,prefix,prompt,ia3,bitfit"
RESULT_FILE = "result.json"  # a finished run's numbers
SETTINGS_FILE = "settings.json"  # what the run in OUT/METHOD trains (a stopped run continues only if it matches)
SEGMENTS_FILE = "segments.json"  # time, CPU time and peak RSS of each process the run took


# ---------------------------------------------------------------------------------------- one run (a worker)
def worker(method: str, lr: float, args) -> dict | None:
    """Train and score one method; None when a signal stopped it (its checkpoint lets a later call continue)."""
    from lmforge.peft import PeftConfig
    from lmforge.tasks.finetune import finetune
    from lmforge.tasks.recipe import Recipe
    from lmforge.tasks.inference import evaluate
    from lmforge.tasks.spec import TaskSpec
    from lmforge.utils.io import atomic_write_text

    torch.set_num_threads(args.threads)
    peft = METHODS[method][1]
    settings = _settings(method, lr, args)
    out = Path(args.out) / method
    resume = _read(out / SETTINGS_FILE) == settings and (out / "checkpoints" / "latest").is_file()
    if not resume:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        atomic_write_text(out / SETTINGS_FILE, json.dumps(settings) + "\n")
    run_args = argparse.Namespace(**{**vars(args), "steps": settings["steps"]})  # finetune_quality's _config
    config = _config(run_args, lr, save_every=args.save_every, resume=resume)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    result = finetune(_minilm(), TaskSpec(task="classify", max_length=128), "rt-sentiment:train", "rt-sentiment:dev",
                      config=config, recipe=Recipe(bucket=args.bucket), out=out,
                      peft=PeftConfig.from_dict(peft) if peft else None,
                      log=lambda m: print(f"[{method}] {m}", file=sys.stderr, flush=True))
    # One segment per process: a run stopped by a signal continues in the next one from its checkpoint.
    segments = (_read(out / SEGMENTS_FILE) or []) if resume else []
    segments.append({"to_step": result.train.step, "train_s": round(time.perf_counter() - start, 1),
                     "cpu_s": round(_cpu_seconds() - cpu_start, 1), "peak_rss_mb": round(peak_bytes() / 2**20, 1)})
    atomic_write_text(out / SEGMENTS_FILE, json.dumps(segments) + "\n")
    if result.train.stopped_by in ("SIGINT", "SIGTERM"):
        return None
    scores = evaluate(out / "best", "rt-sentiment:test", batch_size=64, limit=args.test_limit)
    record = {"method": method, "settings": settings, "peft": peft, "lr": lr, "steps": result.train.step,
              "test_accuracy": scores["accuracy"], "test": scores, "best_dev": result.best,
              "trainable": result.params["trainable"], "total": result.params["total"],
              "trainable_pct": 100.0 * result.params["trainable"] / result.params["total"],
              "train_s": round(sum(g["train_s"] for g in segments), 1),
              "cpu_s": round(sum(g["cpu_s"] for g in segments), 1),
              "peak_rss_mb": max(g["peak_rss_mb"] for g in segments), "segments": len(segments)}
    atomic_write_text(out / RESULT_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _read(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _settings(method: str, lr: float, args) -> dict:
    """What makes two runs of a method the same run (for --reuse and for continuing a stopped one)."""
    keys = ("batch_size", "eval_every", "precision", "seed", "bucket", "test_limit", "threads")
    steps = args.steps if METHODS[method][1] is None else args.peft_steps
    return {"peft": METHODS[method][1], "lr": lr, "steps": steps, **{k: getattr(args, k) for k in keys}}


def reused(method: str, lr: float, args) -> dict | None:
    """The result of an earlier identical run of ``method`` under ``--out``, if there is one."""
    record = _read(Path(args.out) / method / RESULT_FILE)
    return record if record and record.get("settings") == _settings(method, lr, args) else None


def run_method(method: str, lr: float, args) -> dict:
    """Run one method in a fresh interpreter (its own peak RSS) and return its JSON result."""
    cmd = [sys.executable, __file__, "--worker", method, "--worker-lr", repr(lr), "--out", args.out,
           "--steps", str(args.steps), "--peft-steps", str(args.peft_steps), "--batch-size", str(args.batch_size),
           "--eval-every", str(args.eval_every), "--precision", args.precision, "--seed", str(args.seed),
           "--bucket", str(args.bucket), "--threads", str(args.threads), "--save-every", str(args.save_every)]
    if args.test_limit:
        cmd += ["--test-limit", str(args.test_limit)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")  # see peft_memory.py
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False, env=env)  # stderr: live progress
    last = done.stdout.strip().splitlines()[-1:] or ["null"]
    if done.returncode != 0 or json.loads(last[0]) is None:
        raise SystemExit(f"{method} run stopped (exit {done.returncode}); run again with --reuse to continue it from "
                         "its last checkpoint")
    return json.loads(last[0])


def line(r: dict) -> str:
    best = r["best_dev"] or {}
    parts = r.get("segments", 1)
    cpu = f" (cpu {r['cpu_s']:.0f} s{f', in {parts} processes' if parts > 1 else ''})" if "cpu_s" in r else ""
    return (f"{r['method']:<8} acc {r['test_accuracy']:.4f}  trainable {r['trainable']:>10,} "
            f"({r['trainable_pct']:7.3f}%)  lr {r['lr']:g} x {r['steps']} steps  train {r['train_s']:5.0f} s{cpu}  "
            f"peak RSS {r['peak_rss_mb']:5.0f} MB  "
            f"(best dev {best.get('value', float('nan')):.4f} @ {best.get('step')})")


def _lrs(values: list[str]) -> dict[str, float]:
    lrs = {}
    for value in values:
        method, sep, lr = value.partition("=")
        if not sep or method not in METHODS:
            raise SystemExit(f"--lr {value!r}: expected METHOD=LR with METHOD one of {', '.join(METHODS)}")
        lrs[method] = float(lr)
    return lrs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma-separated methods (default {DEFAULT_RUNS}; "
                        f"also: {', '.join(m for m in METHODS if m not in DEFAULT_RUNS.split(','))})")
    parser.add_argument("--lr", action="append", default=[], metavar="METHOD=LR", help="override a method's LR")
    parser.add_argument("--steps", type=int, default=400, help="full fine-tuning steps (default 400)")
    parser.add_argument("--peft-steps", type=int, default=800, help="PEFT steps (default 800: twice the budget)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket", type=int, default=50, help="length bucketing window in batches (0 = off)")
    parser.add_argument("--test-limit", type=int, default=None, help="score the first N test rows only")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run (default 2)")
    parser.add_argument("--out", default="/tmp/lmforge-peft-compare")
    parser.add_argument("--reuse", action="store_true",
                        help="take a method's result from OUT/METHOD/result.json when an identical run finished")
    parser.add_argument("--save-every", type=int, default=100,
                        help="checkpoint every N steps, so that a stopped run continues from there (default 100)")
    parser.add_argument("--worker", choices=tuple(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--worker-lr", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.worker_lr, args)), flush=True)
        return 0

    lrs = {m: lr for m, (lr, _) in METHODS.items()} | _lrs(args.lr)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in runs if r not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    print(f"rt-sentiment, all-MiniLM-L6-v2, batch {args.batch_size}, precision {args.precision}, "
          f"{args.threads} threads, torch {torch.__version__}", flush=True)
    results = {}
    for method in runs:
        earlier = reused(method, lrs[method], args) if args.reuse else None
        results[method] = earlier or run_method(method, lrs[method], args)
        print(line(results[method]) + ("  [reused]" if earlier else ""), flush=True)
    summary = {"benchmark": "peft_compare", "runs": results}
    if {"full", "lora"} <= set(results):
        gap = 100 * (results["lora"]["test_accuracy"] - results["full"]["test_accuracy"])
        pct = results["lora"]["trainable_pct"]
        ok = gap >= -1.5 and pct < 1.0
        print(f"LoRA - full = {gap:+.1f} points with {pct:.2f}% trainable parameters "
              f"(target: >= -1.5 points, < 1%) {'OK' if ok else 'MISSED'}", flush=True)
        summary.update(lora_minus_full_points=round(gap, 2), lora_trainable_pct=round(pct, 4), target_met=ok)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
