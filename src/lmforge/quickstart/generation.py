"""Stage 7: generate text with the pre-trained gpt-tiny, from prompts in the voice of its training text.

Nucleus sampling (top-p 0.9, temperature 0.8, Holtzman et al. 2020) with a mild repetition penalty, a fixed
seed, and the KV cache; plus one greedy continuation, which shows why sampling is used (greedy decoding of
a small model loops). Speed is reported as new tokens per second.
"""

from __future__ import annotations

import time
from typing import Any

import lmforge
from lmforge.generation import generate_text
from lmforge.quickstart.context import Context
from lmforge.tokenization import Tokenizer

PROMPTS = [
    "It is a truth universally acknowledged, that",
    "Elizabeth looked at her sister and said,",
    "This movie is",
]
NEW_TOKENS = 48
SAMPLING = {"strategy": "sample", "top_p": 0.9, "temperature": 0.8, "repetition_penalty": 1.1, "seed": 0}


def generation(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``generation``."""
    folder = ctx.path(ctx.result("pretrain-gpt")["model_dir"])
    model, tok = lmforge.load(folder, device=ctx.device), Tokenizer.load(folder)
    new_tokens = ctx.scaled(NEW_TOKENS, floor=24)
    start = time.perf_counter()
    sampled = generate_text(model, tok, PROMPTS, max_new_tokens=new_tokens, **SAMPLING)
    greedy = generate_text(model, tok, PROMPTS[:1], max_new_tokens=new_tokens)
    elapsed = time.perf_counter() - start
    tokens = sum(len(tok.encode(t, add_special_tokens=False)) for t in sampled + greedy)
    samples = [{"prompt": p, "text": t, "decoding": "sample"} for p, t in zip(PROMPTS, sampled)]
    samples.append({"prompt": PROMPTS[0], "text": greedy[0], "decoding": "greedy"})
    for s in samples:
        ctx.log(f"[{s['decoding']}] {s['prompt']}{s['text'][:90]!s}".replace("\n", " "))
    return {"model": ctx.relative(folder), "settings": {**SAMPLING, "max_new_tokens": new_tokens},
            "samples": samples, "tokens_per_second": tokens / elapsed if elapsed > 0 else None,
            "summary": f"{len(samples)} continuations of {new_tokens} tokens ({tokens / elapsed:.0f} tokens/s)"}
