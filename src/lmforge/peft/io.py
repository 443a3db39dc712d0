"""Adapter folders: ``adapter_config.json`` + ``adapter.safetensors``, and the identity of their base model.

An adapter is only meaningful on the base it was trained on, so the config records that base: its name,
a hash of its architecture (the ModelConfig fields that shape the weights) and a SHA-256 of its weights.
Loading checks both and fails with a message that names what differs; ``check_base=False`` skips the
weight check (e.g. after re-saving the base in another precision), never the architecture check.

    adapter_config.json   {"format": "lmforge-peft", "version": 1, "name": ..., "peft": {PeftConfig},
                           "base": {"name", "config", "config_sha256", "weights_sha256", "parameters"},
                           "parameters": <adapter size>}
    adapter.safetensors   the adapter's tensors only, keyed ``<module path>.<param>`` (``prefix.*``, ``prompt.*``)

Only the adapter is written (kilobytes to megabytes), atomically; weights are never pickled. A prefix
trained through its reparameterisation MLP is saved folded (the MLP's output), as Li & Liang deploy it.

Example:
    >>> import tempfile, torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft, load_adapter
    >>> base = lmforge.build_model("gpt-tiny", n_layers=1).eval()
    >>> model = apply_peft(base, PeftConfig(method="lora", r=2))
    >>> path = model.save_adapter(tempfile.mkdtemp() + "/lora")
    >>> sorted(p.name for p in path.iterdir())
    ['adapter.safetensors', 'adapter_config.json', 'manifest.json']
    >>> load_adapter(lmforge.build_model("gpt-tiny", n_layers=1), path)  # a different random base
    Traceback (most recent call last):
    ...
    lmforge.peft.io.AdapterMismatchError: ...: the base model's weights differ from the ones this adapter ...
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmforge.config import ConfigError
from lmforge.errors import InputFileNotFound, LmforgeError
from lmforge.model_folder import canonical_state, verify_folder, write_manifest
from lmforge.peft.config import PeftConfig
from lmforge.utils.io import atomic_dir

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter.safetensors"
FORMAT, VERSION = "lmforge-peft", 1
# ModelConfig fields that do not change the weights' meaning: excluded from the architecture hash.
_NOT_IDENTITY = ("name", "extra", "dropout", "attn_dropout", "ffn_dropout", "initializer_range")


class AdapterMismatchError(LmforgeError, ValueError):
    """An adapter does not belong to this base model; the message names the difference."""


# ---------------------------------------------------------------------------------------- base identity
def _arch_fields(config) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k not in _NOT_IDENTITY}


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of ``model`` (name, dtype, shape, bytes; tied weights once)."""
    tensors, _ = canonical_state(model)
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def base_identity(model: torch.nn.Module) -> dict[str, Any]:
    """What an adapter records about its base: name, architecture fields and hash, weight checksum, size."""
    arch = _arch_fields(model.config)
    return {
        "name": model.config.name,
        "config": arch,
        "config_sha256": hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest(),
        "weights_sha256": weights_sha256(model),
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
    }


def verify_base(recorded: dict[str, Any], actual: dict[str, Any], source: str, check_weights: bool = True) -> None:
    """Raise :class:`AdapterMismatchError` if ``actual`` is not the base ``recorded`` in an adapter."""
    if recorded.get("config_sha256") != actual["config_sha256"]:
        theirs, ours = recorded.get("config", {}), actual["config"]
        diff = [f"{k}={theirs.get(k)!r} (this base: {ours.get(k)!r})" for k in sorted(set(theirs) | set(ours))
                if theirs.get(k) != ours.get(k)]
        raise AdapterMismatchError(
            f"{source}: adapter was trained on base {recorded.get('name')!r}, whose architecture differs from this "
            f"base {actual['name']!r}: {', '.join(diff[:4]) or 'config hash differs'}"
        )
    if check_weights and recorded.get("weights_sha256") != actual["weights_sha256"]:
        raise AdapterMismatchError(
            f"{source}: the base model's weights differ from the ones this adapter was trained on "
            f"(sha256 {actual['weights_sha256'][:12]}, expected {str(recorded.get('weights_sha256'))[:12]}); "
            "load the same base checkpoint, or pass check_base=False (--no-check-base) to load it anyway"
        )


# ---------------------------------------------------------------------------------------- save / load
def save_adapter(model, path: str | Path, name: str | None = None, fold_prefix: bool = True) -> Path:
    """Write adapter ``name`` (default: active) of PeftModel ``model`` to folder ``path`` atomically.

    Args:
        fold_prefix: save a prefix's reparameterised output instead of its MLP (the in-memory model is not
            changed); the saved config then says ``prefix_projection: false``.
    """
    name = model._name(name)
    cfg = model.peft_configs[name]
    tensors = model.adapter_state_dict(name)
    if fold_prefix and name in model.prefixes and cfg.prefix_projection:
        with torch.no_grad():
            for stack, kv in model.prefixes[name].stacks.items():
                key = f"prefix.stacks.{stack}."
                tensors = {k: v for k, v in tensors.items() if not k.startswith(key)}
                tensors[key + "kv"] = kv().detach().clone(memory_format=torch.contiguous_format)
        cfg = cfg.replace(prefix_projection=False)
    meta = {
        "format": FORMAT, "version": VERSION, "name": name, "peft": cfg.to_dict(), "base": model.base_identity,
        "parameters": sum(t.numel() for t in tensors.values()),
    }
    path = Path(path)
    with atomic_dir(path) as tmp:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp / ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})
        write_manifest(tmp)
    return path


def read_adapter_config(path: str | Path) -> tuple[dict[str, Any], PeftConfig]:
    """(the whole ``adapter_config.json``, its PeftConfig); errors name the file and the problem."""
    path = Path(path)
    cfg_file = path / ADAPTER_CONFIG
    if not path.is_dir() or not cfg_file.is_file():
        raise InputFileNotFound(f"{path}: not an adapter folder (expected {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        meta = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cfg_file}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        hf = isinstance(meta, dict) and "peft_type" in meta
        hint = " (an HF peft folder? lmforge reads its own adapters)" if hf else ""
        raise ConfigError(f"{cfg_file}: not an lmforge adapter config (format {FORMAT!r} expected){hint}")
    if meta.get("version") != VERSION:
        raise ConfigError(f"{cfg_file}: adapter format version {meta.get('version')!r} is not supported ({VERSION})")
    return meta, PeftConfig.from_dict(meta.get("peft"), source=str(cfg_file))


def read_adapter_tensors(path: str | Path, verify: bool | None = None) -> dict[str, torch.Tensor]:
    """The tensors of adapter folder ``path`` (``adapter.safetensors``); errors name the file and the problem.

    ``verify``: check the folder against its ``manifest.json`` first (see :func:`lmforge.model_folder.verify_folder`).
    """
    weights = Path(path) / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise InputFileNotFound(f"{weights}: missing; an adapter folder needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    verify_folder(path, verify)
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{weights}: unreadable or truncated safetensors file ({exc})") from exc
