"""The original Transformer for EN->ES, scaled to this machine: label smoothing and checkpoint averaging.

Vaswani et al. (2017) trained transformer-base with label smoothing eps = 0.1 ("this hurts perplexity, as the
model learns to be more unsure, but improves accuracy and BLEU score", §5.4), the inverse-square-root warmup
schedule (§5.3) and, for evaluation, the average of the last 5 checkpoints (§6.1). This script measures the
two choices that change the result on the bundled ``kjv-rv1909`` pairs (English KJV / Spanish Reina-Valera
1909 Bible verses):

1. one shared BPE vocabulary (BART family) over the English and Spanish sides of the training split, as the
   paper shares one vocabulary between source and target (and ties both embeddings and the output layer);
2. ``transformer-base`` (post-norm, ReLU, sinusoidal positions, scaled and tied embeddings, dropout 0.1) at a
   width and depth this CPU can train (``--d-model``, ``--layers``; the paper: 512, 6 + 6), trained from random
   weights as ``lmforge finetune --task seq2seq`` trains it, with the paper's Adam betas (0.9, 0.98) and the
   inverse-square-root schedule, once with label smoothing 0.1 and once without (same seed, data order and
   steps); a checkpoint every ``--save-every`` steps, the last ``--average`` kept;
3. greedy decoding of the first ``--test`` test verses by the final model and by the average of the last
   ``--average`` checkpoints (``lmforge checkpoint average``), scored by sacrebleu (BLEU, chrF);
4. training FLOPs from each run's price tag.

Usage:
    python benchmarks/transformer_en_es.py --work /tmp/tbase                  # 2 x 1500 steps, a few tens of minutes
    python benchmarks/transformer_en_es.py --work /tmp/tbase --tiny           # a minutes-long smoke run

Prints a line per run and a final JSON line with every number (also written to WORK/results.json). Run again
with the same ``--work``, it scores the runs that finished instead of training them again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import lmforge  # noqa: E402
from lmforge import datasets  # noqa: E402
from lmforge.tasks.data import read_table  # noqa: E402
from lmforge.tasks.finetune import finetune  # noqa: E402
from lmforge.tasks.inference import evaluate  # noqa: E402
from lmforge.tasks.spec import TaskSpec  # noqa: E402
from lmforge.tokenization import Tokenizer, train_tokenizer  # noqa: E402
from lmforge.training import TrainConfig  # noqa: E402
from lmforge.training.checkpoint_average import average_checkpoints  # noqa: E402

MAX_LENGTH = 96  # tokens per verse, source and target (nearly all verses fit)
SPEC = {"text_column": "en", "target_column": "es", "max_length": MAX_LENGTH, "max_target_length": MAX_LENGTH}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def shared_tokenizer(work: Path, vocab: int) -> Tokenizer:
    """One BPE vocabulary over both languages' training verses (the paper's shared source-target BPE); the one
    an earlier invocation trained in ``work`` when there is one (its runs were trained with it)."""
    if (work / "tokenizer").is_dir():
        return Tokenizer.load(work / "tokenizer")
    train = datasets.load("kjv-rv1909", "train")
    for lang in ("en", "es"):
        (work / f"{lang}.txt").write_text("\n".join(r[lang] for r in train) + "\n", encoding="utf-8")
    tok = train_tokenizer([work / "en.txt", work / "es.txt"], kind="bpe", family="bart", vocab_size=vocab,
                          show_progress=False)
    tok.save(work / "tokenizer")
    return tok


def build(tok: Tokenizer, args) -> lmforge.Transformer:
    ids = tok.special_token_ids()
    return lmforge.build_model(
        "transformer-base", d_model=args.d_model, n_heads=args.heads, d_ff=4 * args.d_model, n_layers=args.layers,
        n_decoder_layers=args.layers, vocab_size=tok.vocab_size, max_seq_len=128, pad_token_id=tok.pad_id,
        bos_token_id=ids.get("bos_token_id"), eos_token_id=ids["eos_token_id"],
        decoder_start_token_id=ids["eos_token_id"])  # BART's convention: the decoder starts at </s>


def run(work: Path, tok: Tokenizer, smoothing: float, args, test) -> dict:
    out = work / f"ls{smoothing:g}"
    spec = TaskSpec.from_dict({"task": "seq2seq", **SPEC})
    config = TrainConfig.from_dict({
        "max_steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
        "schedule": "inverse-sqrt", "betas": [0.9, 0.98], "weight_decay": 0.0, "label_smoothing": smoothing,
        "save_every": args.save_every, "keep_checkpoints": args.average, "final_checkpoint": "weights",
        "eval_every": 0, "seed": args.seed, "progress": False, "tensorboard": False}, source="transformer_en_es")
    if (out / "model").is_dir():  # trained by an earlier invocation (this script resumes): score it again
        log(f"{out} is trained already: scoring it")
    else:
        torch.manual_seed(args.seed)
        finetune(build(tok, args), spec, "kjv-rv1909:train", None, config=config, out=out, tokenizer=tok)
    final = evaluate(out / "model", test, batch_size=64, limit=args.test)
    averaged_dir = average_checkpoints(out, args.average, work / f"ls{smoothing:g}-avg{args.average}")
    averaged = evaluate(averaged_dir, test, batch_size=64, limit=args.test)  # a task folder, as OUT/model
    tag = json.loads((out / "price_tag.json").read_text(encoding="utf-8"))
    losses = [json.loads(line).get("loss") for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    seconds = round(tag["wall_s"], 1)
    record = {"label_smoothing": smoothing, "train_seconds": seconds, "train_loss": [x for x in losses if x][-1],
              "flops": tag.get("total_flops"), "final": {k: final[k] for k in ("bleu", "chrf", "loss") if k in final},
              f"average_last_{args.average}": {k: averaged[k] for k in ("bleu", "chrf", "loss") if k in averaged}}
    log(f"label smoothing {smoothing:g}: final BLEU {final['bleu']:.2f} chrF {final['chrf']:.2f}; average of the "
        f"last {args.average}: BLEU {averaged['bleu']:.2f} chrF {averaged['chrf']:.2f} ({seconds} s)")
    return record


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="working folder (tokenizer, runs, results.json)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="peak LR, reached at the end of the warmup")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--average", type=int, default=5, help="checkpoints averaged (the paper: 5)")
    parser.add_argument("--test", type=int, default=500, help="test verses scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a minutes-long smoke run (d_model 32, 1 + 1 layers)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.d_model, args.heads, args.layers, args.steps, args.warmup, args.save_every, args.test = \
            32, 2, 1, 30, 5, 5, 20
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = shared_tokenizer(work, args.vocab)
    test = read_table("kjv-rv1909:test")  # read once; each evaluation scores its first --test verses
    results = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
               "d_model": args.d_model, "heads": args.heads, "layers": args.layers, "vocab": tok.vocab_size,
               "save_every": args.save_every, "average": args.average, "test_verses": min(args.test, len(test.rows)), "seed": args.seed,
               "runs": [run(work, tok, smoothing, args, test) for smoothing in (0.0, 0.1)]}
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
