"""Serving under load: requests/s, generated tokens/s, time to first token and per-token latency of
``lmforge serve`` with continuous batching, against the same load served one request at a time.

Two random models, each served by a ``lmforge serve`` subprocess on loopback:

    gpt-tiny    lmforge's preset (6 layers, d_model 384), built directly
    gpt2-shape  an HF ``GPT2LMHeadModel`` of GPT-2's shape (12 layers, d_model 768), converted by ``lmforge.from_hf``

Each model is served in each of ``--modes`` (fp32 and ``--quantize int8`` by default: one ``lmforge serve`` per
mode, all running at once) and each gets ``--requests`` streamed completions of ``--prompt-tokens``-token
prompts and exactly ``--new-tokens`` new tokens (``ignore_eos``, greedy), sent by a bounded asyncio client
(``c`` workers, so exactly ``c`` requests are in flight until the last ones: the concurrency) at concurrency 1
(the same load served one request at a time), 4 and 16, against a server with ``--max-batch`` equal to the highest concurrency. The levels and modes
take turns: the requests are split into ``--rounds`` parts (4: 16 requests each), and each round runs every
(mode, level) on its part, so a shared host's drift reaches every level and mode alike. Per request: time to
first token (TTFT: sending the request to the first streamed text) and per-token latency ((end - first token)
/ (tokens - 1)). The client reads the server-sent events off raw HTTP/1.1 (asyncio streams, chunked transfer
decoded), so it costs the shared CPU little.

Target: at concurrency 16, generated tokens/s at least 4x that of concurrency 1, with p99 TTFT under 2 s.

Usage:
    python benchmarks/serve_load.py                  # both models, 64 requests, 32 + 64 tokens, concurrency 1 4 16
    python benchmarks/serve_load.py --compile        # lmforge serve --compile: compiled decode steps
    python benchmarks/serve_load.py --modes fp32 int8 int4 bf16-int8   # more precisions side by side
    python benchmarks/serve_load.py --quick          # gpt-tiny, 8 requests, 16 new tokens, concurrency 1 4
    python benchmarks/serve_load.py --device cuda --models gpt2-shape --modes bf16   # on a GPU

Output: one line per (model, mode, concurrency), then one JSON line (each row names its ``mode``;
``speedup_vs_one_at_a_time``: tokens/s at the highest concurrency over concurrency 1, per model and mode, the
first mode's also per model).
"""

from __future__ import annotations

import argparse
import asyncio
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
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers, src_env  # noqa: E402

quiet_transformers()

import torch  # noqa: E402

import lmforge  # noqa: E402
from lmforge.datasets import load as load_dataset  # noqa: E402
from lmforge.tokenization import train_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# ``lmforge serve`` flags of each precision mode (the shared --dtype/--quantize of the inference commands)
MODES = {"fp32": [], "int8": ["--quantize", "int8"], "int4": ["--quantize", "int4"], "bf16": ["--dtype", "bf16"],
         "bf16-int8": ["--dtype", "bf16", "--quantize", "int8"]}


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
    """``n`` prompts of exactly ``length`` tokens: spans of the corpus whose text encodes back to ``length`` tokens."""
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.load(folder)
    ids = tok.encode(" ".join(texts), add_special_tokens=False)
    out, start = [], 0
    while len(out) < n and start + length <= len(ids):
        text = tok.decode(ids[start:start + length])
        if len(tok.encode(text, add_special_tokens=False)) == length:
            out.append(text)
        start += length
    if len(out) < n:
        raise SystemExit(f"the corpus holds only {len(out)} prompts of {length} tokens")
    return out


