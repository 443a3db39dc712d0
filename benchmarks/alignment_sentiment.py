"""Ziegler et al. (2019)'s positive-continuation task on the shipped data, for PPO, DPO and GRPO; and GRPO on a
verifiable arithmetic reward.

    policy    --policy DIR: the gpt-tiny pre-trained on the bundled corpus (with --quick: a toy gpt trained here
              for --pretrain-steps on rt-sentiment's training reviews, with a tokenizer trained on them)
    reward    --reward DIR: a classifier fine-tuned on rt-sentiment (MiniLM, through ``lmforge finetune``); the
              reward is its positive probability (with --quick: a toy classifier on the policy's body)
    prompts   the first --opening-words words of each review: rt-sentiment train for training (PPO/GRPO prompts,
              make-pairs), rt-sentiment test for evaluation (never used in training)

For the policy before alignment and after each method (``--methods ppo,dpo,grpo``; DPO trains on the pairs that
``make-pairs`` samples from the policy and scores with the reward): the mean reward of greedy and of sampled
continuations of the test openings, the KL to the reference per sequence (log pi - log pi_ref summed over a
continuation, averaged over the samples), the perplexity of the continuations under the reference (a fluency
check: a hacked reward shows as text the reference finds unlikely), a few sample continuations, and the CPU
seconds of each stage. ``--arithmetic``: GRPO on sums with an exact-answer reward; the distinct problems
are split once, and the accuracy (greedy, exact answer) before and after is measured on the held-out ones,
which GRPO never samples.

Prints one JSON object last (and writes it to OUT/result.json)::

    $ python benchmarks/alignment_sentiment.py --policy runs/gpt-tiny/model --reward runs/rt-minilm/best \\
          --steps 200 --out /tmp/align
    $ python benchmarks/alignment_sentiment.py --quick --out /tmp/align-quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers, single_thread_pools  # noqa: E402

quiet_transformers()
single_thread_pools()  # a shared CPU: one thread unless OMP_NUM_THREADS says otherwise

import torch  # noqa: E402

from lmforge import checkpoint  # noqa: E402
from lmforge.align.config import AlignConfig  # noqa: E402
from lmforge.align.dpo import sequence_logps  # noqa: E402
from lmforge.align.grpo import arithmetic_prompts, exact_answer_reward  # noqa: E402
from lmforge.align.logprobs import PromptEncoder  # noqa: E402
from lmforge.align.pairs import make_pairs  # noqa: E402
from lmforge.align.run import run_align  # noqa: E402
from lmforge.align.scorers import ModelReward  # noqa: E402
from lmforge.generation.generate import generate  # noqa: E402
from lmforge.tasks.base import pad_batch  # noqa: E402
from lmforge.tasks.data import read_table  # noqa: E402
from lmforge.training.config import TrainConfig  # noqa: E402


def openings(split: str, words: int, limit: int | None) -> list[dict]:
    table = read_table(f"rt-sentiment:{split}")
    rows = []
    for i, row in enumerate(table.rows):
        parts = str(row["text"]).split()
        if len(parts) > words:  # an opening that leaves the review something to say
            rows.append({"prompt": " ".join(parts[:words]), "where": table.where(i)})
    return rows[:limit] if limit else rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows), encoding="utf-8")
    return path


@torch.no_grad()
def score_policy(model, reference, tok, prompts: list[dict], reward, new_tokens: int, seed: int,
                 samples: int = 3) -> dict:
    """Mean reward, KL to the reference and reference perplexity of greedy and sampled continuations."""
    model.eval()
    encoder = PromptEncoder(model, tok)
    ids = [encoder.prompt(p["prompt"]) for p in prompts]
    result = {}
    for strategy in ("greedy", "sample"):
        out = generate(model, ids, strategy=strategy, max_new_tokens=new_tokens, seed=seed)
        responses = [seq[:int(n)] for seq, n in zip(out.sequences.tolist(), out.lengths.tolist())]
        texts = tok.decode_batch(responses)
        scores = reward([p["prompt"] for p in prompts], texts, prompts)
        rows = [x + r for x, r in zip(ids, responses)]
        input_ids, attention = pad_batch(rows, tok.pad_id)
        mask = pad_batch([[0] * len(x) + [1] * len(r) for x, r in zip(ids, responses)], 0)[0]
        batch = {"input_ids": input_ids, "attention_mask": attention, "response_mask": mask}
        pol, ref = sequence_logps(model, batch), sequence_logps(reference, batch)
        n = float(mask[:, 1:].sum())
        result[strategy] = {"reward": sum(scores) / len(scores), "kl": float((pol - ref).mean()),
                            "ppl_ref": math.exp(-float(ref.sum()) / max(n, 1))}
        result[strategy]["samples"] = [p["prompt"] + " |" + t for p, t in zip(prompts[:samples], texts[:samples])]
    return result


@torch.no_grad()
def arithmetic_accuracy(model, tok, problems: list[dict]) -> float:
    """Share of ``problems`` whose greedy answer is exact."""
    model.eval()
    encoder = PromptEncoder(model, tok)
    out = generate(model, [encoder.prompt(p["prompt"]) for p in problems], strategy="greedy", max_new_tokens=4)
    texts = tok.decode_batch([s[:int(n)] for s, n in zip(out.sequences.tolist(), out.lengths.tolist())])
    return sum(exact_answer_reward([], texts, problems)) / len(problems)


def arithmetic_split(held_out: int, seed: int) -> tuple[list[dict], list[dict]]:
    """The distinct problems of :func:`arithmetic_prompts` (single digits, + and -), shuffled by ``seed`` and
    split into training problems and ``held_out`` evaluation problems."""
    import random

    unique = {row["prompt"]: row for row in arithmetic_prompts(20_000, seed=seed)}
    rows = sorted(unique.values(), key=lambda r: r["prompt"])
    random.Random(seed).shuffle(rows)
    return rows[held_out:], rows[:held_out]


def write_problems(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def toy_policy(work: Path, steps: int, seed: int) -> Path:
    """--quick: a tokenizer and a tiny gpt trained on rt-sentiment's training reviews (causal LM)."""
    import lmforge
    from lmforge.objectives import build_objective
    from lmforge.tokenization import train_tokenizer
    from lmforge.training import Trainer

    texts = [str(r["text"]) for r in read_table("rt-sentiment:train").rows]
    corpus = work / "reviews.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    tok = train_tokenizer([corpus], kind="byte-bpe", vocab_size=400, family="gpt", min_frequency=2,
                          show_progress=False)
    torch.manual_seed(seed)
    model = lmforge.build_model("gpt-tiny", n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=tok.vocab_size,
                                max_seq_len=64, dropout=0.0, **{k: v for k, v in tok.special_token_ids().items()
                                                               if k.endswith("_token_id")})
    flat = [t for text in texts for t in tok.encode(text + "\n", add_special_tokens=False)]
    blocks = torch.tensor(flat[:len(flat) // 33 * 33]).view(-1, 33)
    data = [blocks[i:i + 16] for i in range(0, len(blocks) - 16, 16)]
    cfg = TrainConfig(max_steps=steps, lr=3e-3, warmup=0, eval_every=0, progress=False, tensorboard=False,
                      precision="fp32", schedule="constant", save_every=steps)
    Trainer(model, build_objective("clm", pad_token_id=tok.pad_id), data, cfg, out=work / "pretrain",
            tokenizer=tok).fit()
    return work / "pretrain" / "model"


def toy_reward(work: Path, policy: Path, steps: int) -> Path:
    """--quick: a classifier on the policy's body, fine-tuned on rt-sentiment (labels 0/1)."""
    from lmforge.tasks import TaskSpec
    from lmforge.tasks.finetune import finetune

    cfg = TrainConfig(max_steps=steps, lr=1e-3, batch_size=16, eval_every=steps, save_every=steps, progress=False,
                      tensorboard=False, precision="fp32", schedule="constant")
    finetune(str(policy), TaskSpec(task="classify", max_length=64), "rt-sentiment:train", "rt-sentiment:dev",
             config=cfg, out=work / "reward")
    return work / "reward" / "model"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", help="the pre-trained gpt-tiny model folder (required unless --quick)")
    p.add_argument("--reward", help="the rt-sentiment classifier task folder (required unless --quick)")
    p.add_argument("--out", required=True, help="working folder: runs, pairs, prompts")
    p.add_argument("--quick", action="store_true", help="toy policy and reward trained here; few steps")
    p.add_argument("--methods", default="ppo,dpo,grpo", help="comma-separated: ppo, dpo, grpo")
    p.add_argument("--arithmetic", action="store_true", help="also GRPO on the arithmetic task (accuracy)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of each method")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate of each method (unless set below)")
    for m in ("ppo", "dpo", "grpo", "arithmetic"):
        p.add_argument(f"--{m}-lr", type=float, default=None, help=f"learning rate of {m} (default: --lr)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                   help="the methods' training precision")
    p.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
    p.add_argument("--pairs", help="DPO: train on this pairs file (made by make-pairs) instead of making one")
    p.add_argument("--pair-prompts", type=int, default=None,
                   help="training openings make-pairs samples (default: enough for --steps x --batch-size pairs)")
    p.add_argument("--kl-coef", type=float, default=0.1, help="PPO's (starting) KL penalty coefficient")
    p.add_argument("--kl-horizon", type=int, default=10000,
                   help="PPO's adaptive KL horizon: the coefficient moves by up to 0.2 x sequences / horizon a rollout")
    p.add_argument("--ppo-epochs", type=int, default=4, help="PPO/GRPO passes over each rollout")
    p.add_argument("--group", type=int, default=4, help="GRPO's samples per prompt")
    p.add_argument("--kl-beta", type=float, default=0.04, help="GRPO's KL weight")
    p.add_argument("--arithmetic-steps", type=int, default=None, help="steps of the arithmetic GRPO (default --steps)")
    p.add_argument("--arithmetic-group", type=int, default=8, help="arithmetic GRPO: samples per problem")
    p.add_argument("--arithmetic-prompts", type=int, default=8, help="arithmetic GRPO: problems per rollout")
    p.add_argument("--arithmetic-held-out", type=int, default=64, help="problems kept out of training, scored")
    p.add_argument("--batch-size", type=int, default=16, help="pairs (DPO) or sequences (PPO/GRPO) per step")
    p.add_argument("--opening-words", type=int, default=4, help="words of a review that make its prompt")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens per continuation")
    p.add_argument("--train-prompts", type=int, default=None, help="training openings to use (default: all)")
    p.add_argument("--eval-prompts", type=int, default=200, help="test openings to evaluate on")
    p.add_argument("--k", type=int, default=4, help="make-pairs: samples per opening")
    p.add_argument("--kl-target", type=float, default=6.0, help="PPO's adaptive KL target (nats per sequence)")
    p.add_argument("--pretrain-steps", type=int, default=200, help="--quick: steps of the toy policy")
    p.add_argument("--reward-steps", type=int, default=100, help="--quick: steps of the toy classifier")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        defaults = {"steps": 4, "train_prompts": 16, "eval_prompts": 8, "new_tokens": 6, "batch_size": 4,
                    "arithmetic_held_out": 8, "arithmetic_prompts": 2, "group": 2}
        for key, value in defaults.items():
            if p.get_default(key) == getattr(args, key):
                setattr(args, key, value)
        args.lr = args.lr if args.lr != p.get_default("lr") else 1e-3
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    cpu: dict[str, float] = {}

    def timed(name, fn, *a, **kw):
        start = time.process_time()
        value = fn(*a, **kw)
        cpu[name] = round(time.process_time() - start, 2)
        return value

    policy = Path(args.policy) if args.policy else timed("pretrain", toy_policy, work, args.pretrain_steps, args.seed)
    reward_dir = Path(args.reward) if args.reward else timed("reward", toy_reward, work, policy, args.reward_steps)
    if not (args.policy or args.quick) or not (args.reward or args.quick):
        p.error("--policy and --reward are required without --quick")
    reward = ModelReward(reward_dir, kind="prob")
    reference, tok = checkpoint.load_body(policy)
    reference.eval()
    train = openings("train", args.opening_words, args.train_prompts)
    test = openings("test", args.opening_words, args.eval_prompts)
    prompts_file = write_jsonl(work / "train_prompts.jsonl", train)
    result: dict = {"benchmark": "alignment_sentiment", "eval_prompts": len(test), "train_prompts": len(train),
                    "before": timed("eval_before", score_policy, reference, reference, tok, test, reward,
                                    args.new_tokens, args.seed)}

    def config(name: str, steps: int | None = None, batch_size: int | None = None) -> TrainConfig:
        steps = steps or args.steps
        lr = getattr(args, f"{name}_lr") if getattr(args, f"{name}_lr") is not None else args.lr
        return TrainConfig(out=str(work / name), max_steps=steps, lr=lr, batch_size=batch_size or args.batch_size,
                           warmup=0, schedule="constant", eval_every=0, save_every=steps, progress=False,
                           tensorboard=False, seed=args.seed, weight_decay=0.0, precision=args.precision)

    common = dict(policy=str(policy), max_new_tokens=args.new_tokens)
    for method in [m for m in args.methods.split(",") if m]:
        if method == "dpo":
            if args.pairs:
                pairs = Path(args.pairs)
                result["pairs"] = {"file": str(pairs), "pairs": sum(1 for line in open(pairs) if line.strip())}
            else:
                pairs = work / "pairs.jsonl"
                sources = train[:args.pair_prompts or args.steps * args.batch_size]
                counts = timed("make_pairs", make_pairs, reference, PromptEncoder(reference, tok), sources, reward,
                               pairs, k=args.k, max_new_tokens=args.new_tokens, seed=args.seed)
                result["pairs"] = {**counts, "prompts": len(sources)}
            align = AlignConfig(method="dpo", policy=str(policy), train=str(pairs), beta=args.beta)
        elif method == "ppo":
            align = AlignConfig(method="ppo", prompts=str(prompts_file), reward=str(reward_dir), kl_coef=args.kl_coef,
                                kl_target=args.kl_target, kl_horizon=args.kl_horizon, n_prompts=args.batch_size,
                                ppo_epochs=args.ppo_epochs, **common)
        else:
            align = AlignConfig(method="grpo", prompts=str(prompts_file), reward=str(reward_dir), group=args.group,
                                n_prompts=max(1, args.batch_size // args.group), kl_beta=args.kl_beta,
                                ppo_epochs=args.ppo_epochs, **common)
        trained = timed(f"train_{method}", run_align, config(method), align)
        model = checkpoint.load(trained.model_dir)
        result[method] = timed(f"eval_{method}", score_policy, model, reference, tok, test, reward, args.new_tokens,
                               args.seed)
    if args.arithmetic:
        problems, held_out = arithmetic_split(args.arithmetic_held_out, args.seed)
        align = AlignConfig(method="grpo", policy=str(policy), prompts=str(write_problems(work / "problems.jsonl",
                            problems)), reward="lmforge.align.grpo:exact_answer_reward", group=args.arithmetic_group,
                            max_new_tokens=4, n_prompts=args.arithmetic_prompts, kl_beta=args.kl_beta,
                            ppo_epochs=args.ppo_epochs)
        before = arithmetic_accuracy(reference, tok, held_out)
        trained = timed("train_arithmetic", run_align,
                        config("arithmetic", args.arithmetic_steps, args.arithmetic_prompts * args.arithmetic_group),
                        align)
        after = arithmetic_accuracy(checkpoint.load(trained.model_dir), tok, held_out)
        result["arithmetic"] = {"training_problems": len(problems), "held_out_problems": len(held_out),
                                "accuracy_before": before, "accuracy_after": after}
    result["cpu_seconds"] = cpu
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    (work / "result.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
