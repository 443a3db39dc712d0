"""Mixture of experts against the dense model of equal active compute: tokens/s side by side, and (with
``--work``) validation loss at equal training FLOPs.

    dense  gpt-tiny        6 layers x 384, d_ff 1536
    moe    gpt-tiny-moe    the same, with 8 Switch experts (top-1, capacity factor 1.25) in every other layer

Top-1 routing makes each token multiply exactly the weights of one expert, so both models cost the same
training FLOPs per token (``Transformer.flops_per_token`` counts active weights: the MoE model's extra is its
three 384 x 8 routers, 0.06%). The MoE model holds ~2.8x the parameters. The Switch paper (Fedus et al. 2021,
fig. 1 and table 1) reports a large quality gain per FLOP.

**Speed** (the default; ``lmforge bench`` runs it): training steps (forward, loss with the router losses,
backward, fused AdamW) of both models on the same random batch of 8 x 128 tokens, in fp32 and under bf16
autocast, one thread (``--threads``), interleaved and rotated after a warm-up, median of ``--repeats``. The
MoE/dense tokens/s ratio is the routing overhead budget: at least 0.6. What the MoE step pays beyond the dense
one: the router, sorting the token slots by expert and scattering them back, grouped GEMMs of ~T/E rows per
expert instead of one GEMM (on a CPU in bf16, each expert's rows padded to whole blocks of 32), and AdamW (and,
under autocast, the bf16 weight casts) over ~2.8x the parameters.

**Quality** (``--work DIR``): two runs of ``lmforge pretrain`` (causal LM) on the same shards, tokenizer, batches,
schedule and seed; equal steps of equal batches are then equal training FLOPs. Reported per run: the validation
loss curve against training FLOPs, tokens/s (whole run, evaluation excluded from the rate by the trainer's log)
and, for the MoE run, load balance at the end (expert load histogram, E x largest share, dropped-slot share,
aux loss).

Usage:
    python benchmarks/moe_vs_dense.py                                   # speed: tokens/s, fp32 and bf16
    python benchmarks/moe_vs_dense.py --quick                           # speed: fp32 only, 3 repeats
    python benchmarks/moe_vs_dense.py --work /tmp/moe --steps 2000      # quality: the shared corpus, both runs
    python benchmarks/moe_vs_dense.py --work /tmp/moe --quick           # quality: a few steps of toy models

Output: a line per measurement, (quality) a plot (WORK/moe_vs_dense.png, when matplotlib is installed), and one
JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data" / "corpus"
RUNS = {"dense": "gpt-tiny", "moe": "gpt-tiny-moe"}
BUDGET = 0.6  # MoE tokens/s over dense at equal active parameters: the routing overhead budget
QUICK = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


def lmforge(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "lmforge.cli.main", *args], check=True, stdout=subprocess.DEVNULL)


def corpus(work: Path, quick: bool) -> Path:
    """The shared corpus; the package's Austen sample (60 kB of it with --quick) where that is absent."""
    if SHARED.exists() and not quick:
        return SHARED
    from benchmarks.common import corpus_text

    text = work / "corpus.txt"
    if not text.is_file():
        raw = corpus_text()
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
    from lmforge.training.logging import read_metrics

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
    records = read_metrics(out / "metrics.jsonl")
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
    from lmforge.utils.figures import figure  # matplotlib is one of lmforge's own dependencies
    fig = figure(7, 4)
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


