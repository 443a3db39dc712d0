"""Pre-training: the Trainer loop, AdamW and LR schedules, precision, checkpoints for exact resume, logs.

    config.py                    TrainConfig: every setting of a run, validated (YAML / command line)
    trainer.py                   Trainer: token-normalised accumulation, clipping, eval, signals, resume
    optim.py                     AdamW with weight decay on weight matrices only
    schedules.py                 warmup + linear / cosine / inverse-sqrt / constant; slanted triangular
    precision.py                 device and bf16-autocast choice
    activation_checkpointing.py  recompute layer activations in backward to save memory
    state.py                     checkpoint folders: atomic, checksummed, rotated; RNG capture/restore
    distributed.py               torchrun ranks: strategy (single / DDP / FSDP2), process group, reductions, failures
    dist_checkpoint.py           FSDP's sharded checkpoints through DCP, resharding, consolidation to a model folder
    logging.py                   metrics.jsonl, TensorBoard, loss.png, progress bar
    pretrain.py                  the recipe behind `lmforge pretrain`: tokenizer + shards + objective + model

Example:
    >>> import pathlib, tempfile
    >>> from lmforge.data.prepare import prepare
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
    >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
    >>> _ = prepare([d / "corpus.txt"], tok, d / "data", val_fraction=0.1, progress=False)
    >>> from lmforge.training import TrainConfig
    >>> from lmforge.training.pretrain import pretrain
    >>> result = pretrain(TrainConfig(model="gpt-tiny", objective="clm", data=str(d / "data"), out=str(d / "run"),
    ...                               overrides={"n_layers": 2}, max_steps=5, seq_len=16, batch_size=4,
    ...                               progress=False))
    >>> result.step, sorted(p.name for p in (d / "run").iterdir())
    (5, ['checkpoints', 'config.yaml', 'loss.png', 'metrics.jsonl', 'model', 'tensorboard', 'tokenizer'])
"""

from __future__ import annotations

import importlib

# Imported lazily: the CLI reads TrainConfig to build `lmforge pretrain --help` without loading torch code.
_LAZY = {
    "enable_activation_checkpointing": "activation_checkpointing",
    "TrainConfig": "config",
    "build_optimizer": "optim",
    "param_groups": "optim",
    "resolve_device": "precision",
    "resolve_precision": "precision",
    "build_pretraining": "pretrain",
    "pretrain": "pretrain",
    "Schedule": "schedules",
    "CheckpointManager": "state",
    "CorruptCheckpoint": "state",
    "RunExistsError": "trainer",
    "Trainer": "trainer",
    "TrainResult": "trainer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"lmforge.training.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lmforge.training' has no attribute {name!r}")
