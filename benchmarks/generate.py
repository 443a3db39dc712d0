"""Greedy generation throughput: Hugging Face ``generate`` against lmforge ``model.generate``, eager and compiled.

All three run the same weights: an HF ``GPT2LMHeadModel`` of the tiny GPT shape (6 layers, d_model 384,
6 heads, vocab 8192), randomly initialised, and its conversion by ``lmforge.from_hf``. Each run greedily
generates ``--new-tokens`` tokens (no EOS, so exactly that many) after a 32-token prompt, in fp32 on the
CPU (CUDA when present):

    HF        ``GPT2LMHeadModel.generate`` (eager)
    eager     ``model.generate(...)``: lmforge's default path
    compiled  ``model.generate(..., compile=True)``: the prompt eagerly, then every token through one
              ``torch.compile``-d step over a static KV cache (lmforge.generation.compiled)

The first compiled call per batch size compiles its step; that warm-up call is timed on its own and
reported as ``compile_s`` (the whole call: compile plus one generation, what a user waits the first
time in a process). Inductor's on-disk caches (compiled C++ kernels) may shorten it when an earlier
run compiled the same kernels; ``--cold`` disables them, for the cold-compile figure
(``compile_cold`` in the JSON). Then the three runs alternate, each repeat in a rotated order, so slow drifts of a
shared machine hit all alike; each figure is the median over ``--repeats`` runs after a warm-up. The
outputs are checked to be token-identical first.

Usage:
    python benchmarks/generate.py                 # batch 1 and 8, 128 new tokens, 7 repeats, with compile
    python benchmarks/generate.py --threads 1     # one intra-op thread (pin the process too: taskset -c 1)
    python benchmarks/generate.py --quick         # 32 new tokens, 3 repeats, no compile: a smoke test
    python benchmarks/generate.py --cold          # compile without inductor's caches: the cold compile time

Output: one line per batch size with new tokens/s of each path and both lmforge/HF ratios, then one JSON
line (``ratio`` and ``lmforge_tok_s`` are the eager path's; ``compiled_*`` fields the compiled path's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/generate.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers, sync, time_steps  # noqa: E402

quiet_transformers()

import torch  # noqa: E402
import transformers as hf  # noqa: E402

import lmforge  # noqa: E402

PROMPT_LEN = 32
SHAPE = dict(vocab_size=8192, n_embd=384, n_layer=6, n_head=6)


def build(device: str, shape: dict = SHAPE, n_positions: int = 256):
    """A random HF GPT-2 of ``shape`` (no BOS/EOS: generation runs to its length) and its lmforge conversion."""
    torch.manual_seed(0)
    config = hf.GPT2Config(**shape, n_positions=n_positions, bos_token_id=None, eos_token_id=None)
    ref = hf.GPT2LMHeadModel(config).eval().to(device)
    ours = lmforge.from_hf(ref).eval().to(device)
    return ref, ours


def runners(ref, ours, ids: torch.Tensor, new_tokens: int) -> dict:
    mask = torch.ones_like(ids)
    config = hf.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 num_beams=1, eos_token_id=None, pad_token_id=0)

    def run_hf() -> torch.Tensor:
        return ref.generate(ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]

    def run_eager() -> torch.Tensor:
        return ours.generate(ids, max_new_tokens=new_tokens, ignore_eos=True).sequences

    def run_compiled() -> torch.Tensor:
        return ours.generate(ids, max_new_tokens=new_tokens, ignore_eos=True, compile=True).sequences

    return {"hf": run_hf, "lmforge": run_eager, "compiled": run_compiled}


def bench_batch(ref, ours, batch: int, new_tokens: int, repeats: int, device: str, compile: bool, cold: bool) -> dict:
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(batch))
    runs = runners(ref, ours, ids.to(device), new_tokens)
    if not compile:
        del runs["compiled"]
    res = {"batch": batch, "new_tokens": new_tokens}
    if compile:  # the first compiled call compiles: time it alone, before anything else warms up
        sync(device)
        start = time.perf_counter()
        got_compiled = runs["compiled"]()
        sync(device)
        res["compile_s"] = round(time.perf_counter() - start, 2)
        res["compile_cold"] = cold
    expected, got = runs["hf"](), runs["lmforge"]()  # also the warm-up
    identical = torch.equal(expected, got)
    if compile:
        res["compiled_identical"] = torch.equal(expected, got_compiled) and torch.equal(expected, runs["compiled"]())
    timed = time_steps(list(runs.values()), device, repeats=repeats, rotate=True)  # rotate who goes first
    med = {name: seconds for name, (seconds, _) in zip(runs, timed)}
    tps = {name: batch * new_tokens / m for name, m in med.items()}
    res.update({
        "hf_tok_s": round(tps["hf"], 1), "lmforge_tok_s": round(tps["lmforge"], 1),
        "ratio": round(tps["lmforge"] / tps["hf"], 2), "identical": identical,
        "hf_ms_per_step": round(1000 * med["hf"] / new_tokens, 2),
        "lmforge_ms_per_step": round(1000 * med["lmforge"] / new_tokens, 2),
    })
    if compile:
        res.update({
            "compiled_tok_s": round(tps["compiled"], 1), "compiled_ratio": round(tps["compiled"] / tps["hf"], 2),
            "compiled_ms_per_step": round(1000 * med["compiled"] / new_tokens, 2),
        })
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 3 repeats, no compile")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (32 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 7; 3 with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled lmforge path")
    parser.add_argument("--cold", action="store_true", help="compile without inductor's on-disk caches")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (3 if args.quick else 7)
    compile = not (args.no_compile or args.quick)
    if args.cold:
        import torch._inductor.config as inductor_config

        inductor_config.force_disable_caches = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref, ours = build(device)
    # Other processes on a shared machine slow both sides (two-thread kernels dramatically): say how busy it was.
    load = os.getloadavg()[0]
    print(f"greedy generation, {PROMPT_LEN}-token prompt, {new_tokens} new tokens, fp32 on {device} "
          f"({torch.get_num_threads()} threads), median of {repeats}; transformers {hf.__version__}, "
          f"torch {torch.__version__}; load average {load:.1f} on {os.cpu_count()} CPUs")
    results = []
    for batch in args.batch_sizes:
        res = bench_batch(ref, ours, batch, new_tokens, repeats, device, compile, args.cold)
        results.append(res)
        line = (f"batch {batch:>2}: HF {res['hf_tok_s']:8.1f} new tok/s ({res['hf_ms_per_step']:.2f} ms/step)"
                f" | lmforge eager {res['lmforge_tok_s']:8.1f} ({res['lmforge_ms_per_step']:.2f} ms/step)"
                f" {res['ratio']:.2f}x")
        if compile:
            line += (f" | compiled {res['compiled_tok_s']:8.1f} ({res['compiled_ms_per_step']:.2f} ms/step)"
                     f" {res['compiled_ratio']:.2f}x, first call (compiles) {res['compile_s']:.1f} s"
                     f"{' cold' if args.cold else ''}")
        same = res["identical"] and res.get("compiled_identical", True)
        print(line + f" | identical tokens: {'yes' if same else 'NO'}")
    print(json.dumps({"benchmark": "generate", "device": device, "dtype": "float32", "threads": torch.get_num_threads(),
                      "prompt_len": PROMPT_LEN, "repeats": repeats, "compile": compile,
                      "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                      "results": results}))


if __name__ == "__main__":
    main()
