"""Fine-tuning and evaluation: task heads and formats, the fine-tuning recipe, metrics.

    spec.py            TaskSpec: the task, its columns, labels, prefixes, label map, head settings (task.json)
    data.py            TSV / CSV / JSONL / CoNLL readers with row-numbered errors; shuffled, resumable batches
    base.py            Task: input formats per family (segments; delimiter + extract; BART), padding, eval loop
    heads.py           pooling (cls | mean | last | max); sequence, token and span heads with their losses
    classification.py  classify, regress (STS-B style), multilabel
    tagging.py         token classification with first-sub-token label alignment
    qa.py              extractive QA: start/end logits and the span decoding rule
    multiple_choice.py one score per (context, choice) pair, softmax across the choices (SWAG)
    seq2seq.py         translation / summarisation: teacher forcing, greedy decoding with the KV cache
    text2text.py       T5's format: task prefixes, label words, multi-task mixing
    model.py           TaskModel (body + head) and task folders (model folder + task.json + head weights)
    recipe.py          the recipe's settings: layer-wise LR decay, gradual unfreezing, frozen body, best metric
    optim.py           layer groups and AdamW with a learning-rate scale per group
    trainer.py         FinetuneTrainer: the Trainer with the recipe, task evaluation and the best checkpoint
    peft.py            PEFT on a task model: adapter + head, its folders, the record of a PEFT run
    mixture.py         the tables of a task or a text2text mixture, and each task's sampling rate
    finetune.py        finetune(): a model folder or preset, a task and data files in; a run folder out
    settings.py        a run's settings (flags over OUT/finetune.yaml over the defaults), as plain data
    run.py             run_finetune(settings): the pipeline a run needs (task, PEFT, instruct), then --merge
    inference.py       evaluate / predict a task folder on a data file
    registry.py        build_task: the Task class for each task name
    metrics.py         scikit-learn, scipy, seqeval, sacrebleu, rouge-score; SQuAD EM/F1; perplexity

Example (a sketch: minutes of fine-tuning on two CPU cores)::

    from lmforge.tasks import TaskSpec, finetune, Recipe
    from lmforge.training import TrainConfig
    result = finetune("all-MiniLM-L6-v2", TaskSpec(task="classify"), "rt-sentiment:train", "rt-sentiment:dev",
                      config=TrainConfig(lr=5e-5, warmup=40, max_steps=400, batch_size=16, schedule="linear"),
                      recipe=Recipe(layer_decay=0.9), out="runs/rt")
    result.best_value  # 0.87
"""

from __future__ import annotations

from lmforge.utils.lazy import lazy_exports

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
    "Recipe": "recipe",
    "FinetuneTrainer": "trainer",
    "FinetuneResult": "finetune",
    "finetune": "finetune",
    "layer_groups": "optim",
    "build_finetune_optimizer": "optim",
    "ScaledAdamW": "optim",
    "evaluate": "inference",
    "predict": "inference",
    "build_task": "registry",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
