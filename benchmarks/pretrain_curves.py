"""Pre-train the four tiny presets on the shared corpus and report their learning curves.

One run per objective family, each on its own tokenizer (as the original models were):

    gpt-tiny   causal LM           byte-level BPE  (GPT-2)
    bert-tiny  masked LM           WordPiece       (BERT)
    t5-tiny    span corruption     unigram         (T5; 100 sentinels)
    bart-tiny  denoising           BPE             (BART: infilling + sentence permutation)

Each run lasts about ``--minutes``: a short probe run measures seconds per step, and the step count is
set from it, so the cosine schedule ends where the time budget does. The corpus is the shared
``corpus/`` folder (Austen, the World English Bible and WordNet glosses, ~18 MB), 1% of documents held
out for validation.

Baseline: the add-one unigram distribution of the training tokens, scored on the validation tokens
(nats/token). It is the best guess that ignores context, so a model that learnt anything must go well
below it. For MLM and span corruption the targets are a sample of the text's tokens (plus sentinels),
so the same figure is a fair context-free reference.

Usage:
    python benchmarks/pretrain_curves.py --work /tmp/curves --minutes 10                # all four
    python benchmarks/pretrain_curves.py --work /tmp/curves --minutes 10 --only clm mlm

Output: one line per run (the first batch's loss, i.e. at initialisation; the first and last
validation loss and perplexity, the unigram baseline, tokens/s),
then one JSON line with every number. The trained models stay in WORK/<objective>/model/.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"
RUNS = {  # objective: (preset, tokenizer kind, family, peak lr, extra pretrain args)
    "clm": ("gpt-tiny", "byte-bpe", "gpt", 1e-3, []),
    "mlm": ("bert-tiny", "wordpiece", "bert", 5e-4, []),
    "span-corruption": ("t5-tiny", "unigram", "t5", 1e-3, []),
    "denoising": ("bart-tiny", "bpe", "bart", 5e-4, []),
}
COMMON = ["--seq-len", "128", "--schedule", "cosine",
          "--min-lr-ratio", "0.1", "--eval-batches", "10", "--no-tensorboard", "--seed", "0",
          "--override", "dropout=0.0", "--override", "attn_dropout=0.0"]


def lmforge(*args: str, quiet: bool = False) -> None:
    command = [sys.executable, "-m", "lmforge.cli.main", *args]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL if quiet else None)


def prepared(work: Path, family: str, kind: str) -> Path:
    data = work / f"data-{family}"
    if not (data / "manifest.json").is_file():
        tokenizer = work / f"tokenizer-{family}"
        lmforge("tokenizer", "train", "--kind", kind, "--family", family, "--vocab-size", "8192",
                "--out", str(tokenizer), "--no-progress", str(SHARED))
        lmforge("data", "prepare", "--tokenizer", str(tokenizer), "--out", str(data), "--val-fraction", "0.01",
                "--no-progress", str(SHARED))
    return data


def unigram_cross_entropy(data: Path) -> float:
    """Validation tokens scored by the training split's add-one unigram distribution (nats/token)."""
    manifest = json.loads((data / "manifest.json").read_text())

    def tokens(split: str) -> np.ndarray:
        return np.concatenate([np.fromfile(p, dtype=manifest["dtype"]) for p in sorted((data / split).glob("*.bin"))])

    counts = np.bincount(tokens("train"), minlength=int(manifest.get("vocab_size", 0)))
    val = tokens("val")
    seen = Counter(val.tolist())
    total, vocab = counts.sum(), int((counts > 0).sum()) + 1
    return float(-sum(n * math.log((counts[t] + 1) / (total + vocab)) for t, n in seen.items()) / len(val))


def probe_steps(work: Path, objective: str, base: list[str], minutes: float) -> int:
    """Steps that fill ``minutes``, from the seconds per step of a 25-step probe run."""
    probe = work / f"probe-{objective}"
    lmforge(*base, "--out", str(probe), "--max-steps", "25", "--warmup", "5", "--eval-every", "1000",
            "--save-every", "1000", "--no-progress", quiet=True)
    records = [json.loads(line) for line in (probe / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    per_step = sum(r["tokens"] for r in train) / train[-1]["tokens_per_s"] / len(train)
    return max(50, int(minutes * 60 / per_step / 1.08))  # ~8% goes to evaluation and checkpoints


def run(work: Path, objective: str, minutes: float, steps: int | None = None, batch_size: int = 32) -> dict:
    preset, kind, family, lr, extra = RUNS[objective]
    data = prepared(work, family, kind)
    base = ["pretrain", "--model", preset, "--objective", objective, "--data", str(data), "--lr", str(lr),
            *COMMON, "--batch-size", str(batch_size), *extra]
    steps = steps or probe_steps(work, objective, base, minutes)
    out = work / objective
    begun = time.perf_counter()
    lmforge(*base, "--out", str(out), "--max-steps", str(steps), "--warmup", str(min(100, steps // 10)),
            "--eval-every", str(max(1, steps // 10)), "--save-every", str(max(1, steps // 4)))
    wall = time.perf_counter() - begun
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    train = [r for r in records if "loss" in r]
    return {"objective": objective, "preset": preset, "steps": steps, "batch_size": batch_size,
            "wall_s": round(wall, 1), "first_train_loss": train[0]["loss"], "eval_curve": evals,
            "start_eval_loss": evals[0][1], "end_eval_loss": evals[-1][1],
            "start_ppl": math.exp(evals[0][1]), "end_ppl": math.exp(evals[-1][1]),
            "unigram_loss": unigram_cross_entropy(data),
            "tokens_per_s": train[-1].get("tokens_per_s"), "tokens": sum(r.get("tokens", 0) for r in train)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for tokenizers, shards and runs")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time per run (default: 10)")
    parser.add_argument("--only", nargs="+", choices=list(RUNS), help="run only these objectives")
    parser.add_argument("--steps", type=int, help="fixed optimizer steps per run instead of a time budget")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences of 128 tokens per step (default: 32)")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"{SHARED} is missing: this benchmark reads the shared corpus beside the checkout")
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for objective in args.only or list(RUNS):
        r = run(args.work, objective, args.minutes, args.steps, args.batch_size)
        results.append(r)
        print(f"{r['preset']:10s} {objective:16s} steps {r['steps']:5d}  {r['wall_s'] / 60:5.1f} min  "
              f"loss at init {r['first_train_loss']:.3f}  val loss {r['start_eval_loss']:.3f} -> {r['end_eval_loss']:.3f}  "
              f"ppl {r['start_ppl']:8.1f} -> {r['end_ppl']:7.1f}  unigram {r['unigram_loss']:.3f} "
              f"(ppl {math.exp(r['unigram_loss']):.0f})  {r['tokens_per_s']} tok/s", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
