"""Greedy parity through GGUF: ``lmforge convert to-gguf`` then llama-cpp-python gives ``lmforge generate``'s tokens.

A GPT-2-shaped decoder (gpt-tiny's recipe; ``--shape llama`` for llama-tiny's) is pre-trained for ``--steps``
steps on the shipped Austen corpus with a byte-level BPE of ``--vocab-size`` trained on the same text, so its
next-token distribution is a real one (greedy decoding on an untrained model only repeats a token). Then:

    lmforge      ``encode_prompt`` + ``generate`` (greedy, no EOS stop): what ``lmforge generate --ignore-eos`` runs
    llama.cpp    the model folder through ``lmforge convert to-gguf --outtype f32|f16|q8_0``, tokenised by the
                 tokenizer inside the file (``Llama.tokenize``), decoded by ``Llama.generate(temp=0, top_k=1)``

Each prompt gives ``--new-tokens`` (64) tokens. Per outtype it prints, per prompt, whether llama.cpp's prompt ids
equal lmforge's, how many new tokens are equal, and the length of the equal prefix; then the largest difference
between the two engines' logits over the prompt and the generated text, and one JSON line. The pass criterion
(the one the docs state) is f32: every prompt's tokens identical. f16 and q8_0 are reported, not required.

Usage:
    python benchmarks/gguf_parity.py                      # gpt shape, 1200 steps, work folder build/gguf_parity
    python benchmarks/gguf_parity.py --shape llama --work /tmp/gguf
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["It is a truth universally acknowledged, that",
           "Elinor was sitting at the window when",
           "\"My dear Mr. Bennet,\" said his lady to him one day,"]
SHAPES = {"gpt": ("gpt-tiny", dict(n_layers=4, d_model=128, n_heads=4, d_ff=512, max_seq_len=256)),
          "llama": ("llama-tiny", dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256, max_seq_len=256))}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def train(work: Path, shape: str, steps: int, vocab_size: int, threads: int) -> Path:
    """Tokenizer, shards and a pre-trained model folder under ``work`` (reused when already there)."""
    from lmforge.cli.main import main

    run = work / f"run-{shape}-{steps}"
    if (run / "model" / "config.json").is_file():
        return run / "model"
    corpus = work / "austen.txt"
    if not corpus.is_file():
        with gzip.open(ROOT / "src" / "lmforge" / "datasets" / "files" / "austen.txt.gz", "rt", encoding="utf-8") as f:
            corpus.write_text(f.read(), encoding="utf-8")
    tok, data = work / f"tok-{vocab_size}", work / f"data-{vocab_size}"
    if not (tok / "tokenizer.json").is_file():
        assert main(["tokenizer", "train", str(corpus), "--vocab-size", str(vocab_size), "--out", str(tok),
                     "--no-progress"]) == 0
    if not (data / "train").is_dir():
        assert main(["data", "prepare", str(corpus), "--tokenizer", str(tok), "--out", str(data), "--no-progress"]) == 0
    preset, overrides = SHAPES[shape]
    args = ["pretrain", "--model", preset, "--objective", "clm", "--tokenizer", str(tok), "--data", str(data),
            "--out", str(run), "--max-steps", str(steps), "--batch-size", "16", "--seq-len", "64", "--lr", "3e-3",
            "--warmup", "30", "--eval-every", str(steps), "--save-every", str(steps), "--final-checkpoint", "none",
            "--device", "cpu", "--precision", "fp32", "--no-progress", "--no-tensorboard", "--threads", str(threads),
            "--override", "dropout=0.0", "--override", f"vocab_size={vocab_size}"]
    args += [a for k, v in overrides.items() for a in ("--override", f"{k}={v}")]
    assert main(args) == 0
    return run / "model"


def lmforge_greedy(model, tok, prompts: list[str], new_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, new ids) per prompt, from the functions ``lmforge generate`` calls."""
    from lmforge.generation import GenerationConfig, generate
    from lmforge.generation.generate import encode_prompt

    config = GenerationConfig(max_new_tokens=new_tokens, strategy="greedy", ignore_eos=True)
    prompt_ids, new_ids = [], []
    for prompt in prompts:
        ids = encode_prompt(model, tok, prompt)
        out = generate(model, [ids], config=config, tokenizer=tok)
        prompt_ids.append(ids)
        new_ids.append(out.tolist()[0][:new_tokens])
    return prompt_ids, new_ids


