"""mBART-style pre-training vs random initialisation for EN->ES translation (Liu et al. 2020, Table 2's question).

On the bundled ``kjv-rv1909`` pairs (English KJV / Spanish Reina-Valera 1909 Bible verses):

1. one BPE tokenizer (BART family) on the English and Spanish sides of the training split;
2. ``DATA/en`` and ``DATA/es``: each side's training verses as monolingual text, 8 verses to a document (so
   that sentence permutation has sentences to permute); no pairing is used in pre-training;
3. ``lmforge pretrain --objective multilingual-denoising`` (bart-tiny's shape) for ``--pretrain-steps``;
4. ``finetune_translation`` EN->ES on the training pairs for ``--finetune-steps``, from the pre-trained weights
   and from random weights of the same shape, same settings and seed;
5. greedy decoding of the first ``--test`` test verses, corpus BLEU and chrF (sacrebleu).

Usage:
    python benchmarks/mbart_en_es.py --work /tmp/mbart --pretrain-steps 3000 --finetune-steps 2000 --test 500

Prints a line per stage and a final JSON line with every number (also written to WORK/results.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lmforge import datasets  # noqa: E402
from lmforge.data.prepare import prepare  # noqa: E402
from lmforge.tasks.mbart_translation import evaluate_translation, finetune_translation  # noqa: E402
from lmforge.tokenization import train_tokenizer  # noqa: E402
from lmforge.training import TrainConfig  # noqa: E402
from lmforge.training.pretrain import pretrain  # noqa: E402

SHAPE = {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_layers": 4, "n_decoder_layers": 4, "max_seq_len": 128}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="working folder (tokenizer, data, runs)")
    parser.add_argument("--pretrain-steps", type=int, default=3000)
    parser.add_argument("--finetune-steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--test", type=int, default=500, help="test verses scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a minutes-long CPU smoke run (1-layer, d_model 32)")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shape = {**SHAPE, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "n_decoder_layers": 1} if args.tiny \
        else SHAPE
    train, test = datasets.load("kjv-rv1909", "train"), datasets.load("kjv-rv1909", "test")[: args.test]
    results: dict = {"pretrain_steps": args.pretrain_steps, "finetune_steps": args.finetune_steps,
                     "batch_size": args.batch_size, "shape": shape, "test_verses": len(test), "seed": args.seed}

    started = time.time()
    for lang in ("en", "es"):
        docs = [" ".join(r[lang] for r in train[i:i + 8]) for i in range(0, len(train), 8)]
        (work / f"{lang}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    tok = train_tokenizer([work / "en.txt", work / "es.txt"], kind="bpe", family="bart", vocab_size=args.vocab,
                          show_progress=False)
    for lang in ("en", "es"):
        prepare([work / f"{lang}.txt"], tok, work / "data" / lang, val_fraction=0.02, progress=False, overwrite=True)
    log(f"tokenizer ({tok.vocab_size} tokens) and data ready in {time.time() - started:.0f} s")

    started = time.time()
    config = TrainConfig.from_dict({
        "model": "bart-tiny", "objective": "multilingual-denoising", "data": str(work / "data"),
        "out": str(work / "mbart"), "overrides": shape, "max_steps": args.pretrain_steps,
        "batch_size": args.batch_size, "seq_len": 128, "lr": 5e-4, "warmup": max(1, args.pretrain_steps // 10),
        "schedule": "linear", "eval_every": args.pretrain_steps, "eval_batches": 8,
        "save_every": args.pretrain_steps, "seed": args.seed, "progress": False, "tensorboard": False})
    done = pretrain(config)
    results["pretrain_seconds"] = round(time.time() - started, 1)
    results["pretrain_eval_loss"] = done.metrics.get("eval_loss")
    log(f"pre-trained {done.step} steps in {results['pretrain_seconds']} s: eval loss {results['pretrain_eval_loss']}")

    device = "cuda" if __import__("torch").cuda.is_available() else "cpu"
    for name, random_init in (("pretrained", False), ("random", True)):
        started = time.time()
        run = work / f"en-es-{name}"
        fit = finetune_translation(work / "mbart" / "model", train, source="en", target="es", out=run,
                                   random_init=random_init, max_steps=args.finetune_steps,
                                   batch_size=args.batch_size, lr=3e-4, max_length=96, seed=args.seed)
        seconds = round(time.time() - started, 1)
        scores = evaluate_translation(run / "model", test, source="en", target="es", max_new_tokens=96,
                                      max_length=96, device=device, batch_size=128)
        results[name] = {**scores, "train_loss": fit.metrics.get("loss"), "finetune_seconds": seconds}
        log(f"{name}: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}, last train loss "
            f"{fit.metrics.get('loss'):.3f} ({seconds} s)")
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
