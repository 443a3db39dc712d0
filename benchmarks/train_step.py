"""Training-step throughput: lmforge against Hugging Face transformers, side by side in one run.

For each family (tiny GPT, BERT and T5 shapes) both implementations run the same work: forward,
loss, backward and a fused-AdamW step, in bf16 autocast where the hardware has bf16 (CUDA, or a CPU with
AVX512-BF16 or AMX) and in fp32 elsewhere, where bf16 would be emulated at a fraction of fp32's speed. Each
measurement is the median over ``--repeats`` timed steps after warm-up; lmforge and HF steps are
interleaved so slow drifts of a noisy machine hit both alike. MFU is measured against a matmul peak in the
same precision that this script measures itself.

Usage:
    python benchmarks/train_step.py                # eager and compiled, all three families
    python benchmarks/train_step.py --quick        # fewer repeats, no compile
    python benchmarks/train_step.py --families gpt --compile-hf
    python benchmarks/train_step.py --families gpt --nanogpt ~/src/nanoGPT   # + nanoGPT as a reference

Output: one line per (family, mode) with tokens/s for both, the ratio, MFU and the minor page faults
per step of each (and with ``--nanogpt``, a line for nanoGPT against the same HF steps), then the matmul
peak measured again after the steps (with a warning when it moved by more than 15%: a busy host slows the
matmul-bound steps most, so that run's ratios and MFU are unreliable), then a JSON line.

``--nanogpt DIR`` times karpathy/nanoGPT's ``GPT`` (``DIR/model.py`` of a checkout, unmodified; nanoGPT is
not a package, so it is never a dependency) on the GPT shape, interleaved with the same lmforge and HF
steps and compiled in the same mode: a second, independent reference for the GPT shape, measured side by
side on the day rather than quoted from another run.

The allocator matters on a CPU. glibc serves large blocks with mmap and returns them on free, so a
step that allocates big temporaries page-faults them in again every step (the kernel zeroes each
page). HF's fp32 logits and log-softmax take tens of thousands of faults per step here; lmforge's
step far fewer. ``--malloc heap`` (glibc's ``mallopt``: no mmap, no trimming) keeps freed memory in
the heap for both implementations, which removes most faults and narrows the ratio; the default
measures what a process gets without tuning. Both are worth reading (docs/lab/performance.md explains them).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import io
import json
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/train_step.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import matmul_peak, quiet_transformers, steady, time_steps, train_precision  # noqa: E402

quiet_transformers()

import torch  # noqa: E402
import transformers as hf  # noqa: E402

from lmforge.config import ModelConfig  # noqa: E402
from lmforge.models import Transformer  # noqa: E402


def train_device() -> str:
    """CUDA when present, else the CPU (``common.train_precision(device)`` says in which precision)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------- the three shapes
@dataclass
class Case:
    family: str
    ours: torch.nn.Module
    theirs: torch.nn.Module
    batch_ours: dict
    batch_theirs: dict
    tokens: int
    flops_per_step: float


def _config(preset: str, vocab: int | None, **overrides) -> ModelConfig:
    """``preset`` without dropout (both sides run the same deterministic work), at ``vocab`` unless None."""
    if vocab is not None:
        overrides["vocab_size"] = vocab
    return ModelConfig.from_preset(preset, dropout=0.0, attn_dropout=0.0, **overrides)


def gpt_case(batch: int, seq: int, vocab: int | None, preset: str = "gpt-tiny") -> Case:
    cfg = _config(preset, vocab, max_seq_len=seq)
    vocab = cfg.vocab_size
    ours = Transformer(cfg)
    theirs = hf.GPT2LMHeadModel(
        hf.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                      n_head=cfg.n_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    )
    x = torch.randint(0, vocab, (batch, seq + 1))
    return Case(
        "gpt", ours, theirs,
        {"input_ids": x[:, :-1], "labels": x[:, 1:]},  # lmforge labels are pre-shifted
        {"input_ids": x[:, :-1], "labels": x[:, :-1]},  # HF shifts inside
        batch * seq, ours.flops_per_token(seq) * batch * seq,
    )


