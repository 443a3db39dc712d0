"""Catastrophic forgetting: the pre-training loss of a body before and after it was fine-tuned.

Fine-tuning moves the body's weights for the task; how much of what pre-training taught survives is measured on
the pre-training objective itself (McCloskey & Cohen 1989; "catastrophic forgetting" as ULMFiT and the decks
use it). The pre-trained model keeps its LM head; only its body is replaced by the fine-tuned one::

    before = L_pretrain(pre-trained body, pre-trained head)       on the pre-training validation data
    after  = L_pretrain(fine-tuned body,  pre-trained head)       same data, same masks
    forgetting = after - before                                   (nats per target token; ppl = exp(loss))

Both losses are the Trainer's ordinary evaluation (:meth:`lmforge.training.Trainer.evaluate`: the first
``eval_batches`` batches of the validation split, masks drawn afresh from the same seed each time), with the
objective the model was pre-trained with (default: ``mlm`` for encoders, ``clm`` for decoders). A body that
fine-tuning kept frozen scores exactly its ``before``.

Example (a sketch: it reads a fine-tuned task folder, the pre-trained model and its prepared corpus)::

    forgetting("runs/rt/best", "runs/bert/model", "data/corpus")
    # {'objective': 'mlm', 'before': 4.61, 'after': 5.02, 'forgetting': 0.41, ...}
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lmforge.checkpoint import load_body
from lmforge.errors import UserInputError
from lmforge.tasks.model import load_task_model, read_task_meta
from lmforge.tasks.settings import read_saved_settings
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import build_objective_for, datasets_for
from lmforge.training.trainer import Trainer

DEFAULT_OBJECTIVES = {"encoder": "mlm", "decoder": "clm"}
HEADS = ("lm_head.", "mlm_head.", "rtd_head.")


def pretrained_source(model_dir: str | Path) -> str | None:
    """The model a fine-tuning run started from, as its ``finetune.yaml`` records it (None if not found)."""
    for folder in (Path(model_dir), Path(model_dir).parent):
        model = read_saved_settings(folder).get("model")
        if model:
            return str(model)
    return None


def with_body(pretrained, body):
    """``pretrained`` with every weight of ``body`` copied in; its LM head stays. Raises when ``body`` has a
    weight ``pretrained`` lacks (another architecture)."""
    try:
        missing, unexpected = pretrained.load_state_dict(body.state_dict(), strict=False)
    except RuntimeError as exc:  # a weight of another shape
        unexpected = [str(exc).split("size mismatch for ", 1)[-1].split(":", 1)[0]]
    if unexpected:
        raise UserInputError(f"the fine-tuned body does not fit the pre-trained model (e.g. {unexpected[0]}): "
                             "give the model it was fine-tuned from with --pretrained")
    kept = [k for k in missing if not k.startswith(HEADS)]
    if kept:
        raise UserInputError(f"the fine-tuned body lacks {kept[0]} of the pre-trained model: give the model it "
                             "was fine-tuned from with --pretrained")
    return pretrained


def pretraining_loss(model, tokenizer, data: str | Path, objective: str, *, seq_len: int | None = None,
                     batch_size: int = 16, eval_batches: int = 20, seed: int = 0, device: str = "cpu") -> float:
    """The Trainer's evaluation loss of ``model`` on the validation split of a prepared data folder."""
    seq_len = seq_len or model.config.max_seq_len
    config = TrainConfig(data=str(data), objective=objective, batch_size=batch_size, eval_batches=eval_batches,
                         eval_every=1, seed=seed, device=device, precision="fp32", progress=False, tensorboard=False)
    _, val = datasets_for(config, seq_len, tokenizer.sentence_end_ids())
    if val is None:
        raise UserInputError(f"{data}: no validation split to measure the pre-training loss on (prepare the data "
                             "with a --val-fraction above 0)")
    objective_fn = build_objective_for(config, tokenizer, seed, seq_len, tokenizer.sentence_end_ids())
    with tempfile.TemporaryDirectory() as out:  # evaluation writes nothing; the Trainer just needs a folder
        return Trainer(model, objective_fn, [], config, out=out, eval_data=val).evaluate()["eval_loss"]


def forgetting(model_dir: str | Path, pretrained: str | Path | None, data: str | Path, *,
               objective: str | None = None, **options: Any) -> dict[str, Any]:
    """Pre-training loss before and after fine-tuning (module docstring) of the task folder ``model_dir``.

    ``pretrained``: the model it was fine-tuned from (default: the one its run's ``finetune.yaml`` names);
    ``options``: of :func:`pretraining_loss` (seq_len, batch_size, eval_batches, seed, device).
    """
    meta = read_task_meta(model_dir)
    if meta is None:
        raise UserInputError(f"{model_dir}: not a fine-tuned task folder (no task.json)")
    if meta.get("peft") or meta.get("baseline"):
        raise UserInputError(f"{model_dir}: a {'PEFT' if meta.get('peft') else 'baseline'} folder; forgetting is "
                             "measured on a fully fine-tuned body (merge a PEFT run with --merge first)")
    pretrained = pretrained or pretrained_source(model_dir)
    if pretrained is None:
        raise UserInputError(f"{model_dir}: its run records no pre-trained model; name it with --pretrained")
    before_model, tokenizer = load_body(pretrained)
    objective = objective or DEFAULT_OBJECTIVES.get(before_model.config.arch)
    if objective is None:
        raise UserInputError(f"name the pre-training objective of a {before_model.config.arch} with --objective")
    after_model = with_body(load_body(pretrained)[0], load_task_model(model_dir).body)
    before = pretraining_loss(before_model, tokenizer, data, objective, **options)
    after = pretraining_loss(after_model, tokenizer, data, objective, **options)
    return {"objective": objective, "pretrained": str(pretrained), "data": str(data), "before": before,
            "after": after, "forgetting": after - before}