def speed(args) -> dict:
    """Training steps of the dense and the MoE model, interleaved: tokens/s of each and their ratio per precision."""
    import torch

    from benchmarks.common import time_steps
    from benchmarks.train_step import make_step, train_device
    from lmforge.config import ModelConfig
    from lmforge.models import Transformer

    device = train_device()
    torch.set_num_threads(args.threads)
    tokens = args.batch_size * args.seq_len
    results = []
    print(f"training step (forward, loss, backward, fused AdamW), batch {args.batch_size} x {args.seq_len}, "
          f"{device}, {torch.get_num_threads()} threads, median of {args.repeats}")
    for precision in args.precisions.split(","):
        torch.manual_seed(0)
        shape = {**(QUICK if args.toy else {}), "max_seq_len": args.seq_len, "dropout": 0.0}
        models = {name: Transformer(ModelConfig.from_preset(preset, **shape)) for name, preset in RUNS.items()}
        ids = torch.randint(0, models["dense"].config.vocab_size, (args.batch_size, args.seq_len + 1))
        batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
        steps = [make_step(m, batch, device, None, bf16=precision == "bf16") for m in models.values()]
        (dense_s, _), (moe_s, _) = time_steps(steps, device, warmup=args.warmup, repeats=args.repeats, rotate=True)
        row = {"precision": precision, "dense_tok_s": tokens / dense_s, "moe_tok_s": tokens / moe_s,
               "ratio": dense_s / moe_s,
               "dense_parameters": sum(p.numel() for p in models["dense"].parameters()),
               "moe_parameters": sum(p.numel() for p in models["moe"].parameters()),
               "dense_flops_per_token": models["dense"].flops_per_token(args.seq_len),
               "moe_flops_per_token": models["moe"].flops_per_token(args.seq_len)}
        results.append(row)
        print(f"{precision:<5} dense {RUNS['dense']} {row['dense_tok_s']:8,.0f} tok/s  moe {RUNS['moe']} "
              f"{row['moe_tok_s']:8,.0f} tok/s  ratio {row['ratio']:.2f}x (budget 0.60x)", flush=True)
        del models, steps
    return {"benchmark": "moe_vs_dense", "mode": "speed", "device": device, "batch_size": args.batch_size,
            "seq_len": args.seq_len, "repeats": args.repeats, "threads": torch.get_num_threads(), "budget": BUDGET,
            "results": results}


def quality(args) -> dict:
    """Both pretrain runs at equal training FLOPs: loss curves, whole-run tokens/s, load balance."""
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
    return {"benchmark": "moe_vs_dense", "mode": "quality", "runs": results, "moe_over_dense_tokens_per_s": ratio,
            "plot": str(args.work / "moe_vs_dense.png") if plotted else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None,
                        help="run the quality comparison (two pretrain runs) in this folder (tokenizer, shards, "
                             "runs); without it, measure training-step tokens/s only")
    parser.add_argument("--steps", type=int, default=2000, help="quality: optimizer steps of each run (default: 2000)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sequences per step (default: 8 for speed, 32 for quality)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128)")
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="quality: peak learning rate of both runs (default: 1e-3)")
    parser.add_argument("--eval-batches", type=int, default=10, help="quality: validation batches per evaluation")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="speed: comma-separated fp32 and/or bf16 (autocast) (default: fp32,bf16)")
    parser.add_argument("--repeats", type=int, default=5, help="speed: timed steps per model (median; default 5)")
    parser.add_argument("--threads", type=int, default=1,
                        help="speed: torch threads (default 1: on a shared CPU a second thread spin-waits at every "
                             "barrier, which slows the many small expert GEMMs most)")
    parser.add_argument("--warmup", type=int, default=1, help="speed: untimed steps per model first (default 1)")
    parser.add_argument("--toy", action="store_true", help="speed: the toy shape (2 layers x 32), for a smoke test")
    parser.add_argument("--quick", action="store_true",
                        help="speed: fp32 only, 3 repeats; quality: toy models (2 layers x 32) on 60 kB of the "
                             "package corpus, for a smoke test")
    args = parser.parse_args()
    if args.work is None:
        args.batch_size = args.batch_size or 8
        if args.quick:
            args.precisions, args.repeats = "fp32", min(args.repeats, 3)
        print(json.dumps(speed(args)))
        return
    args.batch_size = args.batch_size or 32
    if args.quick:
        args.steps, args.batch_size, args.seq_len, args.eval_batches = min(args.steps, 4), 2, 32, 1
    print(json.dumps(quality(args)))


if __name__ == "__main__":
    main()