class Server:
    """``lmforge serve`` of one folder on a free loopback port, with ``threads`` torch threads (and ``flags``)."""

    def __init__(self, folder: Path, max_batch: int, threads: int, compile: bool = False, flags: tuple = (),
                 device: str = "cpu"):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = src_env(OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", "serve", "--model", f"m={folder}",
                                      "--port", str(self.port), "--max-batch", str(max_batch), "--max-queue", "1024",
                                      "--device", device,
                                      *(["--compile"] if compile else []), *flags],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        start = time.monotonic()
        while time.monotonic() - start < 1800:  # compiling the steps of a big model takes minutes on 2 cores
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                self.startup_s = time.monotonic() - start
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("lmforge serve exited")
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("lmforge serve did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _read_events(reader: asyncio.StreamReader):
    """The ``data:`` payloads of a server-sent event stream in an HTTP/1.1 response (chunked or not)."""
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the server answered {status.decode().strip()!r}")
    chunked = False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        chunked |= line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
    buffer = b""
    while True:
        if chunked:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size)
            await reader.readexactly(2)  # the chunk's CRLF
        else:
            data = await reader.read(65536)
            if not data:
                break
        buffer += data
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: "):
                yield event[6:]


async def one_request(port: int, prompt: str, new_tokens: int) -> dict:
    """One streamed completion: its TTFT, per-token latency and token count."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    first, tokens = None, 0
    try:
        async for data in _read_events(reader):
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif first is None and any(c.get("text") for c in event["choices"]):
                first = time.perf_counter()
    finally:
        writer.close()
    end = time.perf_counter()
    first = first or end
    return {"ttft": first - start, "per_token": (end - first) / max(tokens - 1, 1), "tokens": tokens}


async def _bounded(port: int, ps: list[str], new_tokens: int, concurrency: int, timeout: float) -> list[dict]:
    """Every prompt, by ``concurrency`` workers (each sends its next request when its last one ended)."""
    todo = list(enumerate(ps))
    results: list[dict | None] = [None] * len(ps)

    async def worker():
        while todo:
            i, prompt = todo.pop(0)
            results[i] = await one_request(port, prompt, new_tokens)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout)
    return results


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank).

    >>> percentile([4.0, 1.0, 3.0, 2.0], 0.99), percentile([4.0, 1.0, 3.0, 2.0], 0.5)
    (4.0, 3.0)
    """
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def loads(ports: dict[str, int], ps: list[str], new_tokens: int, levels: list[int], rounds: int,
          timeout: float = 1800) -> list[dict]:
    """The load of ``ps`` at each concurrency in ``levels`` against each server of ``ports`` (mode -> port),
    taking turns: the prompts are split into ``rounds`` parts, and in each round every (mode, level) serves its
    part (the order rotating from round to round), so a host that gets busier or quieter meanwhile moves every
    level and mode alike. Per (mode, level), mode-major: requests/s and generated tokens/s over all its rounds,
    TTFT and per-token percentiles over all its requests."""
    for port in ports.values():
        asyncio.run(one_request(port, ps[0], 2))  # warm-up: the first forward pays one-off costs
    parts = [ps[r::rounds] for r in range(rounds)]
    turns = [(mode, c) for c in levels for mode in ports]
    walls, results = {t: 0.0 for t in turns}, {t: [] for t in turns}
    load_first, load_last = {}, {}
    for r, part in enumerate(parts):
        for t in turns[r % len(turns):] + turns[:r % len(turns)]:
            load_first.setdefault(t, os.getloadavg()[0])
            t0 = time.perf_counter()
            results[t] += asyncio.run(_bounded(ports[t[0]], part, new_tokens, t[1], timeout))
            walls[t] += time.perf_counter() - t0
            load_last[t] = os.getloadavg()[0]
    rows = []
    for t in sorted(turns, key=lambda t: (list(ports).index(t[0]), t[1])):
        (mode, c), done, wall = t, results[t], walls[t]
        ttft = [x["ttft"] for x in done]
        per_token = [x["per_token"] for x in done]
        rows.append({"mode": mode, "concurrency": c, "requests": len(done), "wall_s": wall, "req_s": len(done) / wall,
                     "tok_s": sum(x["tokens"] for x in done) / wall, "ttft_p50": statistics.median(ttft),
                     "ttft_p99": percentile(ttft, 0.99), "token_ms_p50": 1000 * statistics.median(per_token),
                     "token_ms_p99": 1000 * percentile(per_token, 0.99), "load_before": round(load_first[t], 2),
                     "load_after": round(load_last[t], 2)})
    return rows


