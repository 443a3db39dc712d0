"""Length extrapolation of six position schemes: gpt-tiny trained at one length, read at longer ones.

"Relative positions generalise to longer sequences; sinusoidal extrapolation doesn't really work" (the decks,
after Press et al. 2022, ALiBi, Figure 1). Six runs of ``lmforge pretrain`` (causal LM) on the same shards,
tokenizer, batches, schedule and seed, differing only in ``position``:

    sinusoidal  learned  relative (Shaw, k=16)  rope  t5-bias  alibi

each trained at ``--train-len`` (128) and then scored by ``lmforge evaluate --seq-len N`` at every N of
``--lengths`` (128, 256, 512, 1024) on the first ``--blocks`` blocks of the corpus text: the loss over all N
positions, and over the positions beyond the training length alone. (The text is the training corpus: what is
compared is one model at several lengths, not held-out generalisation.) A learned table cannot be read past its length: its cells are
"refused", with the reason. Also plotted: RoPE's long-term decay (Su et al. 2021, section 3.4.3), the bound
``(1/(d/2)) sum_j |sum_{i<j} e^{i m theta_i}|`` on the attention score at relative distance m.

Usage:
    python benchmarks/length_extrapolation.py --work /tmp/lx --steps 2000
    python benchmarks/length_extrapolation.py --work /tmp/lx --quick     # toy sizes, a few steps

Output: a table, WORK/length_extrapolation.png (loss against N per scheme), WORK/rope_decay.png, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from benchmarks.moe_vs_dense import corpus, lmforge, prepared  # noqa: E402

SCHEMES = {"sinusoidal": {}, "learned": {}, "relative": {"relative_k": 16}, "rope": {}, "t5-bias": {}, "alibi": {}}
QUICK = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64}


def train(work: Path, scheme: str, data: Path, args) -> Path:
    out = work / scheme
    if (out / "model").is_dir():
        return out / "model"
    overrides = {**(QUICK if args.quick else {}), **SCHEMES[scheme], "position": scheme,
                 "max_seq_len": args.train_len, "dropout": 0.0}
    command = ["pretrain", "--model", "gpt-tiny", "--objective", "clm", "--data", str(data), "--out", str(out),
               "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.train_len),
               "--lr", str(args.lr), "--warmup", str(max(1, args.steps // 20)), "--schedule", "cosine",
               "--eval-every", str(args.steps), "--eval-batches", "2", "--save-every", str(args.steps), "--seed", "0",
               "--no-progress", "--no-tensorboard", "--precision", "fp32" if args.quick else "auto"]
    for key, value in overrides.items():
        command += ["--override", f"{key}={value}"]
    lmforge(*command)
    return out / "model"


def evaluate(model: Path, text: Path, length: int, args) -> dict:
    """``lmforge evaluate --seq-len``'s JSON, or the refusal's message."""
    out = subprocess.run([sys.executable, "-m", "lmforge.cli.main", "evaluate", "--model", str(model), "--data",
                          str(text), "--seq-len", str(length), "--train-len", str(args.train_len), "--limit",
                          str(args.blocks)], capture_output=True, text=True)
    if out.returncode == 2:
        return {"refused": out.stderr.strip().splitlines()[-1]}
    out.check_returncode()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    beyond = [b for b in result["buckets"] if b["beyond_training"]]
    result["beyond_loss"] = sum(b["loss"] for b in beyond) / len(beyond) if beyond else None
    return result


def rope_decay(dim: int = 64, base: float = 10000.0, distance: int = 1024) -> list[float]:
    """RoPE's bound on the relative score at distance m = 0..distance-1 (module docstring)."""
    import torch

    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (d/2,)
    m = torch.arange(distance, dtype=torch.float64)[:, None]  # (M, 1)
    partial = torch.cumsum(torch.polar(torch.ones_like(m * theta), m * theta), dim=1)  # (M, d/2): S_j
    return (partial.abs().mean(1)).tolist()


def plot(table: dict, lengths: list[int], decay: list[float], work: Path) -> bool:
    from lmforge.utils.figures import figure  # matplotlib is one of lmforge's own dependencies
    fig = figure(6, 4)
    ax = fig.add_subplot()
    for scheme, cells in table.items():
        points = [(n, c["loss"]) for n, c in zip(lengths, cells) if "loss" in c]
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=scheme)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length N (trained at the first)")
    ax.set_ylabel("validation loss over N positions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(work / "length_extrapolation.png")
    fig = figure(6, 3)
    ax = fig.add_subplot()
    ax.plot(range(len(decay)), decay)
    ax.set_xlabel("relative distance m")
    ax.set_ylabel("RoPE score bound (mean |S_j|)")
    ax.grid(alpha=0.3)
    fig.savefig(work / "rope_decay.png")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the tokenizer, shards and the runs")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps of each run (default: 2000)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: 16)")
    parser.add_argument("--train-len", type=int, default=128, help="training length (default: 128)")
    parser.add_argument("--lengths", default="128,256,512,1024", help="evaluation lengths (default: 128,256,512,1024)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    parser.add_argument("--blocks", type=int, default=16, help="validation blocks scored per length (default: 16)")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="position schemes to run")
    parser.add_argument("--quick", action="store_true", help="toy models and corpus: checks that the script runs")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    lengths = [int(n) for n in args.lengths.split(",")]
    data = prepared(args.work, args.quick)
    text = corpus(args.work, args.quick)  # the text prepared() tokenised; every length reads the same tokens
    table = {}
    for scheme in args.schemes.split(","):
        model = train(args.work, scheme, data, args)
        table[scheme] = [evaluate(model, text, n, args) for n in lengths]
        cells = [f"{c['loss']:.3f}/{c['beyond_loss']:.3f}" if "loss" in c and c["beyond_loss"] is not None
                 else f"{c['loss']:.3f}" if "loss" in c else "refused" for c in table[scheme]]
        print(f"{scheme:11s} " + "  ".join(f"{n}: {cell}" for n, cell in zip(lengths, cells)), flush=True)
    decay = rope_decay()
    plotted = plot(table, lengths, decay, args.work)
    print(json.dumps({"benchmark": "length_extrapolation", "train_len": args.train_len, "lengths": lengths,
                      "steps": args.steps, "table": {s: [{k: c.get(k) for k in ("loss", "beyond_loss", "refused")}
                                                          for c in cells] for s, cells in table.items()},
                      "rope_decay": decay[:: max(1, len(decay) // 64)], "plots": plotted}))


if __name__ == "__main__":
    main()
