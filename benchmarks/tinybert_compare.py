"""TinyBERT vs DistilBERT-style distillation vs no teacher, at equal student size, on rt-sentiment
(docs/lab/tinybert.md).

    corpus     the 8,056 rt-sentiment training reviews (text only) + the first 1 MB of the Austen corpus
    teacher    bert-tiny, d 64, 4 layers, 4 heads: MLM pre-trained on the corpus, then fine-tuned on rt-sentiment
    student    d 32, 2 layers, 4 heads (the width differs: TinyBERT learns W_e, W_h; DistilBERT runs without
               its cosine term, which needs equal widths)
    arms, per seed
      none        the student from its random init, fine-tuned on the labels (TASK_EPOCHS)
      distilbert  general: lmforge distill --data (5 KL + 2 MLM, T 2; GENERAL_STEPS), then task distillation
                  (0.5 KL + 0.5 gold, T 2; TASK_EPOCHS)
      tinybert    general: --method tinybert --data (GENERAL_STEPS), then task: intermediate layers
                  (INTERMEDIATE_EPOCHS) + prediction layer (TASK_EPOCHS - INTERMEDIATE_EPOCHS, T 1)
    score      test accuracy of OUT/best (picked on dev), 3 seeds, mean +- std

Every command runs single-threaded; folders that exist are reused, so the script resumes after a stop::

    OMP_NUM_THREADS=1 python benchmarks/tinybert_compare.py WORKDIR --setup-only
    OMP_NUM_THREADS=1 python benchmarks/tinybert_compare.py WORKDIR --seeds S     # S = 0, 1, 2 (one process each)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

LMFORGE = [sys.executable, "-m", "lmforge.cli.main"]
TEACHER = {"d_model": 64, "n_layers": 4, "n_heads": 4, "d_ff": 256, "max_seq_len": 64}
STUDENT = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 128}
PRETRAIN_STEPS, GENERAL_STEPS = 400, 100
TEACHER_EPOCHS, TASK_EPOCHS, INTERMEDIATE_EPOCHS = 1, 2, 1
COMMON = ["--precision", "fp32", "--threads", "1", "--no-progress", "--no-tensorboard"]
TASK = ["--train", "rt-sentiment:train", "--eval", "rt-sentiment:dev", "--batch-size", "32", "--eval-every", "252",
        "--save-every", "0", "--warmup-ratio", "0.1", "--schedule", "linear"]


def overrides(shape: dict) -> list[str]:
    return [a for k, v in shape.items() for a in ("--override", f"{k}={v}")]


def run(args: list[str], log: Path) -> None:
    start = time.time()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ lmforge " + " ".join(args[3:]) + "\n")
        f.flush()
        subprocess.run(args, check=True, stdout=f, stderr=f)
    print(f"{time.time() - start:7.1f}s  {' '.join(args[3:6])}", flush=True)


def test_accuracy(folder: Path, log: Path) -> float:
    out = subprocess.run([*LMFORGE, "evaluate", "--model", str(folder), "--data", "rt-sentiment:test",
                          "--threads", "1"], check=True, capture_output=True, text=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write(out.stdout)
    return json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]


def setup(work: Path, log: Path) -> tuple[Path, Path, Path]:
    """Tokenizer, shards, the pre-trained teacher and the fine-tuned one."""
    from lmforge.data.prepare import prepare
    from lmforge.tasks.data import read_table
    from lmforge.tokenization import train_tokenizer

    corpus, data = work / "corpus.txt", work / "data"
    if not (data / "manifest.json").is_file():
        reviews = [row["text"] for row in read_table("rt-sentiment:train").rows]
        austen = gzip.decompress(Path(__import__("lmforge.datasets", fromlist=["x"]).__file__).parent.joinpath(
            "files", "austen.txt.gz").read_bytes()).decode("utf-8")[:1_000_000]
        corpus.write_text("\n\n".join(reviews) + "\n\n" + austen, encoding="utf-8")
        tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=4000, show_progress=False)
        prepare([corpus], tok, data, val_fraction=0.02, progress=False)
    pre = work / "teacher-pre"
    if not (pre / "model").is_dir():
        run([*LMFORGE, "pretrain", "--model", "bert-tiny", "--objective", "mlm", "--data", str(data), "--out", str(pre),
             *overrides(TEACHER), "--seq-len", "64", "--batch-size", "32", "--max-steps", str(PRETRAIN_STEPS),
             "--lr", "1e-3", "--warmup", "40", "--eval-every", "0", "--save-every", "0", *COMMON], log)
    ft = work / "teacher-ft"
    if not (ft / "best").is_dir():
        run([*LMFORGE, "finetune", "--model", str(pre / "model"), "--task", "classify", *TASK, "--out", str(ft),
             "--epochs", str(TEACHER_EPOCHS), "--lr", "1e-3", "--max-length", "64", *COMMON], log)
    return data, pre / "model", ft / "best"


def arm(name: str, seed: int, work: Path, data: Path, pre: Path, ft: Path, log: Path) -> float:
    out = work / f"{name}-{seed}"
    seeded = ["--seed", str(seed)]
    if not (out / "best").is_dir():
        if name == "none":
            # The student's architecture with fresh weights: the distilled students' general-stage shape.
            shape = work / f"shape-{seed}"
            if not (shape / "model.safetensors").is_file():
                import lmforge
                from lmforge.models import Transformer
                from lmforge.tokenization import Tokenizer

                teacher = lmforge.load(pre)
                student = Transformer(teacher.config.replace(**STUDENT))
                lmforge.save(student, shape, tokenizer=Tokenizer.load(pre))
            run([*LMFORGE, "finetune", "--model", str(shape), "--random-init", "--task", "classify", *TASK,
                 "--out", str(out), "--epochs", str(TASK_EPOCHS), "--lr", "1e-3", "--max-length", "64", *seeded,
                 *COMMON], log)
        else:
            general = work / f"{name}-general-{seed}"
            method = ["--method", name]
            if not (general / "model").is_dir():
                extra = ["--alpha-cos", "0"] if name == "distilbert" else []
                run([*LMFORGE, "distill", *method, "--teacher", str(pre), "--data", str(data), "--out", str(general),
                     *overrides(STUDENT), *extra, "--seq-len", "64", "--batch-size", "32", "--max-steps",
                     str(GENERAL_STEPS), "--lr", "1e-3", "--warmup", "15", "--eval-every", "0", "--save-every", "0",
                     *seeded, *COMMON], log)
            if name == "tinybert":
                task = ["--intermediate-epochs", str(INTERMEDIATE_EPOCHS), "--epochs",
                        str(TASK_EPOCHS - INTERMEDIATE_EPOCHS), "--temperature", "1"]
            else:
                task = ["--epochs", str(TASK_EPOCHS), "--temperature", "2", "--alpha", "0.5"]
            run([*LMFORGE, "distill", *method, "--teacher", str(ft), "--student", str(general / "model"), *TASK,
                 "--out", str(out), *task, "--lr", "1e-3", *seeded, *COMMON], log)
    return test_accuracy(out / "best", log)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["none", "distilbert", "tinybert"])
    parser.add_argument("--setup-only", action="store_true", help="make the teachers and stop (then run seeds "
                        "in separate processes)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / ("log-" + "-".join(map(str, args.seeds)) + ".txt")
    data, pre, ft = setup(args.work, log)
    if args.setup_only:
        return 0
    results = {"teacher": test_accuracy(ft, log)}
    print(f"teacher test accuracy {results['teacher']:.4f}", flush=True)
    for seed in args.seeds:
        for name in args.arms:
            results.setdefault(name, []).append(arm(name, seed, args.work, data, pre, ft, log))
            print(f"{name} seed {seed}: {results[name][-1]:.4f}", flush=True)
    for name in args.arms:
        xs = results[name]
        print(f"{name:11s} {statistics.mean(xs):.4f} +- {statistics.stdev(xs) if len(xs) > 1 else 0:.4f}  {xs}")
    name = "results-" + "-".join(map(str, args.seeds)) + ".json"
    (args.work / name).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
