"""Stage 9: embed documents, index them, and answer queries by cosine similarity.

The documents are Bible verses in a modern English translation (WEB, from the bible-paraphrase test pairs);
the queries are the same verses in the King James wording. A good sentence encoder puts each KJV verse
nearest its WEB paraphrase, so recall@1 measures the embeddings directly. Two encoders are compared, both
mean-pooled: bert-tiny as pre-trained here (masked LM only, never trained for similarity) and, when it is
installed, all-MiniLM-L6-v2 (trained on a billion sentence pairs for exactly this). The best encoder's
index is saved to ``OUT/index`` (``lmforge index search --index OUT/index ...`` reads it) and answers one
free-text query for the report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lmforge import datasets
from lmforge.checkpoint import load_body
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.index import VectorIndex
from lmforge.quickstart.budget import count_for
from lmforge.quickstart.context import Context
from lmforge.quickstart.finetuning import minilm_path

QUERY = "a shepherd leaves the flock to look for the sheep that was lost"
PAIRS = 1000
FLOOR = 100
TIMING_BATCH = 32
TOP_K = 10
SHOWN = 3


def encoders(ctx: Context) -> dict[str, tuple[Any, str]]:
    """name -> (SentenceEncoder, its model folder): bert-tiny pre-trained here, and MiniLM when installed."""
    found = {}
    sources = {"bert-tiny (pre-trained here)": ctx.path(ctx.result("pretrain-bert")["model_dir"])}
    if minilm_path() is not None:
        sources["all-MiniLM-L6-v2"] = minilm_path()
    for name, source in sources.items():
        model, tok = load_body(str(source))
        found[name] = (SentenceEncoder(model.to(ctx.device).eval(), tok, pooling="mean"), str(Path(source).resolve()))
    return found


def retrieval(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``retrieval``."""
    start = time.perf_counter()
    pairs = [r for r in datasets.load("bible-paraphrase", "test") if r["label"] == 1]
    found = encoders(ctx)
    # Size the index to the time: embed one batch with every encoder (a warm-up too), then take as many
    # verse pairs as the rest of the stage's share can embed twice (documents and queries).
    sample = [r["text1"] for r in pairs[:TIMING_BATCH]]
    timed = time.perf_counter()
    for encoder, _ in found.values():
        with ctx.inference():
            encoder.encode(sample)
    per_pair = 2 * (time.perf_counter() - timed) / len(sample)
    left = seconds - (time.perf_counter() - start)
    pairs = pairs[:count_for(left, per_pair, ctx.scaled(PAIRS, floor=FLOOR), floor=FLOOR)]
    docs, queries = [r["text2"] for r in pairs], [r["text1"] for r in pairs]
    scores, best = {}, None
    for name, (encoder, source) in found.items():
        start = time.perf_counter()
        meta = {"model": source, "pooling": "mean", "layer": -1, "max_length": encoder.max_length}
        with ctx.inference():  # bf16 where the hardware has it: vectors for a cosine search need no more
            index = VectorIndex(encoder.encode(docs, progress=ctx.progress), docs, meta)
            ids, _ = index.search_ids(encoder.encode(queries), k=TOP_K)
        ranks = [list(row).index(i) + 1 if i in row else None for i, row in enumerate(ids.tolist())]
        scores[name] = {"recall@1": sum(r == 1 for r in ranks) / len(ranks),
                        f"recall@{TOP_K}": sum(r is not None for r in ranks) / len(ranks),
                        f"mrr@{TOP_K}": sum(1 / r for r in ranks if r) / len(ranks),
                        "seconds": time.perf_counter() - start}
        ctx.log(f"{name}: recall@1 {scores[name]['recall@1']:.3f} over {len(docs)} verses")
        if best is None or scores[name]["recall@1"] > scores[best[0]]["recall@1"]:
            best = (name, encoder, index)
    name, encoder, index = best
    folder = index.save(ctx.path("index"))
    with ctx.inference():
        hits = index.search(encoder.encode([QUERY]), k=SHOWN)[0]
    answers = [{"text": text, "cosine": score} for _, text, score in hits]
    ctx.log(f"query {QUERY!r} -> {answers[0]['text'][:80]!r}")
    shown = ", ".join(f"{n.split(' ')[0]} {s['recall@1']:.3f}" for n, s in scores.items())
    return {"documents": len(docs), "encoders": scores, "index": ctx.relative(folder), "index_encoder": name,
            "query": QUERY, "answers": answers,
            "summary": f"KJV -> WEB verse recall@1: {shown} ({len(docs)} verses)"}
