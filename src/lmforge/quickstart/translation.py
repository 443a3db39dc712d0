"""Stage 8: fine-tune the pre-trained t5-tiny to translate English verses into Spanish, then translate.

T5's text-to-text recipe: the source gets a task prefix (``translate English to Spanish: ``), the model
is trained with teacher forcing on the target, and decodes greedily over its KV cache. The parallel data
is the KJV / Reina-Valera 1909 verse pairs (their archaic Spanish is what the model learns). Scores are
sacrebleu's BLEU and chrF on test verses the model never saw; a few translations are kept for the report.

Decoding costs as much as training here (one decoder pass per output token), so the stage keeps a share
of its time for it and translates test verses in batches until that share is used (at least one batch).
"""

from __future__ import annotations

import time
from typing import Any

from lmforge.checkpoint import load_body
from lmforge.quickstart.context import Context, check_stopped
from lmforge.quickstart.probe import Probe, probe_finetuning
from lmforge.quickstart.runs import drop_checkpoints, loss_drop, measured_step_seconds, plan_run, read_curve, warmup_for
from lmforge.tasks import metrics as task_metrics
from lmforge.tasks.data import Table, read_table
from lmforge.tasks.finetune import finetune
from lmforge.tasks.inference import predict
from lmforge.tasks.recipe import Recipe
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig

PREFIX = "translate English to Spanish: "
BATCH_SIZE = 16
LR = 1e-3  # T5's fine-tuning LR (constant 1e-3 in the paper); tiny models take it well
MAX_LENGTH, MAX_TARGET = 64, 48
TRAIN_ROWS = 8000  # a seeded sample of the 26,718 training pairs: more than a 10-minute budget gets through
TEST_ROWS = 500  # at most; as many as the decoding share of the time allows
DECODE_BATCH = 32
DECODE_SHARE = 0.3  # of the stage's time, kept for translating test verses
SHOWN = 3
MIN_STEPS = 8


def _spec():
    return TaskSpec(task="seq2seq", text_column="en", target_column="es", max_length=MAX_LENGTH,
                    max_target_length=MAX_TARGET, task_prefix=PREFIX)


def _tables(ctx: Context):
    import random

    train = read_table("kjv-rv1909:train")
    rows = random.Random(0).sample(train.rows, min(len(train.rows), ctx.scaled(TRAIN_ROWS, floor=1000)))
    test = read_table("kjv-rv1909:test")
    n = ctx.scaled(TEST_ROWS, floor=DECODE_BATCH)
    return (Table(train.path, rows, train.columns, [None] * len(rows)),
            test.head(n))


def _config(ctx: Context, steps: int, resume: bool):
    return TrainConfig.from_dict(ctx.train_settings(
        out=str(ctx.path("runs", "translation")), max_steps=steps, batch_size=BATCH_SIZE, lr=LR,
        warmup=warmup_for(steps), schedule="linear", eval_every=0, resume=resume), source="quickstart translation")


def translation(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``translation``: fine-tune, translate test verses while time allows, score them."""
    start = time.perf_counter()
    source = ctx.path(ctx.result("pretrain-t5")["model_dir"])
    train, test = _tables(ctx)
    recipe = Recipe(bucket=50)

    def probe() -> Probe:
        body, tok = load_body(str(source))
        return probe_finetuning(body, tok, _spec(), train, _config(ctx, 100, False),
                                ctx.path("probes", "translation"), recipe=recipe, seconds=ctx.probe_seconds)

    plan, resume = plan_run(ctx, "translation", seconds, probe, lambda per_step: seconds * DECODE_SHARE,
                            minimum=MIN_STEPS)
    steps = plan["max_steps"]
    ctx.log(f"t5-tiny en->es: {steps} steps of {BATCH_SIZE} verse pairs at lr {LR:g} "
            f"({plan['seconds_per_step']:.2f} s/step measured){'; resuming' if resume else ''}")
    out = ctx.path("runs", "translation")
    result = finetune(str(source), _spec(), train, None, config=_config(ctx, steps, resume), recipe=recipe,
                      out=out, log=ctx.log)
    check_stopped(result.train)
    outputs = translate(ctx, out / "model", test, deadline=start + seconds)
    hypotheses = [o["prediction"] or "" for o in outputs]
    references = [r["es"] for r in test.rows[:len(outputs)]]
    # BLEU and chrF only (the report shows no ROUGE): the quickstart needs sacrebleu, not rouge-score too.
    scores = {"bleu": task_metrics.bleu(hypotheses, references), "chrf": task_metrics.chrf(hypotheses, references)}
    curve = read_curve(out)
    drop_checkpoints(out)
    examples = [{"en": r["en"], "reference": r["es"], "output": o.get("prediction")}
                for r, o in zip(test.rows[:SHOWN], outputs)]
    for e in examples:
        ctx.log(f"{e['en'][:70]!r} -> {str(e['output'])[:70]!r}")
    record = {
        "model": ctx.relative(source), "steps": result.train.step, "batch_size": BATCH_SIZE, "lr": LR, "plan": plan,
        "train_pairs": len(train), "curve": curve, "first_loss": loss_drop(curve)[0], "last_loss": loss_drop(curve)[1],
        "seconds_per_step_measured": None if resume else measured_step_seconds(out),
        "test": {k: scores[k] for k in ("bleu", "chrf")}, "test_examples": len(outputs), "examples": examples,
        "model_dir": ctx.relative(out / "model"),
    }
    record["summary"] = (f"BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} on {len(outputs)} test verses "
                         f"({result.train.step} steps)")
    return record


def translate(ctx: Context, model_dir, test, deadline: float) -> list[dict[str, Any]]:
    """Greedy translations of ``test``'s verses, batch by batch, while the next batch fits before ``deadline``."""
    outputs: list[dict[str, Any]] = []
    while len(outputs) < len(test):
        begun = time.perf_counter()
        rows = test.rows[len(outputs):len(outputs) + DECODE_BATCH]
        outputs += predict(model_dir, Table(test.path, rows, test.columns, [None] * len(rows)), device=ctx.device,
                           batch_size=DECODE_BATCH)
        if time.perf_counter() + (time.perf_counter() - begun) > deadline:
            break
    return outputs
