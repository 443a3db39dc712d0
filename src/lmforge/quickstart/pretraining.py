"""Stage 3: pre-train one model of each family on the prepared shards, each within its share of the budget.

    stage          model      objective          corpus   what the later stages do with it
    pretrain-gpt   gpt-tiny   causal LM          english  prompting, text generation
    pretrain-bert  bert-tiny  masked LM          reviews  sentiment fine-tuning (vs from scratch, LoRA), probing
    pretrain-t5    t5-tiny    span corruption    bible    en->es translation fine-tuning

Every run uses the preset as named (only dropout is switched off: a run of minutes sees each token about
once, so there is nothing to regularise), except for two changes to bert-tiny, both measured
(docs/lab/notes-quickstart-pretraining.md):

- **Untied embeddings**: the masked LM gets its own output matrix. Tied, the MLM softmax moves every row of
  the token table on every step, and under Adam the rows of the tokens that are rarely targets all drift the
  same way (Gao et al. 2019, "Representation Degeneration Problem"); after a few hundred steps most sentiment
  words start fine-tuning nearly indistinguishable, and the pre-trained body fine-tuned about 5 points *below*
  a random one. Untied, only the rows of the tokens a batch contains move.
- **Rotary positions** (RoFormer, Su et al. 2021) instead of BERT's learned absolute ones. With learned
  positions a minutes-long masked LM stays at the unigram level: held-out MLM accuracy 0.10 after 560 steps
  (loss 6.61, against 6.75 for word frequencies alone), most likely because attention cannot find a token's
  neighbours before the position table has been learnt. With rotary positions, which give every head the
  relative offset from the first step, the same 560 steps reach 0.21 (loss 6.01), and only then does the
  fine-tuned body keep up with a random one. It leads by a point at most at this budget: the masked LM reads
  the sentences the classifier is then trained on, and twice the steps add nothing measurable. The random
  one has rotary positions too, so the two differ only in their weights; a random body with learned
  positions is a stronger baseline than that (a table of random positions leaves it close to a bag of
  words, which suits one-sentence reviews), the notes say by how much.

The masked LM reads the reviews alone (corpora.py says why). ELECTRA, which trains on every token, was
measured too, at equal time: its discriminator stays on the "everything is original" plateau, and its body
fine-tunes like a random one (with learned positions, near the majority class).

Every run has 128-token sequences, AdamW with a 10% linear warmup and a cosine decay to 10% of the peak LR.
The step count comes from the budget and a throughput probe, so the cosine ends when the stage's time does.
Loss is evaluated on the held-out split a few times along the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmforge.checkpoint import read_config
from lmforge.models import Transformer
from lmforge.quickstart.context import SEQ_LEN, Context, check_stopped
from lmforge.quickstart.probe import Probe, probe_pretraining
from lmforge.quickstart.runs import (
    drop_checkpoints,
    loss_drop,
    measured_step_seconds,
    plan_run,
    read_curve,
    total_tokens,
    warmup_for,
)
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import pretrain

EVALUATIONS = 4  # held-out evaluations per run, the last one at the end
EVAL_BATCHES = 4
FORWARD_SHARE = 0.35  # an evaluation batch costs about this share of a training step (forward only)
MIN_STEPS = 6


@dataclass(frozen=True)
class Pretraining:
    """One pre-training run of the quickstart."""

    model: str
    objective: str
    data: str  # the family whose tokenizer and shards it reads
    lr: float
    batch_size: int = 8
    title: str = ""
    # Changes to the preset beyond switching dropout off (see above); the run's model config records them.
    overrides: dict[str, Any] = field(default_factory=dict, hash=False)


RUNS = {
    "pretrain-gpt": Pretraining("gpt-tiny", "clm", "gpt", lr=1e-3, title="gpt-tiny, causal LM"),
    "pretrain-bert": Pretraining("bert-tiny", "mlm", "bert", lr=5e-4,
                                 overrides={"tie_embeddings": False, "position": "rope"},
                                 title="bert-tiny (rotary positions), masked LM (untied) on the reviews"),
    "pretrain-t5": Pretraining("t5-tiny", "span-corruption", "t5", lr=1e-3, title="t5-tiny, span corruption"),
}


def _config(ctx: Context, run: Pretraining, stage: str, max_steps: int, resume: bool):
    return TrainConfig.from_dict(ctx.train_settings(
        model=run.model, objective=run.objective, data=str(ctx.path(ctx.result("data")["data"][run.data]["path"])),
        out=str(ctx.path("runs", stage)), max_steps=max_steps, batch_size=run.batch_size, seq_len=SEQ_LEN,
        lr=run.lr, warmup=warmup_for(max_steps), schedule="cosine", min_lr_ratio=0.1,
        eval_every=-(-max_steps // EVALUATIONS), eval_batches=EVAL_BATCHES, resume=resume,
        overrides=_overrides(run)), source=f"quickstart {stage}")


def _overrides(run: Pretraining) -> dict[str, Any]:
    return {"dropout": 0.0, "attn_dropout": 0.0, **run.overrides}


def pretrain_stage(stage: str):
    """The stage function for ``stage`` (a key of :data:`RUNS`)."""
    run = RUNS[stage]

    def stage_fn(ctx: Context, seconds: float) -> dict[str, Any]:
        def probe() -> Probe:
            return probe_pretraining(_config(ctx, run, stage, 100, False), ctx.path("probes", stage),
                                     ctx.probe_seconds)

        def other(per_step: float) -> float:
            return EVALUATIONS * EVAL_BATCHES * FORWARD_SHARE * per_step

        plan, resume = plan_run(ctx, stage, seconds, probe, other, minimum=MIN_STEPS)
        steps = plan["max_steps"]
        ctx.log(f"{run.title}: {steps} steps of {run.batch_size} x {SEQ_LEN} tokens "
                f"({plan['seconds_per_step']:.2f} s/step measured){'; resuming' if resume else ''}")
        result = pretrain(_config(ctx, run, stage, steps, resume))
        check_stopped(result)
        out = ctx.path("runs", stage)
        curve = read_curve(out)
        first, last = loss_drop(curve)
        metrics = result.metrics
        drop_checkpoints(out)
        config = read_config(out / "model")
        record = {
            "model": run.model, "objective": run.objective, "data": run.data,
            "corpus": ctx.result("data")["data"][run.data].get("corpus"), "tied_embeddings": config.tie_embeddings,
            "position": config.position,
            "model_dir": ctx.relative(out / "model"),
            "parameters": parameters(config), "steps": result.step, "batch_size": run.batch_size, "seq_len": SEQ_LEN,
            "tokens": total_tokens(out), "lr": run.lr, "plan": plan,
            "first_loss": first, "last_loss": last, "eval_loss": metrics.get("eval_loss"),
            "eval_ppl": metrics.get("eval_ppl"), "eval_accuracy": metrics.get("eval_accuracy"), "curve": curve,
            "seconds_per_step_measured": None if resume else measured_step_seconds(out),
            "vocab_size": config.vocab_size,
        }
        ppl = f", val ppl {record['eval_ppl']:.0f}" if isinstance(record["eval_ppl"], (int, float)) else ""
        record["summary"] = f"loss {first:.2f} -> {last:.2f}{ppl} ({result.step} steps, {record['tokens']:,} tokens)"
        return record

    stage_fn.__name__ = stage.replace("-", "_")
    return stage_fn


def parameters(config) -> int:
    """Parameter count of a model config (built on the meta device: no memory, no initialisation)."""
    import torch

    with torch.device("meta"):
        return int(Transformer(config).num_parameters())
