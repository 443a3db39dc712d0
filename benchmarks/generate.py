"""Greedy generation throughput: lmforge ``model.generate`` against Hugging Face ``generate``, side by side.

Both run the same weights: an HF ``GPT2LMHeadModel`` of the tiny GPT shape (6 layers, d_model 384, 6 heads,
vocab 8192), randomly initialised, and its conversion by ``lmforge.from_hf``. Each run greedily generates
``--new-tokens`` tokens (no EOS, so exactly that many) after a 32-token prompt, in fp32 on the CPU (CUDA
when present). lmforge and HF runs alternate, each repeat in swapped order, so slow drifts of a shared
machine hit both alike; each figure is the median over ``--repeats`` runs after a warm-up. The outputs
are checked to be token-identical first.

Usage:
    python benchmarks/generate.py                 # batch 1 and 8, 128 new tokens, 7 repeats
    python benchmarks/generate.py --quick         # 32 new tokens, 3 repeats: a smoke test

Output: one line per batch size with new tokens/s for both and the ratio, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

# The benchmark measures code, not a log flood from transformers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers as hf  # noqa: E402

import lmforge  # noqa: E402

PROMPT_LEN = 32
SHAPE = dict(vocab_size=8192, n_embd=384, n_layer=6, n_head=6)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build(device: str):
    torch.manual_seed(0)
    config = hf.GPT2Config(**SHAPE, n_positions=256, bos_token_id=None, eos_token_id=None)
    ref = hf.GPT2LMHeadModel(config).eval().to(device)
    ours = lmforge.from_hf(ref).eval().to(device)
    return ref, ours


def runners(ref, ours, ids: torch.Tensor, new_tokens: int):
    mask = torch.ones_like(ids)
    config = hf.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 num_beams=1, eos_token_id=None, pad_token_id=0)

    def run_hf() -> torch.Tensor:
        return ref.generate(ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]

    def run_ours() -> torch.Tensor:
        return ours.generate(ids, max_new_tokens=new_tokens, ignore_eos=True).sequences

    return run_hf, run_ours


def timed(fn, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def bench_batch(ref, ours, batch: int, new_tokens: int, repeats: int, device: str) -> dict:
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(batch))
    run_hf, run_ours = runners(ref, ours, ids.to(device), new_tokens)
    expected, got = run_hf(), run_ours()  # also the warm-up
    identical = torch.equal(expected, got)
    times = {"hf": [], "lmforge": []}
    for r in range(repeats):
        order = [("hf", run_hf), ("lmforge", run_ours)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(timed(fn, device))
    hf_tps = batch * new_tokens / statistics.median(times["hf"])
    ours_tps = batch * new_tokens / statistics.median(times["lmforge"])
    return {
        "batch": batch, "new_tokens": new_tokens, "hf_tok_s": round(hf_tps, 1), "lmforge_tok_s": round(ours_tps, 1),
        "ratio": round(ours_tps / hf_tps, 2), "identical": identical,
        "hf_ms_per_step": round(1000 * statistics.median(times["hf"]) / new_tokens, 2),
        "lmforge_ms_per_step": round(1000 * statistics.median(times["lmforge"]) / new_tokens, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 3 repeats")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (32 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 7; 3 with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (3 if args.quick else 7)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref, ours = build(device)
    # Other processes on a shared machine slow both sides (two-thread kernels dramatically): say how busy it was.
    load = os.getloadavg()[0]
    print(f"greedy generation, {PROMPT_LEN}-token prompt, {new_tokens} new tokens, fp32 on {device} "
          f"({torch.get_num_threads()} threads), median of {repeats}; transformers {hf.__version__}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    results = []
    for batch in args.batch_sizes:
        res = bench_batch(ref, ours, batch, new_tokens, repeats, device)
        results.append(res)
        print(f"batch {batch:>2}: lmforge {res['lmforge_tok_s']:8.1f} new tok/s ({res['lmforge_ms_per_step']:.2f} ms/step)"
              f"   HF {res['hf_tok_s']:8.1f} new tok/s ({res['hf_ms_per_step']:.2f} ms/step)"
              f"   ratio {res['ratio']:.2f}x   identical tokens: {'yes' if res['identical'] else 'NO'}")
    print(json.dumps({"benchmark": "generate", "device": device, "dtype": "float32", "threads": torch.get_num_threads(),
                      "prompt_len": PROMPT_LEN, "repeats": repeats, "load_before": round(load, 2),
                      "load_after": round(os.getloadavg()[0], 2), "results": results}))


if __name__ == "__main__":
    main()
