"""Mixture of experts against the dense model of equal active compute, at equal training FLOPs.

Two runs of ``lmforge pretrain`` (causal LM) on the same shards, tokenizer, batches, schedule and seed:

    dense  gpt-tiny        6 layers x 384, d_ff 1536
    moe    gpt-tiny-moe    the same, with 8 Switch experts (top-1, capacity factor 1.25) in every other layer

Top-1 routing makes each token multiply exactly the weights of one expert, so both models cost the same
training FLOPs per token (``Transformer.flops_per_token`` counts active weights: the MoE model's extra is its
three 384 x 8 routers, 0.06%); equal steps of equal batches are then equal training FLOPs. The MoE model holds
~2.8x the parameters. The Switch paper (Fedus et al. 2021, fig. 1 and table 1) reports a large quality gain per
FLOP; this measures what the tiny scale shows.

Reported per run: the validation loss curve against training FLOPs, tokens/s (whole run, evaluation excluded
from the rate by the trainer's log) and, for the MoE run, load balance at the end (expert load histogram,
E x largest share, dropped-slot share, aux loss); and the MoE/dense tokens/s ratio (the routing overhead
budget: at least 0.6).

Usage:
    python benchmarks/moe_vs_dense.py --work /tmp/moe --steps 2000      # the shared corpus, both runs
    python benchmarks/moe_vs_dense.py --work /tmp/moe --quick           # a few steps of toy models

Output: a line per run, a plot (WORK/moe_vs_dense.png, when matplotlib is installed) and one JSON line with
every number.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "corpus"
RUNS = {"dense": "gpt-tiny", "moe": "gpt-tiny-moe"}
QUICK = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


def lmforge(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "lmforge.cli.main", *args], check=True, stdout=subprocess.DEVNULL)


def corpus(work: Path, quick: bool) -> Path:
    """The shared corpus; the package's Austen sample (60 kB of it with --quick) where that is absent."""
    if SHARED.exists() and not quick:
        return SHARED
    from lmforge import datasets

    text = work / "corpus.txt"
    if not text.is_file():
        raw = gzip.decompress(datasets.path("corpus").read_bytes()).decode("utf-8")
        text.write_text(raw[:60_000] if quick else raw, encoding="utf-8")
    return text


def prepared(work: Path, quick: bool) -> Path:
    data = work / "data"
    if not (data / "manifest.json").is_file():
        source = corpus(work, quick)
        lmforge("tokenizer", "train", "--kind", "byte-bpe", "--family", "gpt", "--vocab-size",
                "300" if quick else "8192", "--out", str(work / "tokenizer"), "--no-progress", str(source))
        lmforge("data", "prepare", "--tokenizer", str(work / "tokenizer"), "--out", str(data), "--val-fraction",
                "0.1" if quick else "0.01", "--no-progress", str(source))
    return data


def flops_per_token(preset: str, seq_len: int, overrides: dict) -> int:
    import torch

    from lmforge.config import ModelConfig
    from lmforge.models import Transformer

    with torch.device("meta"):
        return Transformer(ModelConfig.from_preset(preset, **overrides)).flops_per_token(seq_len)


def run(work: Path, name: str, data: Path, args) -> dict:
    preset = RUNS[name]
    overrides = {**(QUICK if args.quick else {}), "dropout": 0.0}
    out = work / name
    command = ["pretrain", "--model", preset, "--objective", "clm", "--data", str(data), "--out", str(out),
               "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
               "--lr", str(args.lr), "--warmup", str(max(1, args.steps // 20)), "--schedule", "cosine",
               "--eval-every", str(max(1, args.steps // 10)), "--eval-batches", str(args.eval_batches),
               "--save-every", str(args.steps), "--seed", "0", "--no-progress", "--no-tensorboard",
               "--precision", "fp32" if args.quick else "auto"]
    for key, value in overrides.items():
        command += ["--override", f"{key}={value}"]
    begun = time.perf_counter()
    lmforge(*command)
    wall = time.perf_counter() - begun
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_token = flops_per_token(preset, args.seq_len, {k: v for k, v in overrides.items() if k != "dropout"})
    seen, curve = 0, []
    for r in records:
        seen += r.get("tokens", 0)
        if "eval_loss" in r:
            curve.append((r["step"], seen * per_token, r["eval_loss"]))
    last = records[-1]
    result = {"run": name, "preset": preset, "steps": args.steps, "wall_s": round(wall, 1),
              "flops_per_token": per_token, "train_flops": seen * per_token, "tokens": seen,
              "tokens_per_s": last.get("tokens_per_s"), "eval_curve": curve, "end_eval_loss": curve[-1][2]}
    if "moe_load" in last:
        result.update({k: last[k] for k in ("moe_load", "moe_load_max", "moe_dropped", "moe_aux_loss")})
    return result


def plot(results: list[dict], path: Path) -> bool:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r in results:
        ax.plot([c[1] for c in r["eval_curve"]], [c[2] for c in r["eval_curve"]], "o-", markersize=3,
                label=f"{r['run']} ({r['preset']})")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the tokenizer, shards and both runs")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps of each run (default: 2000)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step (default: 32)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of both runs (default: 1e-3)")
    parser.add_argument("--eval-batches", type=int, default=10, help="validation batches per evaluation")
    parser.add_argument("--quick", action="store_true",
                        help="toy models (2 layers x 32) on 60 kB of the package corpus, for a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch_size, args.seq_len, args.eval_batches = min(args.steps, 4), 2, 32, 1
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepared(args.work, args.quick)
    results = [run(args.work, name, data, args) for name in RUNS]
    dense, moe = results
    for r in results:
        balance = (f", load max {r['moe_load_max']:.2f}, dropped {r['moe_dropped']:.3f}" if "moe_load" in r else "")
        print(f"{r['run']:<6} {r['preset']:<13} {r['train_flops']:.3g} FLOPs  eval loss {r['end_eval_loss']:.4f}  "
              f"{r['tokens_per_s']} tok/s{balance}")
    ratio = moe["tokens_per_s"] / dense["tokens_per_s"] if dense["tokens_per_s"] else None
    plotted = plot(results, args.work / "moe_vs_dense.png")
    print(json.dumps({"benchmark": "moe_vs_dense", "runs": results, "moe_over_dense_tokens_per_s": ratio,
                      "plot": str(args.work / "moe_vs_dense.png") if plotted else None}))


if __name__ == "__main__":
    main()
