"""The model-folder format: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``), written atomically.

Weights are only ever read from safetensors, which holds raw tensors and cannot execute code on
load (unlike pickle). Saving writes a temporary sibling folder and renames it into place, so a
killed process leaves the previous folder intact. Loading checks every tensor's presence and shape
and names the file and tensor in any error.

Tied weights (shared token embeddings, tied LM heads) are stored once; on load every alias is
filled from the stored copy.

This module knows the format only, not the models: :mod:`lmforge.checkpoint` holds the one loader that
rebuilds a model from any folder kind, and the models' own ``save`` writes through :func:`save` here.

Example:
    >>> import tempfile, lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> path = save(model, tempfile.mkdtemp() + "/gpt")
    >>> read_config(path) == model.config, sorted(p.name for p in path.iterdir())
    (True, ['config.json', 'model.safetensors'])
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


class CheckpointError(LmforgeError, ValueError):
    """A checkpoint folder is missing, truncated or does not match its config."""


def canonical_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(unique tensors by first name, alias -> canonical name) for tied parameters."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        # Tied parameters are the same tensor under two names: same memory, offset and shape.
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype) if tensor.numel() else name
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            tensors[name] = tensor.detach().contiguous().cpu()
    return tensors, aliases


def save(model: torch.nn.Module, path: str | Path, tokenizer=None, extra_files: dict[str, str] | None = None) -> Path:
    """Write a model folder atomically and return its path.

    Args:
        model: an lmforge Transformer (anything with ``.config`` and a state dict).
        path: destination folder; replaced as a whole if it exists.
        tokenizer: an object with ``save(folder)`` or a path to a tokenizer.json to copy along.
        extra_files: name -> text of further files to write into the folder.
    """
    path = Path(path)
    tensors, aliases = canonical_state(model)
    with atomic_dir(path) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "aliases": json.dumps(aliases)})
        if tokenizer is not None:
            if isinstance(tokenizer, (str, Path)):
                shutil.copy(tokenizer, tmp / TOKENIZER_FILE)
            else:
                tokenizer.save(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return path


def read_config(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of an lmforge model folder; a missing folder or file is a CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a model folder (expected a directory with {CONFIG_FILE})")
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing; a model folder needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    return ModelConfig.load(cfg_file)


def load_weights(model: torch.nn.Module, weights: str | Path, strict: bool = True) -> None:
    """Fill ``model`` from a safetensors file, checking names and shapes; errors name the tensor."""
    weights = Path(weights)
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing weights file")
    try:
        handle = safe_open(str(weights), framework="pt")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights}: unreadable or truncated safetensors file ({exc})") from exc
    with handle as f:
        stored = set(f.keys())
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        state = model.state_dict()
        loaded: dict[str, torch.Tensor] = {}
        for name, target in state.items():
            source = name if name in stored else aliases.get(name)
            if source is None or source not in stored:
                if strict:
                    raise CheckpointError(f"{weights}: tensor {name!r} is missing (shape {tuple(target.shape)})")
                continue
            try:
                tensor = f.get_tensor(source)
            except (SafetensorError, OSError, RuntimeError) as exc:
                raise CheckpointError(f"{weights}: tensor {source!r} cannot be read ({exc}); the file is damaged") from exc
            if tensor.shape != target.shape:
                raise CheckpointError(
                    f"{weights}: tensor {source!r} has shape {tuple(tensor.shape)}, "
                    f"but the config needs {tuple(target.shape)}"
                )
            loaded[name] = tensor
        unexpected = stored - set(state) - set(aliases.values())
        if strict and unexpected:
            raise CheckpointError(f"{weights}: unexpected tensor(s) {', '.join(sorted(unexpected)[:5])}")
    model.load_state_dict(loaded, strict=False)


def materialise(shell: torch.nn.Module) -> torch.nn.Module:
    """A meta-device model -> an uninitialised CPU model with its derived buffers computed.

    Derived buffers (sinusoid tables, RoPE frequencies, ALiBi slopes) are in no folder: every module that
    has them rebuilds them in ``reset_buffers``.
    """
    model = shell.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()
    return model
