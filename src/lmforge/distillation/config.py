"""`DistillConfig`: what a distillation run adds to the Trainer's settings (saved as ``OUT/distill.yaml``).

    field          used by            meaning (DistilBERT / Hinton defaults)
    teacher        both               model folder (pre-training) or fine-tuned task folder (task distillation)
    student        both               preset, config file or model folder (None: the teacher's config, half
                                      its layers)
    train, eval    task               labelled data files (or NAME:SPLIT), as for ``lmforge finetune``
    alpha_ce       pre-training       weight of the soft-target KL (5.0)
    alpha_mlm      pre-training       weight of the student's own objective loss, MLM or causal LM (2.0)
    alpha_cos      pre-training       weight of the cosine loss between last hidden states (1.0)
    alpha          task               weight of the soft-target KL; 1 - alpha goes to the gold labels (0.5)
    temperature    both               softmax temperature T of the soft targets (2.0)
    epochs,        task               passes over the training data (sets max_steps); warmup as a share
    warmup_ratio
    method         both               distilbert (the losses above) or tinybert (Jiao et al. 2020: embedding,
                                      hidden-state and attention-score MSE, then soft cross-entropy; see
                                      :mod:`lmforge.distillation.tinybert`)
    layer_map      tinybert           "0:0,1:3,2:6" student:teacher layers (0 = embeddings); None: uniform
    intermediate_  tinybert task      passes of the intermediate-layer phase before the prediction phase
    epochs                            (None: as ``epochs``, or max_steps)
    augment        tinybert task      augmented copies per training example (0: none; the paper: 20)
    augment_p,     tinybert task      word replacement probability (0.4) and candidates per word (15)
    augment_k
    augment_model  tinybert task      the pre-trained MLM model folder that proposes single-piece words
                                      (needed with augment > 0; TinyBERT uses BERT-base's MLM)

Example:
    >>> DistillConfig(teacher="runs/bert/model").alpha_ce
    5.0
    >>> DistillConfig(temperature=0)
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: DistillConfig.temperature=0 must be > 0
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lmforge.config import ConfigBase, ConfigError
from lmforge.tasks import columnar
from lmforge.utils.io import read_mapping_file

SETTINGS_FILE = "distill.yaml"
METHODS = ("distilbert", "tinybert")


@dataclass
class DistillConfig(ConfigBase):
    """Distillation settings beyond :class:`~lmforge.training.TrainConfig` (see the module docstring)."""

    config_noun: ClassVar[str] = "distillation setting(s)"

    teacher: str | None = None
    student: str | None = None
    train: str | None = None
    eval: str | None = None
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha: float = 0.5
    temperature: float = 2.0
    epochs: float | None = None
    warmup_ratio: float | None = None
    method: str = "distilbert"
    layer_map: str | None = None
    intermediate_epochs: float | None = None
    augment: int = 0
    augment_p: float = 0.4
    augment_k: int = 15
    augment_model: str | None = None

    def __post_init__(self) -> None:
        self.check_kinds()
        if self.method not in METHODS:
            raise ConfigError(f"DistillConfig.method={self.method!r} must be one of {', '.join(METHODS)}")
        if self.augment < 0 or self.augment_k < 1 or not 0.0 <= self.augment_p <= 1.0:
            raise ConfigError(f"DistillConfig: augment={self.augment} must be >= 0, augment_k={self.augment_k} >= 1 "
                              f"and augment_p={self.augment_p} in [0, 1]")
        if self.intermediate_epochs is not None and not self.intermediate_epochs > 0:
            raise ConfigError(f"DistillConfig.intermediate_epochs={self.intermediate_epochs} must be > 0")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            if getattr(self, key) < 0:
                raise ConfigError(f"DistillConfig.{key}={getattr(self, key)} must be >= 0")
        if not (self.alpha_ce or self.alpha_mlm or self.alpha_cos):
            raise ConfigError("DistillConfig: alpha_ce, alpha_mlm and alpha_cos are all 0; nothing would be learned")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"DistillConfig.alpha={self.alpha} must be in [0, 1]")
        if not self.temperature > 0:
            raise ConfigError(f"DistillConfig.temperature={self.temperature} must be > 0")
        if self.epochs is not None and not self.epochs > 0:
            raise ConfigError(f"DistillConfig.epochs={self.epochs} must be > 0")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"DistillConfig.warmup_ratio={self.warmup_ratio} must be in [0, 1)")

    def absolute(self, teacher: str | Path) -> "DistillConfig":
        """A copy naming ``teacher`` (the resolved teacher folder) and every other existing path absolutely,
        so that the saved settings still work when the run is resumed from another working directory."""
        paths = {k: str(Path(v).resolve()) for k in ("student", "train", "eval", "augment_model")
                 if (v := getattr(self, k)) and Path(v).exists()}
        paths.update({k: columnar.absolute(v) for k in ("train", "eval")  # DIR:SPLIT of a dataset folder
                      if k not in paths and (v := getattr(self, k))})
        return self.replace(teacher=str(Path(teacher).resolve()), **paths)

    def loss_weights(self) -> dict[str, float]:
        """The pre-training terms' weights, by term name (``ce``, ``mlm``, ``cos``)."""
        return {"ce": self.alpha_ce, "mlm": self.alpha_mlm, "cos": self.alpha_cos}


def saved_settings(out: str | Path) -> dict[str, Any]:
    """What a run folder's ``distill.yaml`` holds: ``distill`` (a DistillConfig's fields) and, for task
    distillation, ``trainer`` (the TrainConfig's; pre-training keeps those in ``config.yaml``). ``{}``: none."""
    file = Path(out) / SETTINGS_FILE
    return dict(read_mapping_file(file, "settings") or {}) if file.is_file() else {}
