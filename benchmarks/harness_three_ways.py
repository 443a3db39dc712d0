"""One trained gpt-tiny, lmforge's local lm_eval task set, three ways: the metrics must agree.

    hf                 lm_eval's ``hf`` backend on the ``lmforge convert to-hf`` export of the folder
    local-completions  lm_eval's OpenAI-completions client against ``lmforge serve`` on the folder
                       (token-id prompts, ``echo`` with ``logprobs``: how a served model is scored)
    lmforge            ``lmforge evaluate --harness`` (lmforge.evaluation.harness) on the folder itself

The tasks are :mod:`lmforge.evaluation.harness_tasks`: ``lmforge_next_verse`` (multiple choice, acc and
acc_norm) and ``lmforge_austen_ppl`` (rolling loglikelihood over passages longer than the context: word and
byte perplexity, bits per byte). All three use the same rolling window W: local-completions sends each window
as one prompt with ``max_tokens: 1``, and a server holds prompt + completion within the context L, so its
``max_length`` is L (lm_eval keeps windows of max_length - 2 tokens) and the other two get ``max_length`` W = L - 2.

Without ``--model`` it pre-trains one (``lmforge pretrain --model gpt-tiny`` on the shipped corpus minus the
chapters the perplexity task holds out, plus the KJV training verses, whose test verses the multiple-choice
task reads). Printed: each metric for the three ways, their largest relative difference, each way's wall time
(model load included), then one JSON line.

Usage:
    python benchmarks/harness_three_ways.py --work /tmp/h3 --steps 300
    python benchmarks/harness_three_ways.py --work /tmp/h3 --model /tmp/h3/run/model --limit 50
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from benchmarks.common import quiet_transformers, src_env  # noqa: E402

TASKS = ("lmforge_next_verse", "lmforge_austen_ppl")
WAYS = ("hf", "local-completions", "lmforge")


def lmforge(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "lmforge.cli.main", *args], check=True, env=src_env())


def pretrain(work: Path, args) -> Path:
    """gpt-tiny pre-trained on the corpus less the held-out chapters, and the KJV training verses."""
    from lmforge import datasets
    from lmforge.evaluation.harness_tasks import HELD_OUT_CHAPTERS

    model = work / "run" / "model"
    if model.is_dir():
        return model
    text = work / "train.txt"
    if not text.is_file():
        docs = [r["text"] for r in datasets.load("corpus")][:-HELD_OUT_CHAPTERS]
        chapters = defaultdict(list)
        for verse in datasets.load("kjv-rv1909", "train"):
            chapters[verse["ref"].rsplit(".", 1)[0]].append(verse["en"])
        docs += [" ".join(v) for v in chapters.values()]
        text.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs) + "\n", encoding="utf-8")
    lmforge("tokenizer", "train", str(text), "--out", str(work / "tok"), "--no-progress")
    lmforge("data", "prepare", str(text), "--tokenizer", str(work / "tok"), "--out", str(work / "data"),
            "--no-progress", "--overwrite")
    lmforge("pretrain", "--model", "gpt-tiny", "--objective", "clm", "--data", str(work / "data"), "--out",
            str(work / "run"), "--max-steps", str(args.steps), "--batch-size", str(args.train_batch), "--lr", "1e-3",
            "--warmup", str(max(1, args.steps // 15)), "--precision", "fp32", "--no-progress", "--no-tensorboard",
            "--eval-every", str(args.steps), "--final-checkpoint", "weights", "--seed", "0")
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", "serve", "--model", f"m={model}", "--port",
                             str(port)], env=src_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmforge serve exited with {proc.returncode}: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"lmforge serve did not answer /health in 120 s: see {log}")


def run_way(way: str, model: Path, hf: Path, args, window: int, context: int) -> tuple[dict, float]:
    """(lm_eval's results, wall seconds) of one way."""
    import lm_eval

    from lmforge.evaluation import harness

    common = dict(limit=args.limit, bootstrap_iters=0, log_samples=False, random_seed=0, numpy_random_seed=0,
                  torch_random_seed=0, fewshot_random_seed=0)
    start = time.perf_counter()
    if way == "lmforge":
        results = harness.evaluate(model, args.tasks, limit=args.limit, batch_size=args.batch_size,
                                   max_length=window, bootstrap_iters=0)
        return results, time.perf_counter() - start
    with harness.offline():
        manager = harness.task_manager(args.tasks)
        tasks = harness.load_tasks(manager, args.tasks)
        if way == "hf":
            results = lm_eval.simple_evaluate(
                model="hf", model_args={"pretrained": str(hf), "max_length": window, "dtype": "float32",
                                        "device": "cpu"},
                batch_size=args.batch_size, tasks=tasks, task_manager=manager, **common)
            return results, time.perf_counter() - start
        port = free_port()
        server = start_server(model, port, args.work / "serve.log")
        try:
            results = lm_eval.simple_evaluate(
                model="local-completions",
                model_args={"model": "m", "base_url": f"http://127.0.0.1:{port}/v1/completions",
                            "tokenizer": str(hf), "tokenizer_backend": "huggingface", "tokenized_requests": True,
                            "max_length": context, "batch_size": args.batch_size, "num_concurrent": 1,
                            "max_retries": 1},
                tasks=tasks, task_manager=manager, **common)
        finally:
            server.terminate()
            server.wait(30)
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the run, the export and the logs")
    parser.add_argument("--model", type=Path, default=None, help="a trained decoder folder (default: pre-train one)")
    parser.add_argument("--steps", type=int, default=300, help="pre-training steps without --model")
    parser.add_argument("--train-batch", type=int, default=4, help="pre-training batch size")
    parser.add_argument("--tasks", type=lambda s: s.split(","), default=list(TASKS))
    parser.add_argument("--ways", type=lambda s: s.split(","), default=list(WAYS))
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    quiet_transformers()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model or pretrain(args.work, args)
    hf = args.work / "hf"
    if not (hf / "config.json").is_file():
        lmforge("convert", "to-hf", str(model), str(hf))

    from lmforge.checkpoint import load
    from lmforge.evaluation import harness

    context = load(model).config.max_seq_len
    window = context - 2
    rows: dict[str, dict[str, float]] = defaultdict(dict)
    seconds = {}
    for way in args.ways:
        results, seconds[way] = run_way(way, model, hf, args, window, context)
        for task, values in harness.metrics(results).items():
            for metric, value in values.items():
                rows[f"{task} {metric}"][way] = value
        print(f"{way}: {seconds[way]:.1f} s", flush=True)

    def spread(values: dict[str, float]) -> float:
        v = list(values.values())
        return (max(v) - min(v)) / max(abs(x) for x in v) if max(abs(x) for x in v) else 0.0

    width = max(len(k) for k in rows)
    print(f"{'metric':{width}s}  " + "  ".join(f"{w:>17s}" for w in args.ways) + "  max rel diff")
    for key, values in rows.items():
        print(f"{key:{width}s}  " + "  ".join(f"{values.get(w, float('nan')):17.8g}" for w in args.ways)
              + f"  {spread(values):.2e}")
    print("wall s    " + "  ".join(f"{w} {seconds[w]:.1f}" for w in args.ways))
    worst = max(spread(v) for v in rows.values())
    print(json.dumps({"model": str(model), "window": window, "context": context, "limit": args.limit,
                      "metrics": rows, "max_rel_diff": worst, "wall_s": seconds, "agree_1e-4": worst <= 1e-4}))


if __name__ == "__main__":
    main()
