"""Stage 6: classify movie reviews by prompting the frozen gpt-tiny, zero-shot and few-shot.

    zero-shot              "<review> It was {great|terrible}."   the label whose answer is likelier
    zero-shot, calibrated  the same scores, divided by the prediction for content-free inputs
                           ("N/A", "") in the same prompt (Zhao et al. 2021), which removes the prompt's bias
    4-shot                 two positive and two negative training reviews with their answers, then the query

Nothing is trained. The test reviews are scored in chunks until the stage's share of the budget runs out
(at least one chunk), so a larger budget scores more of them. Few-shot prompting is an ability that appears
with scale (Brown et al. 2020): a model of a few million parameters trained for minutes is expected to stay
near the majority baseline, and the report shows that honestly.
"""

from __future__ import annotations

import time
from typing import Any

import lmforge
from lmforge import datasets
from lmforge.prompting import FewShot, Template, Verbalizer, calibrate, classify, content_free_prediction
from lmforge.quickstart.context import Context
from lmforge.tokenization import Tokenizer

TEMPLATE = "{x} It was {z}."
ANSWERS = {"0": "terrible", "1": "great"}  # rt-sentiment: 0 = negative, 1 = positive
SHOTS = 4
CHUNK = 16
MAX_ROWS = 1007
POOL_ROWS = 2000  # demonstrations are drawn from the first rows of the training split


def prompting(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``prompting``."""
    import torch

    start = time.perf_counter()
    folder = ctx.path(ctx.result("pretrain-gpt")["model_dir"])
    model, tok = lmforge.load(folder, device=ctx.device), Tokenizer.load(folder)
    template, verbalizer = Template(TEMPLATE), Verbalizer({k: [v] for k, v in ANSWERS.items()})
    test = [{"text": r["text"], "label": str(r["label"])} for r in datasets.load("rt-sentiment", "test")]
    pool = [{"text": r["text"], "label": str(r["label"])} for r in datasets.load("rt-sentiment", "train")[:POOL_ROWS]]
    torch.manual_seed(0)
    # The content-free prediction depends on the prompt only, so zero-shot calibration needs it once.
    free = [template.split(t) for t in ("N/A", "")]
    content_free = content_free_prediction(verbalizer.score(model, tok, free))

    limit = min(len(test), ctx.scaled(MAX_ROWS, floor=CHUNK))
    gold, zero, calibrated, few = [], [], [], []
    demo = None
    while len(gold) < limit:
        chunk_start = time.perf_counter()
        rows = test[len(gold):len(gold) + min(CHUNK, limit - len(gold))]
        z = classify(model, tok, template, verbalizer, rows)
        f = classify(model, tok, template, verbalizer, rows, pool=pool, shots=SHOTS, selection="balanced", seed=0)
        if demo is None:
            demo = {"zero_shot": _prompt_text(template, verbalizer, pool, [], rows[0]),
                    "few_shot": _prompt_text(template, verbalizer, pool, f.demonstrations[0], rows[0])}
        labels = z.labels
        gold += [r["label"] for r in rows]
        zero += z.predictions
        calibrated += [labels[i] for i in calibrate(z.probs, content_free).argmax(-1).tolist()]
        few += f.predictions
        per_chunk = time.perf_counter() - chunk_start
        if time.perf_counter() - start + per_chunk > seconds:
            break
    n = len(gold)
    accuracy = {name: sum(p == g for p, g in zip(preds, gold)) / n
                for name, preds in (("zero_shot", zero), ("zero_shot_calibrated", calibrated), ("few_shot", few))}
    majority = max(gold.count(label) for label in set(gold)) / n
    predicted = {name: {label: preds.count(label) for label in ANSWERS}
                 for name, preds in (("zero_shot", zero), ("zero_shot_calibrated", calibrated), ("few_shot", few))}
    return {
        "model": ctx.relative(folder), "template": TEMPLATE, "answers": ANSWERS, "shots": SHOTS, "examples": n,
        "accuracy": accuracy, "majority_baseline": majority, "predicted": predicted,
        "content_free": content_free.tolist(), "prompts": demo,
        "summary": (f"accuracy zero-shot {accuracy['zero_shot']:.3f}, "
                    f"calibrated {accuracy['zero_shot_calibrated']:.3f}, "
                    f"{SHOTS}-shot {accuracy['few_shot']:.3f} (majority {majority:.3f}, {n} reviews)"),
    }


def _prompt_text(template, verbalizer, pool, indices, row) -> str:
    """The few-shot prompt of one query as the model reads it (answer slot left open)."""
    fs = FewShot(template, verbalizer, k=len(indices))
    prompt = fs.prompt(fs.context(pool, indices), row)
    return prompt.prefix + prompt.space + "{z}" + prompt.suffix
