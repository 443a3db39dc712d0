"""The fine-tuning recipe: settings beyond the Trainer's, after the practice of ULMFiT and BERT.

    practice                                   setting                  how
    discriminative fine-tuning (ULMFiT 3.2)    Recipe.layer_decay       group l's LR = lr * decay^(top - l)
    gradual unfreezing (ULMFiT 3.3)            Recipe.unfreeze_every    top group first, one more every N steps
    feature extraction / linear probe          Recipe.freeze_body       only the head trains; body in eval mode
    best checkpoint by a metric                Recipe.metric            OUT/best is rewritten when it improves

Unfreezing is a pure function of the step (:func:`trainable_from`), so a resumed run unfreezes at the same steps.

Example:
    >>> recipe = Recipe(unfreeze_every=100)
    >>> [trainable_from(step, top=5, recipe=recipe) for step in (1, 100, 101, 450)]
    [5, 5, 4, 1]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lmforge.config import ConfigError


@dataclass
class Recipe:
    """Fine-tuning settings beyond the Trainer's (see the module docstring).

    Args:
        layer_decay: LR multiplier per layer group below the top (1.0 = the same LR everywhere).
        unfreeze_every: gradual unfreezing period in steps (0 = everything trains from the start).
        freeze_body: train the head only (feature extraction; a linear probe with a linear head).
        metric: metric that picks the best checkpoint (default: the task's, e.g. accuracy, f1, bleu).
        eval_limit: evaluate on the first N evaluation examples (of each task) during training (None = all).
        eval_batch_size: batch size of evaluation (None = the training batch size).
        bucket: batch examples of similar length, from windows of this many batches (0 = plain shuffling);
            see :class:`~lmforge.tasks.data.ExampleBatches`.
    """

    layer_decay: float = 1.0
    unfreeze_every: int = 0
    freeze_body: bool = False
    metric: str | None = None
    eval_limit: int | None = None
    eval_batch_size: int | None = None
    bucket: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.layer_decay <= 1.0:
            raise ConfigError(f"Recipe.layer_decay={self.layer_decay} must be in (0, 1]")
        if self.unfreeze_every < 0:
            raise ConfigError(f"Recipe.unfreeze_every={self.unfreeze_every} must be >= 0")
        if self.freeze_body and self.unfreeze_every:
            raise ConfigError("Recipe.freeze_body and unfreeze_every exclude each other (a frozen body never thaws)")
        if self.bucket < 0:
            raise ConfigError(f"Recipe.bucket={self.bucket} must be >= 0")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ConfigError(f"Recipe.eval_limit={self.eval_limit} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainable_from(step: int, top: int, recipe: Recipe) -> int:
    """Lowest layer group that trains at ``step`` (1-based): ``top`` for a frozen body, else by unfreezing."""
    if recipe.freeze_body:
        return top
    if not recipe.unfreeze_every:
        return 0
    return max(top - (step - 1) // recipe.unfreeze_every, 0)
