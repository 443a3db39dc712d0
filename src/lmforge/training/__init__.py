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
    resume_settings.py           --resume is exact or refused: saved vs given settings, OUT/history.jsonl

Example (``data/corpus``: a folder made by ``lmforge data prepare``; the example of
:mod:`lmforge.training.pretrain` runs this on a corpus it makes)::

    from lmforge.training import TrainConfig
    from lmforge.training.pretrain import pretrain
    pretrain(TrainConfig(model="bert-tiny", objective="mlm", data="data/corpus", out="runs/bert",
                         overrides={"n_layers": 2}, max_steps=200))
"""

from __future__ import annotations

from lmforge.utils.lazy import lazy_exports

# Imported lazily: the CLI reads TrainConfig to build `lmforge pretrain --help` without loading torch code.
_LAZY = {
    "enable_activation_checkpointing": "activation_checkpointing",
    "TrainConfig": "config",
    "build_optimizer": "optim",
    "param_groups": "optim",
    "resolve_device": "precision",
    "resolve_precision": "precision",
    "build_pretraining": "pretrain",
    "Schedule": "schedules",
    "CheckpointManager": "state",
    "CorruptCheckpoint": "state",
    "LossOutput": "trainer",
    "RunExistsError": "trainer",
    "Trainer": "trainer",
    "TrainResult": "trainer",
    "TrainingDiverged": "trainer",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
