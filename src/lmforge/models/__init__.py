"""Model assembly: :class:`Transformer`, :func:`build_model` and :func:`load_transformer`."""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.config import ModelConfig, resolve_config
from lmforge.model_folder import WEIGHTS_FILE, load_weights, materialise, read_config, verify_folder
from lmforge.models.quantize import quantized_shell, read_quantization
from lmforge.models.transformer import ModelOutput, Transformer
from lmforge.nn.labels import shift_right


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


def load_transformer(path: str | Path, verify: bool | None = None) -> Transformer:
    """A Transformer from an lmforge model folder, on the CPU in fp32 (train mode).

    ``verify`` checks the folder's files against its manifest first (see
    :func:`lmforge.model_folder.verify_folder`; None: the default, normally True).

    Nothing is allocated until the config has been read: the model is built on the meta device, then
    given storage and filled from the safetensors file. :func:`lmforge.checkpoint.load` loads every
    folder kind; this is its lmforge-folder case.
    """
    path = Path(path)
    cfg = read_config(path)
    with torch.device("meta"):
        shell = Transformer(cfg)
    model = materialise(shell)
    record = read_quantization(path)
    if record is not None:  # a quantised folder: its layers are rebuilt quantised, never re-quantised
        quantized_shell(model, record)
    load_weights(model, path / WEIGHTS_FILE)
    # After the structural checks, which name a missing file or a wrong shape more precisely than a hash.
    verify_folder(path, verify)
    return model


__all__ = ["ModelOutput", "Transformer", "build_model", "load_transformer", "shift_right"]
