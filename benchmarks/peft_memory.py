"""Peak training memory of LoRA against full fine-tuning, and QLoRA's NF4 base weights against fp32.

Each training configuration runs in a fresh subprocess, so nothing one leaves allocated counts for the
next. The subprocess builds the model (``bert-base`` by default), applies PEFT, creates AdamW, then resets
the kernel's peak-RSS counter (``/proc/self/clear_refs``; where that is not allowed, the peak since start
is used) and runs ``--steps`` MLM training steps (15% of positions labelled) under bf16 autocast. The
reported training memory is the peak RSS above the RSS of the ready model: gradients, optimizer state,
activations and autocast's bf16 weight copies, i.e. what fine-tuning adds to serving the model.

Allocator: glibc raises its mmap threshold each time a large mmapped block is freed, after which freed
multi-MB tensors stay in the heap, so the RSS peak measures the allocator's history as much as the
tensors (a frozen base, whose bf16 weight copies autocast makes anew at every call, suffers most). The
workers therefore run with a fixed threshold (``MALLOC_MMAP_THRESHOLD_=131072``, glibc's starting value)
so RSS follows live memory; both configurations run alike, and ``--malloc-default`` shows the raw figures.

    full   every parameter trains: fp32 gradients + two AdamW moments for all ~110M parameters
    lora   r=8 on W_q and W_v (Hu et al. 2021); the frozen base needs neither gradients nor moments

Target: LoRA <= 0.6x full. QLoRA is reported as the bytes of its NF4 base weights (the linears of the
stacks, with double-quantised scales) against the same weights in fp32; target <= 0.3x.

Usage:
    python benchmarks/peft_memory.py            # bert-base, batch 16 x 128, 3 steps
    python benchmarks/peft_memory.py --quick    # batch 4 x 64, 2 steps

Output: one line per configuration, the ratios, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/peft_memory.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import peak_bytes, reset_peak, rss_bytes  # noqa: E402

import torch  # noqa: E402

CONFIGS = ("full", "lora")


# ---------------------------------------------------------------------------------------- one configuration
def worker(args) -> dict:
    import lmforge
    from lmforge.peft import PeftConfig, apply_peft

    torch.manual_seed(0)
    model = lmforge.build_model(args.preset).train()
    if args.worker == "lora":
        model = apply_peft(model, PeftConfig(method="lora", r=8, alpha=16, targets=["q", "v"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (args.batch, args.seq), generator=g)
    labels = ids.masked_fill(torch.rand(ids.shape, generator=g) > 0.15, -100)

    gc.collect()
    before = rss_bytes()
    exact = reset_peak()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    peak = peak_bytes()
    return {
        "config": args.worker, "trainable": sum(p.numel() for p in params), "rss_model_mb": before / 2**20,
        "peak_mb": peak / 2**20, "train_mb": (peak - before) / 2**20, "peak_reset": exact,
        "step_s": min(times), "loss": float(loss),
    }


def run_config(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, "--preset", args.preset, "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps)]
    env = dict(os.environ)
    if not args.malloc_default:  # see the module docstring
        env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{name} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def qlora_bytes(preset: str) -> tuple[int, int]:
    import lmforge
    from lmforge.peft.qlora import base_weight_bytes, quantize_base

    model = lmforge.build_model(preset)
    quantize_base(model)
    return base_weight_bytes(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="bert-base")
    parser.add_argument("--batch", type=int, default=None, help="default 16 (4 with --quick)")
    parser.add_argument("--seq", type=int, default=None, help="default 128 (64 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="default 3 (2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="batch 4 x 64, 2 steps")
    parser.add_argument("--malloc-default", action="store_true",
                        help="keep glibc's adaptive mmap threshold (RSS then includes freed heap memory)")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = (4, 64, 2) if args.quick else (16, 128, 3)  # a size given explicitly wins (the smoke test's tiny runs)
    args.batch, args.seq, args.steps = (given or size for given, size in zip((args.batch, args.seq, args.steps), sizes))
    if args.worker:
        print(json.dumps(worker(args)))
        return

    results = {name: run_config(name, args) for name in CONFIGS}
    ratio = results["lora"]["train_mb"] / results["full"]["train_mb"]
    stored, full_bytes = qlora_bytes(args.preset)
    q_ratio = stored / full_bytes

    print(f"peak training memory above the loaded model: {args.preset}, batch {args.batch} x {args.seq}, "
          f"bf16 autocast, AdamW, {args.steps} steps (torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"glibc mmap threshold {'adaptive' if args.malloc_default else 'fixed'})")
    labels = {"full": "full fine-tuning", "lora": "LoRA r=8 on q, v"}
    for name, r in results.items():
        print(f"  {labels[name]:<18} {r['trainable']:>12,} trainable  {r['train_mb']:8.0f} MB  "
              f"(model {r['rss_model_mb']:.0f} MB, peak {r['peak_mb']:.0f} MB, {r['step_s']:.1f} s/step)")
    print(f"  LoRA / full = {ratio:.2f}  (target <= 0.6) {'OK' if ratio <= 0.6 else 'MISSED'}")
    print(f"QLoRA NF4 base weights: {stored / 2**20:.1f} MB vs {full_bytes / 2**20:.1f} MB fp32 = {q_ratio:.3f}x "
          f"(target <= 0.3) {'OK' if q_ratio <= 0.3 else 'MISSED'}")
    print(json.dumps({"benchmark": "peft_memory", "preset": args.preset, "batch": args.batch, "seq": args.seq,
                      "steps": args.steps, "malloc": "default" if args.malloc_default else "fixed-mmap-threshold",
                      "runs": results, "lora_over_full": round(ratio, 4),
                      "qlora_nf4_bytes": stored, "fp32_bytes": full_bytes, "qlora_over_fp32": round(q_ratio, 4)}))


if __name__ == "__main__":
    main()
