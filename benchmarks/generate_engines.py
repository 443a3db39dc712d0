"""Greedy decoding across engines: lmforge in each precision mode against HF generate, CTranslate2 and llama.cpp.

One random GPT-2-shaped model (12 layers, d_model 768, 12 heads, GPT-2's vocabulary of 50,257) and OpenAI's
GPT-2 byte-level BPE (tests/fixtures/gpt2): prompts are 32-token spans of the bundled corpus, and every engine
greedily generates exactly ``--new-tokens`` (128) tokens after them, at batch 1 and 8 where the engine batches:

    lmforge fp32 eager      ``model.generate``
    lmforge fp32 compiled   ``model.generate(..., compile=True)``    (its first call compiles: ``first_call_s``)
    lmforge bf16            ``--dtype bf16``, eager and compiled (on a CPU without native bf16 every bf16 matmul
                            runs lmforge.nn.gemv.bf16_gemv, which widens the weights to fp32 in registers)
    lmforge int8/int4       ``--quantize int8`` (per row; on x86 the activations are rounded per call: to 8 bits
                            by lmforge.nn.gemv.int8_gemv at batch 1, to 7 bits by fbgemm at batch 8)
                            or ``int4`` (groups of 32, weight-only), eager and compiled, with bf16 activations
                            where the CPU has native bf16, else fp32 (``quantized_activations`` in the JSON)
    HF generate fp32        ``GPT2LMHeadModel.generate``: the reference of every lmforge row
    CTranslate2 fp32/int8   the HF folder converted by ``ctranslate2.converters.TransformersConverter``
                            (``quantization=None`` / ``"int8"``), ``Generator.generate_batch`` with top-k 1
    llama.cpp fp32/q8_0/q4_0  GGUF written by llama.cpp's own ``convert_hf_to_gguf.py`` (``--outtype f32`` /
                            ``q8_0``; q4_0 by ``llama_model_quantize`` from the f32 file), run by llama-cpp-python's
                            ``Llama(model_path, n_threads=...).generate(ids, temp=0, top_k=1)``: batch 1 only

Each external engine's row is paired with lmforge's fastest row of the same precision (eager or compiled).
Every engine gets ``--threads`` threads, and every row runs in a worker process of its own (one model per
process, as a user runs it; the engines' thread pools would otherwise share one process with torch's), timed
from here, request to answer. Per batch
size, the rows take turns (rotated each repeat) for ``--repeats`` timed runs after one untimed run each (which
also gives the tokens); a run during which other processes kept more than ``--max-others`` of the machine's
cores busy (/proc/stat against the CPU time of this process and its engine workers) is left out, unless fewer
than two quiet runs remain (then all count and the row says the machine was busy). Figures are the median (and
min, max) over the kept runs. Token agreement with HF's fp32 tokens is checked for the fp32 and int8 rows (fp32
should be identical; int8 shows how far rounding moves greedy choices: the share of equal tokens and the mean
length of the equal prefix).

Time to first token in a fresh process, for lmforge compiled: ``lmforge generate --compile`` (fp32, and with
``--quantize int8``) as a user runs it, from process start to its first, second and last streamed text and to its
exit (the first token comes from the eager prompt pass, the second from the decode step, so a compile shows there),
with an empty compile cache (``LMFORGE_COMPILE_CACHE`` pointing at a new folder) and then with the cache that run
left (once the layer it has packaged as it exits is packaged: lmforge.generation.packaged_region), against the eager
``lmforge generate``. Bare ``--compile`` does not wait for an int8 layer that is not cached (it decodes eagerly and
packages the layer as it exits); ``int8_compiled_now`` is ``--compile now``, which compiles the whole step before
its second token, and saves it for the next process. ``--ttft-repeats`` rounds (5), each figure the median with its
range. These single-shot processes are not filtered for a busy host: the range shows how much it moved them.

CTranslate2 and llama.cpp are optional (``pip install 'lmforge[engines]'``; ``make bench-engines`` installs them
and clones llama.cpp for its ``convert_hf_to_gguf.py``): an engine that is missing is skipped with the reason
printed and kept in the JSON (``skipped``), and ``lmforge bench`` runs this script only when the extra is there.

Usage:
    make bench-engines                                    # install the extra, fetch the converter, run this
    python benchmarks/generate_engines.py                 # GPT-2 shape, 32 + 128 tokens, batch 1 and 8, 5 repeats
    python benchmarks/generate_engines.py --quick         # 32 new tokens, 3 repeats, no compile
    python benchmarks/generate_engines.py --engines lmforge hf ctranslate2 --gguf-converter PATH

Output: one line per (batch, row), then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (  # noqa: E402
    OWN_PIDS, _version, corpus_text, quiet_spread, quiet_transformers, run_watched, src_env)

quiet_transformers()

import torch  # noqa: E402
import transformers as hf  # noqa: E402

import lmforge  # noqa: E402
from benchmarks.generate import build, runners  # noqa: E402
from lmforge.generation.compiled import PACKAGE_ENV  # noqa: E402
from lmforge.models.quantize import apply_precision  # noqa: E402
from lmforge.tokenization import Tokenizer  # noqa: E402
from lmforge.utils.machine import native_bf16  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT2_BPE = ROOT / "tests" / "fixtures" / "gpt2"  # OpenAI's encoder.json + vocab.bpe
PROMPT_LEN = 32
GPT2 = dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12)
TINY = dict(vocab_size=50257, n_embd=64, n_layer=2, n_head=2)  # --tiny: the smoke test's size
ENGINES = ("lmforge", "hf", "ctranslate2", "llama.cpp")
INSTALL = "pip install 'lmforge[engines]' (or make bench-engines)"
CONVERTER_ENV = "LLAMA_CPP_CONVERT"  # path of llama.cpp's convert_hf_to_gguf.py
DEFAULT_CONVERTER = ROOT / "build" / "engines" / "llama.cpp" / "convert_hf_to_gguf.py"  # make bench-engines' clone
CHECKED = ("fp32", "int8")  # precisions whose tokens are compared with HF fp32's
ACTIVATIONS = "bf16" if native_bf16("cpu") else "fp32"  # the dtype the int8 and int4 rows compute in


@dataclass
class Impl:
    """One row: ``run(ids (B, T)) -> new tokens (B, new)``; ``max_batch`` None when the engine batches."""

    name: str
    engine: str
    precision: str
    run: Callable[[torch.Tensor], torch.Tensor]
    max_batch: int | None = None


def missing(module: str) -> str | None:
    return None if importlib.util.find_spec(module) is not None else f"{module} is not installed: {INSTALL}"


# ------------------------------------------------------------------------------------------- the model, prompts
def hf_tokenizer():
    vocab = json.loads((GPT2_BPE / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split(" ")) for line in (GPT2_BPE / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
              if line]
    return hf.GPT2TokenizerFast(vocab=vocab, merges=merges)


def prompt_ids(n: int) -> tuple[torch.Tensor, str]:
    """``n`` prompts of PROMPT_LEN GPT-2 tokens (spans of the bundled corpus), and the text of the first, which
    encodes back to exactly its ids (for the fresh-process runs, which take text)."""
    tok = Tokenizer.load(GPT2_BPE)
    text = corpus_text(200_000)
    ids = tok.encode(text, add_special_tokens=False)
    spans = [ids[i:i + PROMPT_LEN] for i in range(0, len(ids) - PROMPT_LEN, PROMPT_LEN)]
    first = next(s for s in spans if tok.encode(tok.decode(s), add_special_tokens=False) == s)
    rows = [first] + [s for s in spans if s is not first][:n - 1]
    return torch.tensor(rows), tok.decode(first)


# ------------------------------------------------------------------------------------------- engines
def _lmforge_run(hf_dir: str, dtype: str | None, quantize: str | None, compiled: bool, threads: int,
                 new_tokens: int) -> Callable:
    torch.set_num_threads(threads)
    model = apply_precision(lmforge.from_hf(hf.GPT2LMHeadModel.from_pretrained(hf_dir)).eval(), dtype, quantize)

    def run(ids: list[list[int]]) -> list[list[int]]:
        return model.generate(torch.tensor(ids), max_new_tokens=new_tokens, ignore_eos=True,
                              compile=compiled).sequences.tolist()

    return run


def _hf_run(hf_dir: str, threads: int, new_tokens: int) -> Callable:
    torch.set_num_threads(threads)
    ref = hf.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    return lambda ids: runners(ref, None, torch.tensor(ids), new_tokens)["hf"]().tolist()


def lmforge_impls(hf_dir: Path, new_tokens: int, threads: int, compile: bool) -> list[Impl]:
    """lmforge's rows, each mode in a worker of its own, as a user runs one model per process (in one process,
    eight models' compiled graphs and packed weights slowed the compiled int8 row to half its speed alone)."""
    impls = []
    # The quantised rows compute in bf16 where the CPU has native bf16 (the weight-only kernels' fast setting),
    # else in fp32: emulated bf16 is slower than fp32, and int8's fbgemm kernel takes fp32 activations anyway.
    for quantize, precision in ((None, "fp32"), (None, "bf16"), ("int8", "int8"), ("int4", "int4")):
        dtype = precision if quantize is None else ACTIVATIONS
        for compiled in (False, True) if compile else (False,):
            name = f"lmforge {precision}{' compiled' if compiled else ' eager' if precision == 'fp32' else ''}"
            run = Worker(_lmforge_run, str(hf_dir), dtype, quantize, compiled, threads, new_tokens)
            impls.append(Impl(name, "lmforge", precision, run))
    return impls


