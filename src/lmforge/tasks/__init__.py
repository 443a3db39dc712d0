"""Fine-tuning and evaluation: task heads and formats, the fine-tuning recipe, metrics.

    spec.py            TaskSpec: the task, its columns, labels, prefixes, label map, head settings (task.json)
    data.py            TSV / CSV / JSONL / CoNLL readers with row-numbered errors; shuffled, resumable batches
    base.py            Task: input formats per family (segments; delimiter + extract; BART), padding, eval loop
    heads.py           pooling (cls | mean | last | max); sequence, token and span heads with their losses
    classification.py  classify, regress (STS-B style), multilabel
    tagging.py         token classification with first-sub-token label alignment
    qa.py              extractive QA: start/end logits and the span decoding rule
    seq2seq.py         translation / summarisation: teacher forcing, greedy decoding with the KV cache
    text2text.py       T5's format: task prefixes, label words, multi-task mixing
    model.py           TaskModel (body + head) and task folders (model folder + task.json + head weights)
    finetune.py        the recipe: layer-wise LR decay, gradual unfreezing, frozen body, best checkpoint
    inference.py       evaluate / predict a task folder on a data file
    metrics.py         scikit-learn, scipy, seqeval, sacrebleu, rouge-score; SQuAD EM/F1; perplexity

Example:
    >>> from lmforge.tasks import TaskSpec, finetune, Recipe
    >>> from lmforge.training import TrainConfig
    >>> result = finetune("path/to/minilm", TaskSpec(task="classify"), "rt-sentiment:train",  # doctest: +SKIP
    ...                   "rt-sentiment:dev", config=TrainConfig(lr=5e-5, warmup=40, max_steps=400,
    ...                   batch_size=16, schedule="linear"), recipe=Recipe(layer_decay=0.9), out="runs/rt")
    >>> result.best_value  # doctest: +SKIP
    0.87
"""

from __future__ import annotations

import importlib

_LAZY = {
    "TaskSpec": "spec",
    "TASKS": "spec",
    "Table": "data",
    "TaskDataError": "data",
    "read_table": "data",
    "ExampleBatches": "data",
    "TaskModel": "model",
    "build_task_model": "model",
    "save_task_model": "model",
    "load_task_model": "model",
    "hf_head": "model",
    "Recipe": "finetune",
    "FinetuneTrainer": "finetune",
    "FinetuneResult": "finetune",
    "finetune": "finetune",
    "load_body": "finetune",
    "layer_groups": "finetune",
    "build_finetune_optimizer": "finetune",
    "ScaledAdamW": "finetune",
    "evaluate": "inference",
    "predict": "inference",
}

__all__ = sorted(_LAZY) + ["build_task"]


def build_task(spec, tokenizer, config):
    """The :class:`~lmforge.tasks.base.Task` for ``spec.task`` (encoding, collation, prediction, metrics)."""
    from lmforge.tasks.classification import ClassifyTask, MultilabelTask, RegressTask
    from lmforge.tasks.qa import QATask
    from lmforge.tasks.seq2seq import Seq2SeqTask
    from lmforge.tasks.tagging import TagTask
    from lmforge.tasks.text2text import Text2TextTask

    classes = {"classify": ClassifyTask, "regress": RegressTask, "multilabel": MultilabelTask, "tag": TagTask,
               "qa": QATask, "seq2seq": Seq2SeqTask, "text2text": Text2TextTask}
    return classes[spec.task](spec, tokenizer, config)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"lmforge.tasks.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lmforge.tasks' has no attribute {name!r}")