TARGET_SPEEDUP, TARGET_TTFT_P99 = 4.0, 2.0  # at concurrency 16 against concurrency 1; seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="gpt-tiny only, 8 requests, 16 new tokens, concurrency 1 4")
    parser.add_argument("--models", nargs="+", default=None, choices=("gpt-tiny", "gpt2-shape"))
    parser.add_argument("--requests", type=int, default=None, help="requests per load (64; quick: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length in tokens (32)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per request (64; quick: 16)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None, help="loads to run (1 4 16; quick: 1 4)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="the server's torch threads (default: this process's, one per core)")
    parser.add_argument("--compile", action="store_true", help="serve with lmforge serve --compile")
    parser.add_argument("--device", default="cpu", help="the servers' torch device: cpu (default) or cuda")
    parser.add_argument("--modes", nargs="+", default=["fp32", "int8"], choices=tuple(MODES),
                        help="precisions served side by side, one server each (lmforge serve --dtype/--quantize): "
                             "fp32 int8 by default")
    parser.add_argument("--rounds", type=int, default=None,
                        help="parts the requests are split into, the concurrencies taking turns part by part "
                             "(4; quick: 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one load may take at most (1800)")
    args = parser.parse_args()
    models = args.models or (["gpt-tiny"] if args.quick else ["gpt-tiny", "gpt2-shape"])
    n = args.requests or (8 if args.quick else 64)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    levels = sorted(set(args.concurrency or ([1, 4] if args.quick else [1, 4, 16])) | {1})
    rounds = args.rounds or (1 if args.quick else 4)
    if not 1 <= rounds <= n:
        raise SystemExit(f"--rounds {rounds}: give 1 to --requests ({n})")
    args.rounds = rounds
    modes = list(dict.fromkeys(args.modes))
    result = {"benchmark": "serve_load", "modes": modes, "requests": n, "prompt_tokens": args.prompt_tokens,
              "new_tokens": new_tokens,
              "threads": args.threads, "compile": args.compile, "device": args.device, "rounds": rounds,
              "target_speedup": TARGET_SPEEDUP,
              "target_ttft_p99_s": TARGET_TTFT_P99, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folders, texts = build_models(Path(tmp), models, vocab=512 if args.quick else 8192)
        for name, folder in folders.items():
            ps = prompts(folder, texts, n, args.prompt_tokens)
            servers = {}
            try:
                for mode in modes:
                    servers[mode] = Server(folder, max(levels), args.threads, compile=args.compile,
                                           flags=tuple(MODES[mode]), device=args.device)
                # concurrency 1 is the same load served one request at a time
                rows = loads({mode: s.port for mode, s in servers.items()}, ps, new_tokens, levels, args.rounds,
                             args.timeout)
                for row in rows:
                    print(f"{name:10s} {row['mode']:9s} concurrency={row['concurrency']:<2d} "
                          f"{row['req_s']:6.2f} req/s {row['tok_s']:8.1f} tok/s  "
                          f"TTFT p50/p99 {row['ttft_p50']:.3f}/{row['ttft_p99']:.3f} s  "
                          f"per token p50/p99 {row['token_ms_p50']:.1f}/{row['token_ms_p99']:.1f} ms  "
                          f"(load average {row['load_before']} -> {row['load_after']})", flush=True)
            finally:
                for server in servers.values():
                    server.stop()
            per_mode = {}
            for mode in modes:
                mine = [r for r in rows if r["mode"] == mode]
                top, speedup = mine[-1], mine[-1]["tok_s"] / mine[0]["tok_s"]
                per_mode[mode] = {"startup_s": round(servers[mode].startup_s, 1), "speedup_vs_one_at_a_time": speedup,
                                  "target_met": speedup >= TARGET_SPEEDUP and top["ttft_p99"] < TARGET_TTFT_P99}
                print(f"{name:10s} {mode:9s} concurrency {top['concurrency']} vs one at a time: {speedup:.2f}x "
                      f"tokens/s, p99 TTFT {top['ttft_p99']:.2f} s (target: >= {TARGET_SPEEDUP:g}x, "
                      f"< {TARGET_TTFT_P99:g} s)", flush=True)
            result["models"][name] = {"rows": rows, **per_mode[modes[0]], "modes": per_mode}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