def cli_matches(folder: Path, tok, prompts: list[str], new_ids: list[list[int]], new_tokens: int) -> list[bool]:
    """Whether ``lmforge generate --ignore-eos --no-stream`` prints the text of ``new_ids`` for each prompt."""
    import contextlib
    import io

    from lmforge.cli.main import main as lmforge_main

    same = []
    for prompt, ids in zip(prompts, new_ids):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert lmforge_main(["generate", "--model", str(folder), "--prompt", prompt, "--max-new-tokens",
                                 str(new_tokens), "--ignore-eos", "--no-stream"]) == 0
        same.append(out.getvalue() == tok.decode(ids) + "\n")
    return same


def llama_greedy(path: Path, prompts: list[str], new_tokens: int, threads: int):
    """(prompt ids, new ids, llama) per prompt from llama-cpp-python on the GGUF file."""
    import llama_cpp

    # An f32 KV cache: llama.cpp's default f16 cache rounds keys and values (a logit gap of ~4e-3 here).
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=threads, n_threads_batch=threads,
                          logits_all=True, verbose=False, type_k=llama_cpp.GGML_TYPE_F32,
                          type_v=llama_cpp.GGML_TYPE_F32)
    prompt_ids, new_ids = [], []
    for prompt in prompts:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        out = []
        llm.reset()
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == new_tokens:
                break
        prompt_ids.append(ids)
        new_ids.append(out)
    return prompt_ids, new_ids, llm


def logit_gap(model, llm, ids: list[int]) -> float:
    """Largest |lmforge logit - llama.cpp logit| over every position of ``ids``."""
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)])
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    return float(np.abs(theirs - ours).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="gpt")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=str(ROOT / "build" / "gguf_parity"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    import lmforge
    from lmforge.interop.gguf import convert_to_gguf
    from lmforge.tokenization import Tokenizer

    start = time.perf_counter()
    folder = train(work, args.shape, args.steps, args.vocab_size, args.threads)
    train_s = time.perf_counter() - start
    metrics = [json.loads(line) for line in (folder.parent / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [m for m in metrics if "eval_loss" in m]
    last_eval = f"eval loss {evals[-1]['eval_loss']:.3f} (ppl {evals[-1]['eval_ppl']:.1f})" if evals else "no eval"
    model, tok = lmforge.load(folder).eval(), Tokenizer.load(folder)
    ours_prompts, ours = lmforge_greedy(model, tok, PROMPTS, args.new_tokens)
    distinct = [len(set(ids)) for ids in ours]
    cli = cli_matches(folder, tok, PROMPTS, ours, args.new_tokens)
    print(f"lmforge generate (the CLI) prints these tokens' text: {cli}")
    print(f"model {folder} ({args.shape}, {model.num_parameters():,} parameters, {args.steps} steps, "
          f"{train_s:.0f} s to train, or reused); {last_eval}")
    print(f"lmforge greedy: {distinct} distinct tokens among the {args.new_tokens} of each prompt")
    for prompt, ids in zip(PROMPTS, ours):
        print(f"  {prompt!r} -> {tok.decode(ids)!r}")
    result = {"shape": args.shape, "steps": args.steps, "new_tokens": args.new_tokens, "prompts": PROMPTS,
              "eval_loss": evals[-1]["eval_loss"] if evals else None,
              "distinct_tokens": distinct, "cli_prints_same_text": cli, "outtypes": {}}
    for outtype in ("f32", "f16", "q8_0"):
        path = work / f"{args.shape}-{args.steps}-{outtype}.gguf"
        convert_to_gguf(folder, path, outtype=outtype, overwrite=True)
        theirs_prompts, theirs, llm = llama_greedy(path, PROMPTS, args.new_tokens, args.threads)
        rows = []
        for p, (a_p, b_p, a, b) in enumerate(zip(ours_prompts, theirs_prompts, ours, theirs)):
            prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            rows.append({"prompt_ids_equal": a_p == b_p, "equal_tokens": sum(x == y for x, y in zip(a, b)),
                         "equal_prefix": prefix, "identical": a_p == b_p and a == b,
                         "logit_gap": logit_gap(model, llm, a_p + a)})
            print(f"{outtype:5s} prompt {p + 1}: prompt ids equal {a_p == b_p}; {rows[-1]['equal_tokens']}/"
                  f"{args.new_tokens} new tokens equal, equal prefix {prefix}; max |logit gap| "
                  f"{rows[-1]['logit_gap']:.2e}")
        result["outtypes"][outtype] = {"bytes": path.stat().st_size, "rows": rows,
                                       "all_identical": all(r["identical"] for r in rows)}
        del llm
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("llama-cpp-python", "gguf", "torch"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    result.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), cpu=_cpu(),
                  command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                  versions=versions)
    ok = result["outtypes"]["f32"]["all_identical"] and all(cli)
    print(f"f32: {'all 3 prompts give identical tokens' if ok else 'MISMATCH'}")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