def bert_case(batch: int, seq: int, vocab: int | None, preset: str = "bert-tiny") -> Case:
    cfg = _config(preset, vocab, max_seq_len=seq)
    vocab = cfg.vocab_size
    ours = Transformer(cfg)
    theirs = hf.BertForMaskedLM(
        hf.BertConfig(vocab_size=vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                      num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff, max_position_embeddings=seq,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    )
    ids = torch.randint(0, vocab, (batch, seq))
    labels = torch.where(torch.rand(batch, seq) < 0.15, ids, torch.full_like(ids, -100))
    batch_in = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    return Case("bert", ours, theirs, batch_in, dict(batch_in), batch * seq, ours.flops_per_token(seq) * batch * seq)


def t5_case(batch: int, seq: int, vocab: int | None, preset: str = "t5-tiny") -> Case:
    cfg = _config(preset, vocab)
    vocab = cfg.vocab_size
    ours = Transformer(cfg)
    theirs = hf.T5ForConditionalGeneration(
        hf.T5Config(vocab_size=vocab, d_model=cfg.d_model, d_kv=cfg.dim_per_head, d_ff=cfg.d_ff,
                    num_layers=cfg.n_layers, num_decoder_layers=cfg.decoder_layers, num_heads=cfg.n_heads,
                    dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    )
    tgt_len = seq // 4  # span corruption's targets are ~a quarter of its inputs
    src, tgt = torch.randint(1, vocab, (batch, seq)), torch.randint(1, vocab, (batch, tgt_len))
    batch_in = {"input_ids": src, "labels": tgt}
    return Case("t5", ours, theirs, batch_in, dict(batch_in), batch * (seq + tgt_len),
                ours.train_flops(seq, tgt_len) * batch)


# ---------------------------------------------------------------------------- timing
def make_step(model: torch.nn.Module, batch: dict, device: str, compile_mode: str | None, bf16: bool = True):
    """``compile_mode``: None for eager, else a torch.compile mode; ``bf16``: under bf16 autocast, else fp32."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model, mode=compile_mode) if compile_mode else model
    batch = {k: v.to(device) for k, v in batch.items()}

    def step() -> float:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = run(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def nanogpt_file(checkout: str) -> str:
    """``checkout/model.py``, or exit with a message that says what to pass."""
    path = os.path.join(os.path.expanduser(checkout), "model.py")
    if not os.path.isfile(path):
        raise SystemExit(f"--nanogpt: {path} not found (pass the root of a karpathy/nanoGPT checkout)")
    return path


def nanogpt_model(checkout: str, case: Case, seq: int) -> torch.nn.Module:
    """nanoGPT's GPT from ``checkout/model.py``, the GPT case's shape, wrapped to take this script's batch
    (input_ids, labels) and return an object with ``.loss``."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt_file(checkout))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks the module's globals up by name
    spec.loader.exec_module(module)
    cfg = case.ours.config
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        gpt = module.GPT(module.GPTConfig(block_size=seq, vocab_size=cfg.vocab_size, n_layer=cfg.n_layers,
                                          n_head=cfg.n_heads, n_embd=cfg.d_model, dropout=0.0, bias=True))

    class NanoGPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = gpt

        def forward(self, input_ids, labels):  # nanoGPT's targets are pre-shifted, like lmforge's labels
            return types.SimpleNamespace(loss=self.gpt(input_ids.contiguous(), labels.contiguous())[1])

    return NanoGPT()


def keep_freed_memory() -> None:
    """glibc: serve every block from the heap and never trim it, so freed tensors are reused instead of
    unmapped and faulted in again (what jemalloc or tcmalloc would also give)."""
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        raise RuntimeError("mallopt refused the settings (not glibc?)")


def mfu_over_the_higher_peak(results: list[dict], peak: float, peak_end: float) -> float:
    """Rescale the rows' MFU (computed over ``peak``, the reading before the steps) to the higher of the two
    readings, and return it. A peak is a ceiling: the lower reading is the disturbed one, and MFU over it can pass
    100% (a neighbour that held a core while the first reading ran).

    >>> rows = [{"lmforge_mfu": 1.47, "hf_mfu": 0.99}]
    >>> mfu_over_the_higher_peak(rows, 227.0, 416.0), [round(v, 3) for v in rows[0].values()]
    (416.0, [0.802, 0.54])
    """
    mfu_peak = max(peak, peak_end)
    for row in results:
        for key in ("lmforge_mfu", "hf_mfu"):
            row[key] *= peak / mfu_peak
    return mfu_peak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="gpt,bert,t5", help="comma-separated subset of gpt,bert,t5")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=7, help="timed steps per implementation (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurements")
    p.add_argument("--compile-hf", action="store_true", help="also compile the HF model (else HF stays eager)")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                   help="torch.compile mode; on CPU max-autotune picks GEMM kernels per shape (default: %(default)s)")
    p.add_argument("--malloc", choices=("default", "heap"), default="default",
                   help="glibc as it comes, or 'heap': freed memory is kept for reuse, not unmapped (both "
                        "implementations; see the module docstring). Default: %(default)s")
    p.add_argument("--nanogpt", metavar="DIR", help="also time karpathy/nanoGPT's GPT from a checkout at DIR "
                   "on the GPT shape (see the module docstring)")
    p.add_argument("--quick", action="store_true", help="3 repeats, 1 warm-up, no compile")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup, args.no_compile = 3, 1, True
    if args.nanogpt:
        nanogpt_file(args.nanogpt)  # before minutes of measuring
    device = train_device()
    precision = train_precision(device)
    bf16 = precision == "bf16"
    if args.malloc == "heap":
        keep_freed_memory()
    torch.manual_seed(0)
    peak = matmul_peak(device, dtype=precision)
    builders = {"gpt": gpt_case, "bert": bert_case, "t5": t5_case}
    results = []
    say = (lambda *a: None) if args.json else print
    say(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"transformers={hf.__version__} precision={precision} {precision} matmul peak={peak:.0f} GFLOP/s "
        f"malloc={args.malloc}")
    modes = ["eager"] + ([] if args.no_compile else ["compile"])
    for family in args.families.split(","):
        for mode in modes:
            case = builders[family](args.batch, args.seq, args.vocab)
            compiled = mode == "compile"
            ours = make_step(case.ours, case.batch_ours, device, args.compile_mode if compiled else None, bf16)
            theirs = make_step(case.theirs, case.batch_theirs, device,
                               args.compile_mode if compiled and args.compile_hf else None, bf16)
            steps = [ours, theirs]
            if args.nanogpt and family == "gpt":
                nano = nanogpt_model(args.nanogpt, case, args.seq)
                steps.append(make_step(nano, case.batch_ours, device, args.compile_mode if compiled else None, bf16))
            warmup = args.warmup + (2 if compiled else 0)
            timed = time_steps(steps, device, warmup, args.repeats)
            (t_ours, f_ours), (t_theirs, f_theirs) = timed[:2]
            row = {
                "family": family, "mode": mode, "hf_mode": "compile" if compiled and args.compile_hf else "eager",
                "lmforge_tok_s": case.tokens / t_ours, "hf_tok_s": case.tokens / t_theirs,
                "ratio": t_theirs / t_ours,
                "lmforge_mfu": case.flops_per_step / t_ours / (peak * 1e9),
                "hf_mfu": case.flops_per_step / t_theirs / (peak * 1e9),
                "lmforge_faults": f_ours, "hf_faults": f_theirs,
            }
            say(f"{family:<5} {mode:<8} lmforge {row['lmforge_tok_s']:8.0f} tok/s  HF({row['hf_mode']}) "
                f"{row['hf_tok_s']:8.0f} tok/s  ratio {row['ratio']:.2f}x  "
                f"MFU lmforge {row['lmforge_mfu']:.1%} HF {row['hf_mfu']:.1%}  "
                f"faults/step {f_ours:,.0f} / {f_theirs:,.0f}")
            if len(timed) == 3:
                t_nano, f_nano = timed[2]
                row.update(nanogpt_tok_s=case.tokens / t_nano, nanogpt_ratio=t_theirs / t_nano,
                           lmforge_over_nanogpt=t_nano / t_ours, nanogpt_faults=f_nano)
                say(f"{'':<5} {'':<8} nanoGPT {row['nanogpt_tok_s']:8.0f} tok/s  ratio to HF {row['nanogpt_ratio']:.2f}x"
                    f"  lmforge / nanoGPT {row['lmforge_over_nanogpt']:.2f}x  faults/step {f_nano:,.0f}")
            results.append(row)
            sys.stdout.flush()
    peak_end = matmul_peak(device, dtype=precision)
    held = steady(peak, peak_end)
    mfu_peak = mfu_over_the_higher_peak(results, peak, peak_end)
    say(f"{precision} matmul peak after the run={peak_end:.0f} GFLOP/s")
    if not held:
        say(f"warning: the machine's matmul speed changed during the run ({peak:.0f} -> {peak_end:.0f} GFLOP/s); "
            "its ratios and MFU are unreliable: re-run on a quiet machine")
    print(json.dumps({"benchmark": "train_step", "device": device, "precision": precision, "peak_gflops": peak,
                      "peak_gflops_end": peak_end, "mfu_peak_gflops": mfu_peak,
                      "steady": held, "malloc": args.malloc, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
