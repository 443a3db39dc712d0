"""Serving under load: requests/s, generated tokens/s, time to first token and per-token latency of
``lmforge serve`` with continuous batching, against the same load served one request at a time.

Two random models, each served by a ``lmforge serve`` subprocess on loopback:

    gpt-tiny    lmforge's preset (6 layers, d_model 384), built directly
    gpt2-shape  an HF ``GPT2LMHeadModel`` of GPT-2's shape (12 layers, d_model 768), converted by ``lmforge.from_hf``

Each gets ``--requests`` streamed completions of ``--prompt-tokens``-token prompts and exactly ``--new-tokens``
new tokens (``ignore_eos``), sent by a bounded client (a fixed number of requests in flight: the concurrency)
at concurrency 1 (the same load served one request at a time), 4 and 16, against one server with
``--max-batch`` equal to the highest concurrency. Per request: time to first token
(TTFT: submission to the first streamed text) and per-token latency ((end - first token) / (tokens - 1)).

Usage:
    python benchmarks/serve_load.py                  # both models, 64 requests, 32 + 64 tokens
    python benchmarks/serve_load.py --quick          # gpt-tiny, 8 requests, 16 new tokens: a smoke test

Output: one line per (model, concurrency), then one JSON line (``speedup_vs_one_at_a_time``: tokens/s at the
highest concurrency over concurrency 1, per model).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers  # noqa: E402

quiet_transformers()

import torch  # noqa: E402

import lmforge  # noqa: E402
from lmforge.datasets import load as load_dataset  # noqa: E402
from lmforge.tokenization import train_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _corpus(folder: Path) -> tuple[Path, list[str]]:
    rows = load_dataset("rt-sentiment", "train")
    texts = [r["text"] for r in rows]
    path = folder / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path, texts


def build_models(folder: Path, names: list[str], vocab: int) -> tuple[dict[str, Path], list[str]]:
    corpus, texts = _corpus(folder)
    tok = train_tokenizer([corpus], kind="byte-bpe", family="gpt", vocab_size=vocab, show_progress=False)
    torch.manual_seed(0)
    out = {}
    if "gpt-tiny" in names:
        model = lmforge.build_model("gpt-tiny", vocab_size=len(tok), max_seq_len=256, dropout=0.0)
        out["gpt-tiny"] = lmforge.save(model, folder / "gpt-tiny", tokenizer=tok)
    if "gpt2-shape" in names:
        import transformers as hf

        config = hf.GPT2Config(vocab_size=len(tok), n_embd=768, n_layer=12, n_head=12, n_positions=256)
        out["gpt2-shape"] = lmforge.save(lmforge.from_hf(hf.GPT2LMHeadModel(config).eval()), folder / "gpt2-shape",
                                         tokenizer=tok)
    return out, texts


def prompts(folder: Path, texts: list[str], n: int, length: int) -> list[str]:
    """``n`` prompts of about ``length`` tokens: the first ``length`` tokens of corpus lines, decoded."""
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.load(folder)
    joined = " ".join(texts)
    ids = tok.encode(joined, add_special_tokens=False)
    return [tok.decode(ids[i * length:(i + 1) * length]) for i in range(n)]


class Server:
    def __init__(self, folder: Path, max_batch: int, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", "serve", "--model", f"m={folder}",
                                      "--port", str(self.port), "--max-batch", str(max_batch), "--max-queue", "1024"],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("lmforge serve exited")
                time.sleep(0.2)
        raise RuntimeError("lmforge serve did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def one_request(url: str, prompt: str, new_tokens: int) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif first is None and any(c.get("text") for c in event["choices"]):
                first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    return {"ttft": first - start, "per_token": (end - first) / max(tokens - 1, 1), "tokens": tokens,
            "start": start, "end": end}


def load(url: str, ps: list[str], new_tokens: int, concurrency: int) -> dict:
    one_request(url, ps[0], 2)  # warm-up: the first forward pays one-off costs
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:  # at most `concurrency` requests in flight
        results = list(pool.map(lambda p: one_request(url, p, new_tokens), ps))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)

    def pct(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]

    ttft = [r["ttft"] for r in results]
    per_token = [r["per_token"] for r in results]
    return {"concurrency": concurrency, "requests": len(results), "wall_s": wall, "req_s": len(results) / wall,
            "tok_s": tokens / wall, "ttft_p50": statistics.median(ttft), "ttft_p99": pct(ttft, 0.99),
            "token_ms_p50": 1000 * statistics.median(per_token), "token_ms_p99": 1000 * pct(per_token, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="gpt-tiny only, 8 requests, 16 new tokens")
    parser.add_argument("--models", nargs="+", default=None, choices=("gpt-tiny", "gpt2-shape"))
    parser.add_argument("--requests", type=int, default=None, help="requests per load (64; quick: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length in tokens (32)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per request (64; quick: 16)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None, help="loads to run (1 4 16; quick: 1 4)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="the server's torch threads")
    args = parser.parse_args()
    models = args.models or (["gpt-tiny"] if args.quick else ["gpt-tiny", "gpt2-shape"])
    n = args.requests or (8 if args.quick else 64)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    levels = args.concurrency or ([1, 4] if args.quick else [1, 4, 16])
    result = {"benchmark": "serve_load", "requests": n, "prompt_tokens": args.prompt_tokens, "new_tokens": new_tokens,
              "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folders, texts = build_models(Path(tmp), models, vocab=512 if args.quick else 8192)
        for name, folder in folders.items():
            ps = prompts(folder, texts, n, args.prompt_tokens)
            rows = []
            server = Server(folder, max(levels), args.threads)
            try:
                for c in sorted(set(levels) | {1}):
                    row = load(server.url, ps, new_tokens, c)
                    rows.append(row)
                    print(f"{name:10s} concurrency={c:<2d} {row['req_s']:6.2f} req/s {row['tok_s']:8.1f} tok/s  "
                          f"TTFT p50/p99 {row['ttft_p50']:.3f}/{row['ttft_p99']:.3f} s  "
                          f"per token p50/p99 {row['token_ms_p50']:.1f}/{row['token_ms_p99']:.1f} ms", flush=True)
            finally:
                server.stop()
            # concurrency 1 is the same load served one request at a time
            result["models"][name] = {"rows": rows, "speedup_vs_one_at_a_time": rows[-1]["tok_s"] / rows[0]["tok_s"]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
