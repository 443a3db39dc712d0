"""lmforge on one CUDA GPU against its references, each table measured side by side in one process.

Sections (``--sections``, default all):

    train     GPT-2 124M training step, batch 16 x 1024, bf16 autocast + fused AdamW: lmforge eager and
              compiled, HF ``GPT2LMHeadModel`` eager and compiled, and karpathy/nanoGPT's ``model.py``
              compiled (``--nanogpt DIR``, a checkout; nanoGPT is not a package). Tokens/s and MFU.
    encoders  bert-base MLM (batch 32 x 512, 15% of positions labelled) and t5-base span corruption
              (batch 32, 512 source -> 114 target tokens) training steps, lmforge against HF, eager and compiled.
    generate  GPT-2 124M greedy generation, 32-token prompts, 128 new tokens, batch 1 and 8, bf16 weights:
              HF ``generate`` (dynamic cache), HF with its static cache and compiled forward, lmforge eager and
              lmforge compiled (static cache, CUDA graphs). The fraction of tokens equal to HF's is reported.
    memory    peak GPU memory of full fine-tuning, LoRA (r=8 on q, v) and QLoRA (NF4 base, LoRA r=8 on q, v)
              on a randomly initialised 1B Llama-shaped model (the ``llama-1b`` preset), batch 4 x 512, bf16
              autocast, AdamW (``torch.cuda.max_memory_allocated`` over three steps).

MFU is reported against the GPU's dense bf16 peak from its datasheet (989 TFLOP/s for the H100 SXM and H200)
and against the bf16 matmul rate this script measures on the card (8192^3, median of 20). Each training figure
is the median over ``--repeats`` interleaved steps after warm-up (the compiled ones warm up through their
compile). ``lmforge bench --device cuda`` runs this script and prints its table; the JSON records of its runs,
with their commands and dates, go to docs/lab/bench-gpu.json, from which docs/lab/performance.md's GPU section is
rendered.

Usage:
    python benchmarks/gpu.py --nanogpt /tmp/nanoGPT
    python benchmarks/gpu.py --sections generate,memory
    python benchmarks/gpu.py --quick --device cpu     # tiny shapes, a smoke test of the script itself

Output: one line per measured row, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import matmul_peak, quiet_transformers, sync, time_steps  # noqa: E402

quiet_transformers()

import torch  # noqa: E402
import transformers as hf  # noqa: E402

import lmforge  # noqa: E402
from benchmarks.train_step import bert_case, gpt_case, make_step, nanogpt_model, t5_case  # noqa: E402

SECTIONS = ("train", "encoders", "generate", "memory")
# Dense bf16 tensor-core peaks from NVIDIA's datasheets (without sparsity), by a substring of the device name.
DATASHEET_BF16_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.0,
                         "H100 NVL": 835.0, "A100": 312.0, "L4": 121.0}


def datasheet_peak(device: str) -> float | None:
    """The card's dense bf16 peak in TFLOP/s, or None for a card not in the table (or the CPU)."""
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)


def free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------------------------------- training
def train_rows(args, peaks: dict) -> list[dict]:
    """The GPT-2 table: every implementation's step interleaved with the others in one timing loop."""
    batch, seq = (2, 64) if args.quick else (16, 1024)
    case = gpt_case(batch, seq, None, preset="gpt-tiny" if args.quick else "gpt2")
    steps = {"lmforge eager": make_step(case.ours, case.batch_ours, args.device, None),
             "HF eager": make_step(case.theirs, case.batch_theirs, args.device, None)}
    if not args.no_compile:
        fresh = gpt_case(batch, seq, None, preset="gpt-tiny" if args.quick else "gpt2")  # models of their own
        steps["lmforge compiled"] = make_step(fresh.ours, case.batch_ours, args.device, "default")
        steps["HF compiled"] = make_step(fresh.theirs, case.batch_theirs, args.device, "default")
        if args.nanogpt:
            steps["nanoGPT compiled"] = make_step(nanogpt_model(args.nanogpt, case, seq), case.batch_ours,
                                                  args.device, "default")
    rows = timed_rows("train gpt2-124M", steps, case, args, peaks)
    if args.profile:
        for name in [n for n in steps if n != "HF eager"]:
            profile_step(name, steps[name], args)
    return rows


