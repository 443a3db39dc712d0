"""Knowledge distillation: a small student learns from a frozen teacher's soft targets (Hinton et al. 2015).

    module        what                                                              CLI
    losses        soft-target KL (T^2), cosine loss of hidden states, weighted sum  -
    student       the student's architecture and its init from every other layer    -
    config        DistillConfig: teacher, student, loss weights, temperature         -
    pretraining   DistilBERT: KL + MLM + cosine on the pre-training data            lmforge distill --data
    task          a fine-tuned classifier's soft labels + the gold labels           lmforge distill --train
    tinybert      TinyBERT: embeddings, hidden states, attention scores; two stages lmforge distill --method tinybert
    tinybert_losses, augmentation   its layer map and losses; its data augmentation  -

Both are the one Trainer with a ``loss`` (checkpoints, exact resume, bf16; pre-training also under torchrun),
and both end in an ordinary folder: a model folder (pre-training) or a task folder (task distillation).

Example:
    >>> import torch
    >>> from lmforge.distillation import soft_target_kl
    >>> float(soft_target_kl(torch.zeros(2, 5), torch.zeros(2, 5), temperature=2.0))
    0.0
"""

from lmforge.distillation.config import DistillConfig
from lmforge.distillation.losses import cosine_embedding_loss, soft_target_kl, task_distillation_loss, weighted_sum
from lmforge.distillation.pretraining import PretrainingDistillation, build_distillation, distill_pretraining
from lmforge.distillation.student import init_from_teacher, teacher_layers
from lmforge.distillation.task import TaskDistillation, distill_task
from lmforge.distillation.tinybert import build_general_distillation, distill_task_tinybert

__all__ = ["DistillConfig", "PretrainingDistillation", "TaskDistillation", "build_distillation",
           "cosine_embedding_loss", "distill_pretraining", "distill_task", "init_from_teacher", "soft_target_kl",
           "task_distillation_loss", "teacher_layers", "weighted_sum", "build_general_distillation",
           "distill_task_tinybert"]
