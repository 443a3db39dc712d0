"""Prompting quality of our own pre-trained tiny models, and instruction tuning of the tiny GPT.

Runs (``--runs``, comma-separated; default ``cloze,prefix,instruct``), all on models pre-trained by
``benchmarks/pretrain_curves.py`` (``--pretrained WORK``: its ``--work`` folder, holding WORK/<objective>/model):

    cloze             rt-sentiment with bert-tiny (WORK/mlm/model): "[MASK]" verbalizer (cloze prompts)
    prefix            rt-sentiment with gpt-tiny (WORK/clm/model): next-token verbalizer (prefix prompts)
    instruct          gpt-tiny instruction-tuned with ``lmforge finetune --task instruct`` on a demonstration set
                      built from the shipped tasks (lmforge.prompting.demonstrations), scored on held-out examples,
                      with the training phrasings and with a held-out phrasing, per kind
    instruct-scratch  the same from a randomly initialised gpt-tiny (what pre-training contributes)
    instruct-base     the pre-trained gpt-tiny, not tuned, on the same held-out sets (what tuning contributes)

cloze / prefix: every template of :data:`TEMPLATES` x {0, ``--shots``} demonstrations (balanced, from short
training reviews, a fresh draw per query) x {raw, contextual calibration}, scored on dev and test. Each line
is one setting's test accuracy; the setting with the best dev accuracy is marked, so the headline number
is chosen without looking at test. The majority-class baseline is the test split's most frequent label.

The tiny presets were pre-trained on 128-token windows (``--window``): positions past 128 never trained.
Instruction tuning's learning rate (``--instruct-lr``, default 1e-4) decides whether the tiny GPT learns the
tasks at all. On the sentiment demonstrations alone (7,000 rows, 600 steps x 16, from random weights, held-out
reviews) lr 1e-3 gave 0.525 (the answer did not depend on the review: the residual stream grew ~100x over the
token embeddings and the label logit stayed flat), 3e-4 gave 0.695 and 1e-4 0.745. The default mixture
(``--demo-train``) leaves the paraphrase kind out of training: with 7,000 paraphrase rows added, whose yes/no
answers the tiny model does not learn, sentiment fell back to 0.50 even at 1e-4 (its held-out rows are still
scored, as an untrained kind).

Demonstrations come from reviews of at most ``--demo-words`` words so that most k-shot prompts fit, and a
prompt that does not is cut from the left to the window (the verbalizer cuts at the model's
``max_seq_len``, which is set to the window here); the number of cut test prompts is printed.

Prints one line per setting and, last, a JSON object with every number::

    $ python benchmarks/prompt_quality.py --pretrained /tmp/curves --threads 1 --out /tmp/pq
    majority baseline (test): 0.5243
    cloze   t0 0-shot raw        dev 0.5402  test 0.5353
    ...
    instruct  sentiment seen: accuracy 0.6900 (choice 0.7000, valid 1.00, majority 0.50) ...
    {"cloze": {...}, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

SENTIMENT = {"0": "negative", "1": "positive"}
TEMPLATES = [  # (template, verbalizer): answers fill {z}; the text after {z} only reaches cloze prompts
    ("{x} It was {z}.", {"positive": ["great", "good"], "negative": ["terrible", "bad"]}),
    ("Review: {x} Overall, the movie was {z}.", {"positive": ["good", "great"], "negative": ["bad", "boring"]}),
    ("Movie review: {x} Sentiment: {z}.", {"positive": ["positive"], "negative": ["negative"]}),
]


def _model_folder(args, objective: str) -> Path:
    if not args.pretrained:
        raise SystemExit("needs --pretrained WORK (the --work folder of benchmarks/pretrain_curves.py)")
    folder = Path(args.pretrained) / objective / "model"
    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"{folder}: no pre-trained model; run benchmarks/pretrain_curves.py --work "
                         f"{args.pretrained} --only {objective}")
    return folder


def _rows(split: str, limit: int | None = None) -> list[dict]:
    from lmforge import datasets

    return [{"text": r["text"], "label": SENTIMENT[str(r["label"])]}
            for r in datasets.load("rt-sentiment", split)][:limit]


def _accuracy(gold: list[str], pred: list[str]) -> float:
    return sum(g == p for g, p in zip(gold, pred)) / len(gold)


def _label_probs(model, tok, template, verbalizer, rows, pool, shots: int, seed: int) -> tuple:
    """(raw, calibrated) (N, C) label probabilities, and how many prompts were cut to the model's window.

    The steps of :func:`lmforge.prompting.classify`, with the prompts scored once for both outputs (classify
    scores them again for each): demonstrations, verbalizer scores, and contextual calibration with the
    content-free inputs in the same demonstrations (the "[MASK]" one skipped for cloze prompts).
    """
    from lmforge.prompting import CONTENT_FREE, FewShot, calibrate, content_free_prediction

    fs = FewShot(template, verbalizer, k=shots, selection="balanced", seed=seed)
    contexts = [fs.context(pool, idx) for idx in fs.select(pool, rows)]
    prompts = [fs.prompt(c, r) for c, r in zip(contexts, rows)]
    raw = verbalizer.score(model, tok, prompts).softmax(-1)  # (N, C)
    free = [t for t in CONTENT_FREE if not (model.config.arch == "encoder" and t == "[MASK]")]
    cache = {c: content_free_prediction(verbalizer.score(model, tok, [fs.prompt(c, (t,)) for t in free]))
             for c in dict.fromkeys(contexts)}
    calibrated = torch.stack([calibrate(p[None], cache[c])[0] for p, c in zip(raw, contexts)])
    answer = verbalizer.answer(verbalizer.labels[0])
    cut = sum(len(tok.encode(p.with_answer(answer))) > model.config.max_seq_len for p in prompts)
    return raw, calibrated, cut


def prompt_classification(run: str, args) -> dict:
    """Every template x shots x calibration setting on dev and test; see the module docstring."""
    import lmforge
    from lmforge.prompting import Template, Verbalizer
    from lmforge.tokenization import Tokenizer

    folder = _model_folder(args, "mlm" if run == "cloze" else "clm")
    model = lmforge.load(folder).eval()
    tok = Tokenizer.load(folder)
    if args.window:
        # Prompt scoring cuts over-long prompts at max_seq_len; positions past the pre-training window hold
        # untrained embeddings, so the window is the length the model can really read.
        model.config.max_seq_len = min(model.config.max_seq_len, args.window)
    pool = [r for r in _rows("train") if len(r["text"].split()) <= args.demo_words]
    splits = {"dev": _rows("dev", args.dev_limit), "test": _rows("test", args.limit)}
    settings = {}
    for t, (text, answers) in enumerate(TEMPLATES):
        template, verbalizer = Template(text), Verbalizer(answers)
        for shots in (0, args.shots):
            start = time.perf_counter()
            names = {False: f"t{t} {shots}-shot raw", True: f"t{t} {shots}-shot calibrated"}
            for name in names.values():
                settings[name] = {}
            for split, rows in splits.items():
                raw, calibrated, cut = _label_probs(model, tok, template, verbalizer, rows, pool, shots, args.seed)
                gold = [r["label"] for r in rows]
                for calibrate, probs in ((False, raw), (True, calibrated)):
                    pred = [verbalizer.labels[i] for i in probs.argmax(-1).tolist()]
                    settings[names[calibrate]].update({split: _accuracy(gold, pred),
                                                       f"{split}_predicted": dict(Counter(pred)),
                                                       f"{split}_cut_prompts": cut})
            for name in names.values():
                scores = settings[name]
                scores["seconds_both"] = round(time.perf_counter() - start, 1)
                print(f"{run:<7} {name:<24} dev {scores['dev']:.4f}  test {scores['test']:.4f}  "
                      f"(test predicted {scores['test_predicted']}; {scores['test_cut_prompts']} test prompts "
                      f"cut to {model.config.max_seq_len} tokens)", flush=True)
    best = max(settings, key=lambda k: settings[k]["dev"])
    best_zero = max((k for k in settings if " 0-shot " in k), key=lambda k: settings[k]["dev"])
    best_few = max((k for k in settings if " 0-shot " not in k), key=lambda k: settings[k]["dev"])
    for label, key in (("dev-best", best), ("dev-best 0-shot", best_zero), (f"dev-best {args.shots}-shot", best_few)):
        print(f"{run:<7} {label + ':':<24} {key}: test {settings[key]['test']:.4f}", flush=True)
    return {"model": str(folder), "settings": settings, "best": best, "best_zero_shot": best_zero,
            "best_few_shot": best_few, "templates": TEMPLATES}


# ------------------------------------------------------------------ instruction tuning
def _per_kind(text: str) -> int | dict[str, int]:
    """``--demo-train``: an int, or ``kind=N`` pairs separated by commas."""
    from lmforge.prompting.demonstrations import KINDS

    if "=" not in text:
        return int(text)
    counts = {}
    for part in text.split(","):
        kind, _, n = part.partition("=")
        if kind.strip() not in KINDS or not n.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{part!r}: want KIND=N with KIND one of {', '.join(KINDS)}")
        counts[kind.strip()] = int(n)
    return {kind: counts.get(kind, 0) for kind in KINDS}


def _demonstrations(args) -> dict[str, Path]:
    """Train / dev / test-seen / test-unseen JSONL files of the demonstration set, in OUT/demonstrations/."""
    from lmforge.prompting.demonstrations import build_demonstrations, write_jsonl

    folder = Path(args.out) / "demonstrations"
    sets = {
        "train": build_demonstrations("train", per_kind=args.demo_train, max_words=args.max_words, seed=args.seed),
        "dev": build_demonstrations("dev", per_kind=32, max_words=args.max_words, seed=args.seed),
        # the same test examples twice: under a training phrasing, and under the held-out one
        "seen": build_demonstrations("test", per_kind=args.demo_test, max_words=args.max_words, seed=args.seed + 1),
        "unseen": build_demonstrations("test", per_kind=args.demo_test, max_words=args.max_words,
                                       phrasing="unseen", seed=args.seed + 1),
    }
    return {name: write_jsonl(rows, folder / f"{name}.jsonl") for name, rows in sets.items()}


def _tune(run: str, args, files: dict[str, Path], model: Path) -> tuple[Path, float]:
    """``lmforge finetune --task instruct`` in a subprocess; returns (the tuned model folder, seconds)."""
    out = Path(args.out) / run
    if out.exists():
        import shutil

        shutil.rmtree(out)
    steps = args.instruct_steps
    command = [sys.executable, "-m", "lmforge.cli.main", "finetune", "--task", "instruct", "--model", str(model),
               "--train", str(files["train"]), "--eval", str(files["dev"]), "--out", str(out),
               "--max-length", str(args.instruct_length), "--max-steps", str(steps),
               "--batch-size", str(args.batch_size), "--lr", str(args.instruct_lr), "--warmup", str(steps // 10),
               "--schedule", "cosine", "--eval-every", str(max(steps // 4, 1)), "--save-every", str(steps),
               "--keep-checkpoints", "1", "--precision", args.precision, "--seed", str(args.seed),
               "--no-progress", "--no-tensorboard"]
    if run == "instruct-scratch":
        command.append("--random-init")
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    print(f"[{run}] {' '.join(command[2:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=sys.stderr)
    return out / "model", time.perf_counter() - start


def instruction_tuning(run: str, args) -> dict:
    """Tune (unless ``instruct-base``), then score held-out examples per kind, seen and unseen phrasing."""
    import lmforge
    from lmforge.prompting.demonstrations import KINDS, evaluate_instructions
    from lmforge.prompting.instruct import ChatTemplate
    from lmforge.tokenization import Tokenizer

    base = _model_folder(args, "clm")
    files = _demonstrations(args)
    seconds = None
    folder = base
    if run != "instruct-base":
        folder, seconds = _tune(run, args, files, base)
    model = lmforge.load(folder).eval()
    tok = Tokenizer.load(folder)
    template = ChatTemplate.load(folder)
    result: dict = {"model": str(folder), "train_seconds": None if seconds is None else round(seconds, 1),
                    "train_rows": sum(1 for _ in open(files["train"], encoding="utf-8"))}
    for phrasing in ("seen", "unseen"):
        rows = [json.loads(line) for line in open(files[phrasing], encoding="utf-8")]
        for kind in KINDS:
            members = [r for r in rows if r["kind"] == kind]
            # a label needs a word or two; a verse up to ~100 tokens
            new_tokens = 8 if KINDS[kind].answers else args.max_new_tokens
            scores, responses = evaluate_instructions(model, tok, members, template, max_new_tokens=new_tokens,
                                                      batch_size=16)
            s = scores[kind]
            s["examples"] = [{"input": r["input"][:80], "gold": r["output"][:80], "said": x[:80]}
                             for r, x in zip(members[:3], responses[:3])]
            result[f"{kind}/{phrasing}"] = s
            if "accuracy" in s:
                shown = (f"accuracy {s['accuracy']:.4f} (choice {s['choice_accuracy']:.4f}, valid {s['valid']:.2f}, "
                         f"majority {s['majority']:.4f})")
            else:
                shown = f"BLEU {s['bleu']:.2f}  chrF {s['chrf']:.2f}"
            print(f"{run:<16} {kind:<10} {phrasing:<6} {shown}  n={s['n']}", flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="cloze,prefix,instruct")
    parser.add_argument("--pretrained", default=None, metavar="WORK",
                        help="the --work folder of benchmarks/pretrain_curves.py (WORK/mlm/model, WORK/clm/model)")
    parser.add_argument("--shots", type=int, default=4, help="demonstrations of the few-shot settings")
    parser.add_argument("--demo-words", type=int, default=10, help="few-shot pool: reviews of at most N words")
    parser.add_argument("--window", type=int, default=128,
                        help="cut prompts to the pre-training sequence length (0: the model's max_seq_len)")
    parser.add_argument("--limit", type=int, default=None, help="score the first N test rows only")
    parser.add_argument("--dev-limit", type=int, default=300, help="choose settings on the first N dev rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--demo-train", type=_per_kind, default="sentiment=7000,translate=500,paraphrase=0",
                        help="instruct: training rows per kind, N or KIND=N,... (default: %(default)s; the loss is a mean "
                        "over response tokens, so a kind with one-word answers gets little of it unless it has more "
                        "rows)")
    parser.add_argument("--demo-test", type=int, default=300, help="instruct: held-out rows per kind")
    parser.add_argument("--max-words", type=int, default=30,
                        help="instruct: inputs and outputs of at most N words (prompt + response fit ~128 tokens)")
    parser.add_argument("--instruct-steps", type=int, default=1200)
    parser.add_argument("--instruct-lr", type=float, default=1e-4, help="instruct: peak LR (see the module docstring)")
    parser.add_argument("--instruct-length", type=int, default=192, help="instruct: row length cap in tokens")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96, help="instruct: longest generated translation")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default="/tmp/lmforge-prompt-quality")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    test = _rows("test", args.limit)
    majority = Counter(r["label"] for r in test).most_common(1)[0][1] / len(test)
    print(f"majority baseline (test): {majority:.4f}", flush=True)
    results: dict = {"majority_baseline": majority}
    for name in [r.strip() for r in args.runs.split(",") if r.strip()]:
        if name in ("cloze", "prefix"):
            results[name] = prompt_classification(name, args)
        elif name in ("instruct", "instruct-scratch", "instruct-base"):
            results[name] = instruction_tuning(name, args)
        else:
            parser.error(f"unknown run {name!r}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