def profile_step(name: str, step, args) -> None:
    """Two steps under torch.profiler: the kernels by total device time, into ``--profile DIR``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            step()
        sync(args.device)
    sort = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
    folder = Path(args.profile)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"profile_{name.replace(' ', '_')}.txt").write_text(
        prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=90))


def timed_rows(table: str, steps: dict, case, args, peaks: dict) -> list[dict]:
    timed = time_steps(list(steps.values()), args.device, warmup=args.warmup, repeats=args.repeats, rotate=True)
    rows = []
    for name, (seconds, _) in zip(steps, timed):
        flops = case.flops_per_step / seconds
        row = {"table": table, "impl": name, "tok_s": case.tokens / seconds, "ms_per_step": seconds * 1e3,
               "tflops": flops / 1e12,
               "mfu_datasheet": flops / (peaks["datasheet_tflops"] * 1e12) if peaks["datasheet_tflops"] else None,
               "mfu_measured": flops / (peaks["measured_tflops"] * 1e12)}
        rows.append(row)
        mfu = f"MFU {row['mfu_datasheet']:.1%} of datasheet, " if row["mfu_datasheet"] is not None else "MFU "
        print(f"{table:<18} {name:<18} {row['tok_s']:>10,.0f} tok/s  {row['ms_per_step']:8.1f} ms/step  "
              f"{mfu}{row['mfu_measured']:.1%} of measured peak", flush=True)
    return rows


def encoder_rows(args, peaks: dict) -> list[dict]:
    rows = []
    for family, build, batch, seq, preset in (("bert-base MLM", bert_case, 32, 512, "bert-base"),
                                             ("t5-base span", t5_case, 32, 512, "t5-base")):
        if args.quick:
            batch, seq, preset = 2, 64, preset.replace("-base", "-tiny")
        modes = [m for m in args.encoder_modes.split(",") if not (args.no_compile and m == "compiled")]
        for mode in modes:
            case = build(batch, seq, None, preset=preset)
            compile_mode = "default" if mode == "compiled" else None
            steps = {f"lmforge {mode}": make_step(case.ours, case.batch_ours, args.device, compile_mode),
                     f"HF {mode}": make_step(case.theirs, case.batch_theirs, args.device, compile_mode)}
            rows += timed_rows(f"train {family}", steps, case, args, peaks)
            del case, steps
            free(args.device)
    return rows


# ------------------------------------------------------------------------------------------------- generation
def generate_rows(args) -> list[dict]:
    torch.manual_seed(0)
    shape = dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4) if args.quick else {}
    ref = hf.GPT2LMHeadModel(hf.GPT2Config(**shape, bos_token_id=None, eos_token_id=None)).eval()
    ours = lmforge.from_hf(ref).eval().to(args.device, torch.bfloat16)
    ref = ref.to(args.device, torch.bfloat16)
    new = 16 if args.quick else 128
    rows = []
    for batch in (1, 8):
        ids = torch.randint(0, ref.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(batch))
        ids = ids.to(args.device)
        mask = torch.ones_like(ids)

        def hf_run(static: bool):
            config = hf.GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                                         eos_token_id=None, pad_token_id=0,
                                         cache_implementation="static" if static else None)
            return lambda: ref.generate(ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]

        runs = {"HF generate": hf_run(False),
                "lmforge eager": lambda: ours.generate(ids, max_new_tokens=new, ignore_eos=True).sequences}
        if not args.no_compile:
            runs["HF static+compile"] = hf_run(True)
            runs["lmforge compiled"] = lambda: ours.generate(ids, max_new_tokens=new, ignore_eos=True,
                                                             compile=True).sequences
        first = {}
        for name, run in runs.items():  # the first call of each (the compiled ones compile here), timed alone
            sync(args.device)
            start = time.perf_counter()
            first[name] = (run(), time.perf_counter() - start)
        expected = first["HF generate"][0]
        timed = time_steps(list(runs.values()), args.device, warmup=1, repeats=args.generate_repeats or args.repeats,
                           rotate=True)
        for name, (seconds, _) in zip(runs, timed):
            got, again = first[name][0], runs[name]()  # the first call's tokens, and a call after the timed ones
            same = min(float((got == expected).float().mean()), float((again == expected).float().mean()))
            row = {"table": "generate gpt2-124M bf16", "impl": name, "batch": batch, "new_tokens": new,
                   "tok_s": batch * new / seconds, "ms_per_token": seconds / new * 1e3,
                   "first_call_s": first[name][1], "same_as_hf": same}
            rows.append(row)
            print(f"generate batch {batch}  {name:<18} {row['tok_s']:>9,.0f} new tok/s  "
                  f"{row['ms_per_token']:6.2f} ms/token  first call {row['first_call_s']:5.1f} s  "
                  f"tokens equal to HF generate: {row['same_as_hf']:.0%}", flush=True)
    return rows


# ------------------------------------------------------------------------------------------------- memory
def memory_rows(args) -> list[dict]:
    from lmforge.peft import PeftConfig, apply_peft

    preset, (batch, seq) = ("llama-tiny", (2, 64)) if args.quick else ("llama-1b", (4, 512))
    rows = []
    for name in ("full", "lora", "qlora"):
        free(args.device)
        torch.manual_seed(0)
        model = lmforge.build_model(preset).to(args.device).train()
        if name != "full":
            model = apply_peft(model, PeftConfig(method=name, r=8, alpha=16, targets=["q", "v"]))
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, fused=args.device == "cuda")
        ids = torch.randint(5, model.config.vocab_size, (batch, seq), device=args.device)
        sync(args.device)
        loaded = torch.cuda.memory_allocated() if args.device == "cuda" else 0
        for _ in range(3):
            with torch.autocast(args.device, dtype=torch.bfloat16):
                loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync(args.device)
        peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
        row = {"table": f"memory {preset}", "impl": name, "trainable": sum(p.numel() for p in params),
               "loaded_gib": loaded / 2**30, "peak_gib": peak / 2**30, "loss": loss.item()}
        rows.append(row)
        print(f"memory {preset} {name:<6} {row['trainable']:>14,} trainable  model loaded {row['loaded_gib']:6.2f} GiB"
              f"  peak {row['peak_gib']:6.2f} GiB  (loss {row['loss']:.3f})", flush=True)
        del model, optimizer, params, loss
    full = rows[0]["peak_gib"] or 1.0
    for row in rows:
        row["peak_over_full"] = row["peak_gib"] / full
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu with --quick to smoke-test the script")
    p.add_argument("--nanogpt", metavar="DIR", help="a karpathy/nanoGPT checkout: its compiled GPT joins the train table")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per implementation (median; default %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the compile happens here)")
    p.add_argument("--no-compile", action="store_true", help="skip every torch.compile row")
    p.add_argument("--encoder-modes", default="eager,compiled", help="the encoders section's tables, a comma-separated "
                   "subset of eager,compiled (default both; each table compares lmforge with HF in that mode)")
    p.add_argument("--generate-repeats", type=int, help="timed runs per generation row (default: --repeats)")
    p.add_argument("--quick", action="store_true", help="tiny shapes and 3 repeats: checks the script, measures nothing")
    p.add_argument("--profile", metavar="DIR", help="also profile two steps of each train-table implementation (but HF "
                   "eager) and write their kernel tables to DIR")
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    if set(args.encoder_modes.split(",")) - {"eager", "compiled"}:
        p.error(f"--encoder-modes {args.encoder_modes!r}: choose from eager, compiled")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU here (this benchmark is for a GPU machine)")
    if args.quick:
        args.repeats, args.warmup = 3, 1
    torch.backends.cuda.matmul.allow_tf32 = True  # what a user training on the GPU runs (bf16 autocast anyway)
    torch.backends.cudnn.allow_tf32 = True

    peaks = {"datasheet_tflops": datasheet_peak(args.device),
             "measured_tflops": matmul_peak(args.device, 512 if args.quick else 8192, repeats=20) / 1e3}
    record = {"benchmark": "gpu", "device": args.device, "torch": torch.__version__, "transformers": hf.__version__,
              **peaks, "rows": [], "errors": {}}
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        record.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                      cuda=torch.version.cuda, driver=_driver())
    print(f"device {record.get('gpu', args.device)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"transformers {hf.__version__}; bf16 peak: datasheet {peaks['datasheet_tflops']} TFLOP/s, "
          f"measured {peaks['measured_tflops']:.0f} TFLOP/s", flush=True)
    for section in sections:
        start = time.perf_counter()
        try:
            if section == "train":
                record["rows"] += train_rows(args, peaks)
            elif section == "encoders":
                record["rows"] += encoder_rows(args, peaks)
            elif section == "generate":
                record["rows"] += generate_rows(args)
            else:
                record["rows"] += memory_rows(args)
        except Exception as exc:  # one failing section must not lose the others' numbers
            traceback.print_exc()
            record["errors"][section] = f"{type(exc).__name__}: {exc}"[:2000]
        record.setdefault("section_seconds", {})[section] = round(time.perf_counter() - start, 1)
        free(args.device)
    print(json.dumps(record))
    return 1 if record["errors"] else 0


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
