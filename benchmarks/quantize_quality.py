"""What each inference precision costs in quality: perplexity and greedy agreement of a trained GPT, int8 and int4.

Random weights say nothing about quantisation error (their logits are near-flat, so any rounding flips the
argmax), so this pre-trains the ``gpt-tiny`` preset (6 layers x 384, fp32) for ``--steps`` on the bundled Austen
corpus, less its last 6,000 characters, then runs what ``lmforge quantize`` runs for each mode
(:func:`lmforge.tasks.quantize.quantize_folder`): the perplexity of the fp32 and the quantised model on those
held-out characters, and the share of greedy tokens the quantised model keeps in common with fp32 over a fixed
prompt set. The int8 row is what the CPU computes with: on x86 the activations are rounded to integers as
well, to 7 bits by fbgemm's int8 GEMM for the perplexity's windows, to 8 bits by lmforge.nn.gemv.int8_gemv for the
one-row steps of greedy decoding (``kernel`` in the JSON; lmforge.nn.weight_only).

Usage:
    python benchmarks/quantize_quality.py --work /tmp/qq            # 600 steps: about 15 minutes on 2 cores
    python benchmarks/quantize_quality.py --work /tmp/qq --steps 2 --train-chars 50000   # a smoke test

Output: one line per mode, then one JSON line. The trained model stays in WORK/model/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lmforge import datasets  # noqa: E402
from lmforge.cli.main import main as lmforge_main  # noqa: E402
from lmforge.data.prepare import prepare  # noqa: E402
from lmforge.nn import gemv, weight_only  # noqa: E402
from lmforge.tasks.quantize import HELD_OUT_CHARS, quantize_folder  # noqa: E402
from lmforge.tokenization import train_tokenizer  # noqa: E402

MODES = ("int8", "int4")


def pretrain(work: Path, steps: int, train_chars: int | None) -> Path:
    """gpt-tiny pre-trained on the corpus without its held-out tail (its first ``train_chars`` characters, if
    given); returns the model folder (kept if there)."""
    model = work / "run" / "model"
    if model.is_dir():
        return model
    text = work / "train.txt"
    with gzip.open(datasets.path("corpus"), "rt", encoding="utf-8") as f:
        text.write_text(f.read()[:-HELD_OUT_CHARS][:train_chars], encoding="utf-8")
    tok = train_tokenizer([text], kind="byte-bpe", family="gpt", vocab_size=4096, show_progress=False)
    prepare([text], tok, work / "data", val_fraction=0.02, progress=False)
    args = ["pretrain", "--no-progress", "--model", "gpt-tiny", "--objective", "clm", "--data", str(work / "data"),
            "--out", str(work / "run"), "--max-steps", str(steps), "--batch-size", "16", "--seq-len", "128",
            "--precision", "fp32", "--lr", "1e-3", "--warmup", str(max(steps // 20, 1)), "--eval-every", "0",
            "--save-every", str(steps), "--seed", "0"]
    if lmforge_main(args) != 0:
        raise SystemExit("pre-training failed")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="folder for the data, the trained model and the quantised ones")
    parser.add_argument("--steps", type=int, default=600, help="pre-training steps (600)")
    parser.add_argument("--train-chars", type=int, default=None, help="pre-train on only this many characters "
                        "(default: the whole corpus less the held-out tail)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = pretrain(work, args.steps, args.train_chars)
    kernel = "weight-only"
    if weight_only._fbgemm_int8_ready():
        kernel = "fbgemm (7-bit activations)" + (", int8_gemv at 1-2 rows (8-bit)" if gemv.available() else "")
    rows = []
    for mode in MODES:
        report = quantize_folder(model, mode, work / mode)
        row = {**report.to_dict(), "kernel": kernel if mode == "int8" else "weight-only (bf16 activations)"}
        rows.append(row)
        print(f"{mode}: perplexity fp32 {report.ppl_fp32:.3f} -> {report.ppl_quantized:.3f} "
              f"({100 * report.ppl_change:+.2f}%), greedy agreement {100 * report.agreement:.1f}% "
              f"({report.tokens} held-out tokens; {row['kernel']})", flush=True)
    print(json.dumps({"benchmark": "quantize_quality", "model": "gpt-tiny", "steps": args.steps,
                      "held_out_chars": HELD_OUT_CHARS, "results": rows,
                      "seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