def hf_impl(hf_dir: Path, new_tokens: int, threads: int) -> Impl:
    return Impl("HF generate fp32", "hf", "fp32", Worker(_hf_run, str(hf_dir), threads, new_tokens))


class Worker:
    """A row's engine and model in a process of their own, called like a row's ``run``: no thread pool can spin
    on the cores while the other rows run (llama.cpp's, in one process with torch, slowed every torch row by
    20-50%), and no row shares caches or compiled graphs with another. Its CPU time counts as this process's own
    in the quiet-run check (``common.OWN_PIDS``)."""

    def __init__(self, factory: Callable, *args):
        import multiprocessing

        # Forked from a server process that has imported torch, transformers' GPT-2 and lmforge once (and started
        # no thread pool, so forking it is safe): a worker starts without re-importing them all.
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["transformers.models.gpt2.modeling_gpt2", "lmforge.interop.hf",
                                    "lmforge.generation", "lmforge.models.quantize", "benchmarks.common"])
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, factory, args), daemon=True)
        self.process.start()
        OWN_PIDS.add(self.process.pid)
        status, value = self.conn.recv()  # "ready" once the engine has loaded
        if status != "ok":
            raise RuntimeError(value)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        self.conn.send(ids.tolist())
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return torch.tensor(value)


def _serve(conn, factory: Callable, args: tuple) -> None:
    """A worker's loop: build the engine's ``run(ids rows) -> token rows``, then answer each request."""
    try:
        run = factory(*args)
        conn.send(("ok", None))
    except Exception as exc:  # reported to the parent, which skips the engine with the reason
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            ids = conn.recv()
        except EOFError:  # the benchmark has ended
            return
        try:
            conn.send(("ok", run(ids)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _ctranslate2_run(folder: str, hf_dir: str, compute: str, threads: int, new_tokens: int) -> Callable:
    import ctranslate2

    tokenizer = hf.GPT2TokenizerFast.from_pretrained(hf_dir)
    generator = ctranslate2.Generator(folder, device="cpu", compute_type=compute, intra_threads=threads,
                                      inter_threads=1)

    def run(ids: list[list[int]]) -> list[list[int]]:
        # token strings, as generate_batch takes them (the conversion is a dictionary lookup per token)
        start = [tokenizer.convert_ids_to_tokens(row) for row in ids]
        out = generator.generate_batch(start, max_length=new_tokens, min_length=new_tokens, sampling_topk=1,
                                       beam_size=1, include_prompt_in_result=False)
        return [r.sequences_ids[0] for r in out]

    return run


def _llama_cpp_run(gguf: str, threads: int, new_tokens: int) -> Callable:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads,
                          n_ctx=PROMPT_LEN + new_tokens + 8, seed=0, verbose=False)

    def run(ids: list[list[int]]) -> list[list[int]]:
        llm.reset()  # no reuse of the previous run's prompt in the KV cache: every run prefills
        tokens = llm.generate(ids[0], top_k=1, temp=0.0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        return [list(itertools.islice(tokens, new_tokens))]

    return run


def ctranslate2_impls(hf_dir: Path, work: Path, tokenizer, new_tokens: int, threads: int) -> list[Impl]:
    import ctranslate2

    impls = []
    for precision, quantization, compute in (("fp32", None, "float32"), ("int8", "int8", "int8")):
        out = work / f"ct2-{precision}"
        ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(out), quantization=quantization,
                                                                          force=True)
        run = Worker(_ctranslate2_run, str(out), str(hf_dir), compute, threads, new_tokens)
        impls.append(Impl(f"CTranslate2 {precision}", "ctranslate2", precision, run))
    return impls


def llama_cpp_impls(hf_dir: Path, work: Path, converter: Path, new_tokens: int, threads: int) -> list[Impl]:
    import llama_cpp

    files = {}
    for outtype in ("f32", "q8_0"):
        files[outtype] = work / f"model-{outtype}.gguf"
        subprocess.run([sys.executable, str(converter), str(hf_dir), "--outfile", str(files[outtype]), "--outtype",
                        outtype], check=True, capture_output=True, text=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    files["q4_0"] = work / "model-q4_0.gguf"
    if llama_cpp.llama_model_quantize(str(files["f32"]).encode(), str(files["q4_0"]).encode(), params) != 0:
        raise RuntimeError("llama_model_quantize to q4_0 failed")
    impls = []
    for outtype, precision in (("f32", "fp32"), ("q8_0", "int8"), ("q4_0", "int4")):
        run = Worker(_llama_cpp_run, str(files[outtype]), threads, new_tokens)
        impls.append(Impl(f"llama.cpp {outtype}", "llama.cpp", precision, run, max_batch=1))
    return impls


def hf_folder(ref, work: Path) -> Path:
    """``ref`` saved with the GPT-2 tokenizer: what every worker loads, and the engines' converters read."""
    hf_dir = work / "hf"
    ref.save_pretrained(hf_dir)
    hf_tokenizer().save_pretrained(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    config.setdefault("n_ctx", config["n_positions"])  # GPT-2's own config has it, and the GGUF converter reads it
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return hf_dir


def external(args, hf_dir: Path, work: Path, skipped: dict[str, str]) -> list[Impl]:
    """The CTranslate2 and llama.cpp rows that can run here; the others go to ``skipped`` with the reason."""
    wanted = [e for e in ("ctranslate2", "llama.cpp") if e in args.engines]
    if not wanted:
        return []
    tokenizer = hf.GPT2TokenizerFast.from_pretrained(hf_dir)
    impls = []
    converter = Path(args.gguf_converter)
    reasons = {"ctranslate2": missing("ctranslate2"),
               "llama.cpp": missing("llama_cpp") or missing("gguf") or (
                   None if converter.is_file() else f"no llama.cpp converter at {converter}: make bench-engines "
                   f"fetches convert_hf_to_gguf.py, or pass --gguf-converter (or set ${CONVERTER_ENV})")}
    for engine in wanted:
        if reasons[engine]:
            skipped[engine] = reasons[engine]
            continue
        try:
            if engine == "ctranslate2":
                impls += ctranslate2_impls(hf_dir, work, tokenizer, args.new_tokens, args.threads)
            else:
                impls += llama_cpp_impls(hf_dir, work, converter, args.new_tokens, args.threads)
        except Exception as exc:  # a converter or engine that fails here: say why, measure the others
            detail = getattr(exc, "stderr", None) or str(exc)
            skipped[engine] = f"failed: {type(exc).__name__}: {detail.strip().splitlines()[-1][:200] if detail else ''}"
    for engine, why in skipped.items():
        print(f"skipping {engine}: {why}", flush=True)
    return impls


# ------------------------------------------------------------------------------------------- measuring
def agreement(expected: torch.Tensor, got: torch.Tensor) -> dict:
    """How far ``got`` (B, N) follows ``expected``: identical, the share of equal tokens, the mean equal prefix.

    >>> agreement(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 9, 4]]))
    {'identical': False, 'agree': 0.75, 'prefix': 2.0}
    """
    same = expected == got
    prefix = same.long().cumprod(dim=1).sum(dim=1).float().mean()
    return {"identical": bool(same.all()), "agree": round(float(same.float().mean()), 4),
            "prefix": round(float(prefix), 1)}


def bench_batch(impls: list[Impl], ids: torch.Tensor, new_tokens: int, repeats: int, max_others: float) -> list[dict]:
    batch = ids.shape[0]
    mine = [i for i in impls if i.max_batch is None or batch <= i.max_batch]
    tokens, first = {}, {}
    for impl in mine:  # one untimed run each: the warm-up (the compiled path compiles here), and the tokens
        t0 = time.perf_counter()
        tokens[impl.name] = impl.run(ids)
        first[impl.name] = round(time.perf_counter() - t0, 2)
    runs = run_watched([lambda impl=impl: impl.run(ids) for impl in mine], repeats=repeats, rotate=True)
    expected = tokens.get("HF generate fp32")
    rows = []
    for impl, timed in zip(mine, runs):
        spread = quiet_spread(timed, max_others)
        row = {"batch": batch, "impl": impl.name, "engine": impl.engine, "precision": impl.precision,
               "tok_s": {k: round(batch * new_tokens / spread[s], 1) for k, s in
                         (("median", "median"), ("min", "max"), ("max", "min"))},
               "ms_per_token": round(1000 * spread["median"] / new_tokens, 2), "first_call_s": first[impl.name],
               "runs": spread["runs"], "disturbed": spread["disturbed"], "quiet": spread["quiet"],
               "checked": impl.precision in CHECKED and expected is not None}
        if expected is not None:
            row.update(agreement(expected, tokens[impl.name]))
        rows.append(row)
    return rows


def pair(rows: list[dict]) -> None:
    """Give each external engine's row the lmforge row of its precision to be compared with (``partner``): the
    faster of the eager and compiled paths, as a user would pick."""
    lm: dict[tuple[int, str], str] = {}
    fastest: dict[tuple[int, str], float] = {}
    for r in rows:
        key = (r["batch"], r["precision"])
        if r["engine"] == "lmforge" and r["tok_s"]["median"] > fastest.get(key, -1.0):
            lm[key], fastest[key] = r["impl"], r["tok_s"]["median"]
    for r in rows:
        if r["engine"] not in ("lmforge", "hf") and (r["batch"], r["precision"]) in lm:
            r["partner"] = lm[(r["batch"], r["precision"])]


def fresh_process(folder: Path, prompt: str, new_tokens: int, threads: int, cache: Path | None,
                  extra: tuple[str, ...] = ()) -> dict:
    """``lmforge generate`` (``--compile`` when ``cache`` is given, compiling into it; ``extra`` flags) in a new
    process: seconds from its start to its first, second and last streamed text, and to its end."""
    env = src_env(**{"LMFORGE_COMPILE_CACHE": str(cache) if cache else "off", PACKAGE_ENV: "background"})
    cmd = [sys.executable, "-m", "lmforge.cli.main", "generate", "--model", str(folder), "--prompt", prompt,
           "--max-new-tokens", str(new_tokens), "--ignore-eos", "--threads", str(threads), *extra]
    start = time.perf_counter()
    compile_flag = [] if cache is None or "--compile" in extra else ["--compile"]
    proc = subprocess.Popen(cmd + compile_flag, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    marks = []
    while os.read(proc.stdout.fileno(), 65536):  # each streamed piece is flushed as it is chosen
        marks.append(time.perf_counter() - start)
    if proc.wait() != 0:
        raise RuntimeError(f"lmforge generate exited with {proc.returncode}")
    total = time.perf_counter() - start
    return {"first_output_s": round(marks[0], 2), "second_output_s": round(marks[1] if len(marks) > 1 else total, 2),
            "last_output_s": round(marks[-1], 2), "total_s": round(total, 2)}


def wait_for_packaging(cache: Path, timeout: float = 600.0) -> None:
    """Wait until the packaging a cold process started in ``cache`` as it exited is done (its exported programs under
    ``regions/building`` are gone; lmforge.generation.packaged_region), so that the warm process finds the package."""
    deadline = time.monotonic() + timeout
    while any(cache.glob("*/regions/building/*")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the background packaging in {cache} did not finish in {timeout:.0f} s")
        time.sleep(0.5)


def ttft(ours, prompt: str, new_tokens: int, threads: int, work: Path, repeats: int = 1) -> dict:
    """Fresh processes, ``repeats`` rounds: eager, then compiled fp32 and compiled ``--quantize int8``, each with an
    empty compile cache of its own and then with the cache that run left. Each figure is the median over the rounds,
    with its range (``*_range``: min, max) and the number of rounds (``runs``)."""
    folder = lmforge.save(ours, work / "lmforge", tokenizer=Tokenizer.load(GPT2_BPE))
    runs: dict[str, list[dict]] = {}
    for r in range(repeats):
        runs.setdefault("eager", []).append(fresh_process(folder, prompt, new_tokens, threads, None))
        for name, extra in (("compiled", ()), ("int8_compiled", ("--quantize", "int8")),
                            ("int8_compiled_now", ("--quantize", "int8", "--compile", "now"))):
            cache = work / f"compile-cache-{name}-{r}"
            runs.setdefault(f"{name}_cold", []).append(fresh_process(folder, prompt, new_tokens, threads, cache, extra))
            wait_for_packaging(cache)  # (a build beside the next process would slow it)
            runs.setdefault(f"{name}_warm", []).append(fresh_process(folder, prompt, new_tokens, threads, cache, extra))
            shutil.rmtree(cache, ignore_errors=True)
    out = {}
    for name, marks in runs.items():
        out[name] = {"runs": len(marks)}
        for key in ("first_output_s", "second_output_s", "last_output_s", "total_s"):
            values = sorted(m[key] for m in marks)
            out[name][key] = round(statistics.median(values), 2)
            out[name][key.removesuffix("_s") + "_range"] = [values[0], values[-1]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 3 repeats, no compile")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, d_model 64 model of GPT-2's vocabulary")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES),
                        help="engines to run (all; the missing ones are skipped with the reason)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt (128; quick: 32)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per row (5; quick: 3)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="threads of every engine (default: torch's, one per core)")
    parser.add_argument("--no-compile", action="store_true", help="skip lmforge's compiled path and its fresh-process "
                        "time to first token")
    parser.add_argument("--ttft-repeats", type=int, default=5,
                        help="rounds of fresh processes for the time to first token (5; each cold and then warm)")
    parser.add_argument("--max-others", type=float, default=0.1,
                        help="leave out runs during which other processes kept more than this share of the cores "
                             "busy (0.1)")
    parser.add_argument("--gguf-converter", default=os.environ.get(CONVERTER_ENV, str(DEFAULT_CONVERTER)),
                        help=f"llama.cpp's convert_hf_to_gguf.py (default: ${CONVERTER_ENV}, else {DEFAULT_CONVERTER})")
    args = parser.parse_args()
    args.new_tokens = args.new_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (3 if args.quick else 5)
    compile = not (args.no_compile or args.quick) and "lmforge" in args.engines
    torch.set_num_threads(args.threads)
    shape = TINY if args.tiny else GPT2
    ref, ours = build("cpu", shape, n_positions=max(256, PROMPT_LEN + args.new_tokens))
    ids, prompt = prompt_ids(max(args.batch_sizes))
    load = os.getloadavg()[0]
    skipped: dict[str, str] = {}
    result = {"benchmark": "generate_engines", "shape": shape, "prompt_len": PROMPT_LEN, "new_tokens": args.new_tokens,
              "repeats": repeats, "threads": args.threads, "max_others": args.max_others, "compile": compile,
              "quantized_activations": ACTIVATIONS,
              "versions": {p: _version(p) for p in ("torch", "transformers", "ctranslate2", "llama_cpp_python",
                                                     "gguf")}}
    print(f"greedy generation, {PROMPT_LEN}-token prompts, {args.new_tokens} new tokens, {args.threads} threads, "
          f"median of {repeats}; load average {load:.1f} on {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hf_dir = hf_folder(ref, work)
        impls = lmforge_impls(hf_dir, args.new_tokens, args.threads, compile) if "lmforge" in args.engines else []
        impls += [hf_impl(hf_dir, args.new_tokens, args.threads)] if "hf" in args.engines else []
        impls += external(args, hf_dir, work, skipped)
        rows = []
        for batch in args.batch_sizes:
            for row in bench_batch(impls, ids[:batch], args.new_tokens, repeats, args.max_others):
                rows.append(row)
                t = row["tok_s"]
                check = (f" | tokens {'identical' if row['identical'] else 'DIFFER'} (agree {row['agree']:.0%}, "
                         f"prefix {row['prefix']:.0f})" if row["checked"] else "")
                print(f"batch {batch}: {row['impl']:22s} {t['median']:8.1f} tok/s (min {t['min']:.1f}, max "
                      f"{t['max']:.1f}; {row['runs'] - row['disturbed']} of {row['runs']} runs quiet){check}",
                      flush=True)
        pair(rows)
        result["results"] = rows
        if compile:
            result["ttft"] = ttft(ours, prompt, args.new_tokens, args.threads, work, args.ttft_repeats)
            for name, t in result["ttft"].items():
                lo, hi = t["second_output_range"]
                print(f"fresh process, {name}: first text {t['first_output_s']:.2f} s, second "
                      f"{t['second_output_s']:.2f} s ({lo:.2f}-{hi:.2f}), all {args.new_tokens} tokens "
                      f"{t['last_output_s']:.2f} s, exit {t['total_s']:.2f} s; median of {t['runs']}", flush=True)
    result.update({"skipped": skipped, "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
