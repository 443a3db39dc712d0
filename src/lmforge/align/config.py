"""`AlignConfig`: what an alignment run adds to the Trainer's settings (saved as ``OUT/align.yaml``).

    field                         methods     meaning
    method                        all         dpo | ppo | grpo
    policy, reference             all         the policy's model folder; the reference (default: the policy's
                                              starting weights; with lora_r the base model itself)
    lora_r                        all         train LoRA adapters of this rank on the policy (0: every weight)
    train                         dpo         preference pairs (prompt, chosen, rejected)
    beta, variant, cdpo_epsilon     dpo       DPO's beta; sigmoid (DPO/cDPO) or ipo; cDPO's eps
    precompute_ref                dpo         score the pairs with the reference once, before training
    prompts                       ppo, grpo   prompt file, NAME:SPLIT, or "arithmetic" (sums made on the fly)
    prompt_field                  all         the prompt column of the pairs or prompt file
    reward, reward_kind, reward_label  ppo, grpo  task folder or module:function; a classifier's score
    n_prompts, group              ppo, grpo   prompts per rollout; samples per prompt (GRPO's group)
    ppo_epochs                    ppo, grpo   passes over each rollout (in minibatches of --batch-size sequences)
    max_new_tokens, temperature, top_k  ppo, grpo  sampling of the rollouts
    kl_coef, kl_target, kl_horizon     ppo    the KL penalty's coefficient; adaptive with a target KL
    gamma, lam, clip, value_clip, vf_coef  ppo  GAE; the clipped policy and value losses
    kl_beta                       grpo        weight of the KL term
    clip                          grpo        the ratio's clip range too

Example:
    >>> AlignConfig(method="grpo").samples_per_prompt
    4
    >>> AlignConfig(method="sft")
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: AlignConfig.method='sft' is not one of dpo, ppo, grpo
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lmforge.config import ConfigBase, ConfigError
from lmforge.utils.io import read_mapping_file

SETTINGS_FILE = "align.yaml"
METHODS = ("dpo", "ppo", "grpo")


@dataclass
class AlignConfig(ConfigBase):
    """Alignment settings beyond :class:`~lmforge.training.TrainConfig` (see the module docstring)."""

    config_noun: ClassVar[str] = "alignment setting(s)"

    method: str = "dpo"
    policy: str | None = None
    reference: str | None = None
    lora_r: int = 0
    train: str | None = None
    beta: float = 0.1
    variant: str = "sigmoid"
    cdpo_epsilon: float = 0.0  # TRL's label_smoothing; renamed apart from the token loss's label_smoothing
    precompute_ref: bool = False
    prompts: str | None = None
    prompt_field: str = "prompt"
    reward: str | None = None
    reward_kind: str = "prob"
    reward_label: str | None = None
    n_prompts: int = 8
    group: int | None = None
    ppo_epochs: int = 4
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_k: int | None = None
    kl_coef: float = 0.1
    kl_target: float | None = None
    kl_horizon: int = 10000
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.1
    kl_beta: float = 0.04

    def __post_init__(self) -> None:
        self.check_kinds()
        if self.method not in METHODS:
            raise ConfigError(f"AlignConfig.method={self.method!r} is not one of {', '.join(METHODS)}")
        for key in ("n_prompts", "ppo_epochs", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"AlignConfig.{key}={getattr(self, key)} must be >= 1")
        if self.group is not None and self.group < 1:
            raise ConfigError(f"AlignConfig.group={self.group} must be >= 1")
        if self.method == "grpo" and self.samples_per_prompt < 2:
            raise ConfigError("AlignConfig.group must be >= 2 for GRPO: the advantage compares samples of a prompt")
        for key in ("beta", "temperature", "clip"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"AlignConfig.{key}={getattr(self, key)} must be > 0")
        for key in ("kl_coef", "kl_beta", "value_clip", "vf_coef", "lora_r"):
            if getattr(self, key) < 0:
                raise ConfigError(f"AlignConfig.{key}={getattr(self, key)} must be >= 0")
        if not 0 <= self.cdpo_epsilon < 0.5:
            raise ConfigError(f"AlignConfig.cdpo_epsilon={self.cdpo_epsilon} must be in [0, 0.5)")

    @property
    def samples_per_prompt(self) -> int:
        return self.group if self.group is not None else 4 if self.method == "grpo" else 1

    def absolute(self) -> "AlignConfig":
        """A copy naming every existing path absolutely (a resumed run may start in another directory)."""
        paths = {k: str(Path(v).resolve()) for k in ("policy", "reference", "train", "prompts", "reward")
                 if (v := getattr(self, k)) and Path(v).exists()}
        return self.replace(**paths)


def saved_settings(out: str | Path) -> dict[str, Any]:
    """What a run folder's ``align.yaml`` holds (``align`` and ``trainer``), or ``{}``."""
    file = Path(out) / SETTINGS_FILE
    return dict(read_mapping_file(file, "settings") or {}) if file.is_file() else {}
