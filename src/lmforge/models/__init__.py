"""Model assembly: :class:`Transformer` and :func:`build_model`."""

from __future__ import annotations

from lmforge.config import ModelConfig, resolve_config
from lmforge.models.transformer import ModelOutput, Transformer, shift_right


def build_model(config: ModelConfig | str, **overrides) -> Transformer:
    """A randomly initialised model from a ModelConfig, a preset name or a config file.

    Example:
        >>> model = build_model("bert-tiny")
        >>> model.config.arch
        'encoder'
    """
    cfg = config if isinstance(config, ModelConfig) else resolve_config(config)
    if overrides:
        cfg = cfg.replace(**overrides)
    return Transformer(cfg)


__all__ = ["ModelOutput", "Transformer", "build_model", "shift_right"]
