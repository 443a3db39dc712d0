"""The model-folder format: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``), written atomically.

Weights are only ever read from safetensors, which holds raw tensors and cannot execute code on
load (unlike pickle). Saving writes a temporary sibling folder and renames it into place, so a
killed process leaves the previous folder intact. Loading checks every tensor's presence and shape
and names the file and tensor in any error.

Tied weights (shared token embeddings, tied LM heads) are stored once; on load every alias is
filled from the stored copy.

Integrity. ``manifest.json`` (written last, inside the same atomic folder) holds every file's size and sha256
and, when a tokenizer was saved along, the tokenizer's identity (:meth:`Tokenizer.sha256 <lmforge.tokenization.
Tokenizer.sha256>`, which covers its vocabulary, merges, special tokens and normalisation). A load checks the
files against it (:func:`verify_folder`); ``verify=False`` (``--no-verify``) skips the hashing, and a folder
saved before manifests existed loads with a warning. Non-finite weights are refused on every load.

This module knows the format only, not the models: :mod:`lmforge.checkpoint` holds the one loader that
rebuilds a model from any folder kind, and the models' own ``save`` writes through :func:`save` here.

Example:
    >>> import tempfile, lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> path = save(model, tempfile.mkdtemp() + "/gpt")
    >>> read_config(path) == model.config, sorted(p.name for p in path.iterdir())
    (True, ['config.json', 'manifest.json', 'model.safetensors'])
    >>> _ = verify_folder(path)  # sizes and sha256 of every file, as saved
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lmforge.config import ModelConfig
from lmforge.errors import IntegrityError, LmforgeError, UserInputError
from lmforge.tokenization import Tokenizer
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_dir, refuse_foreign_folder
from lmforge.utils.lock import remove_stale_temporaries
from lmforge.utils.manifest import MANIFEST_FILE, check_files, file_entries

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FORMAT = "lmforge-folder"

# The process-wide defaults of ``verify`` and ``allow_tokenizer_mismatch`` (see :func:`load_checks`): a command's
# flags reach every load it makes, however deep, without each library call passing them along.
_VERIFY = contextvars.ContextVar("lmforge_verify", default=True)
_ALLOW_TOKENIZER_MISMATCH = contextvars.ContextVar("lmforge_allow_tokenizer_mismatch", default=False)


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


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a model folder (lmforge's or Hugging Face's): a config and weights or a manifest;
    the one kind of folder :func:`save` replaces."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and ((path / WEIGHTS_FILE).is_file() or (path / MANIFEST_FILE).is_file())


def save(model: torch.nn.Module, path: str | Path, tokenizer=None, extra_files: dict[str, str] | None = None,
         manifest: bool = True) -> Path:
    """Write a model folder atomically and return its path.

    Args:
        model: an lmforge Transformer (anything with ``.config`` and a state dict).
        path: destination folder; replaced as a whole if it is a model folder (anything else there is refused:
            :func:`is_model_folder`). A killed earlier save's temporary beside it is removed first.
        tokenizer: an object with ``save(folder)`` or a path to a tokenizer.json to copy along.
        extra_files: name -> text of further files to write into the folder.
        manifest: write ``manifest.json`` (off only where an enclosing folder's manifest covers these files).
    """
    path = Path(path)
    refuse_foreign_folder(path, is_model_folder, "a model folder")
    remove_stale_temporaries(path.parent, path.name)
    tensors, aliases = canonical_state(model)
    with atomic_dir(path) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        with environment_errors(tmp / WEIGHTS_FILE, "write"):  # safetensors' Rust writer names the errno in words
            save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "aliases": json.dumps(aliases)})
        if tokenizer is not None:
            if isinstance(tokenizer, (str, Path)):
                shutil.copy(tokenizer, tmp / TOKENIZER_FILE)
            else:
                tokenizer.save(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if manifest:
            identity = None
            if tokenizer is not None:
                identity = tokenizer_identity(tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tmp))
            write_manifest(tmp, tokenizer=identity)
    return path


# ---------------------------------------------------------------------------------------- integrity
@contextlib.contextmanager
def load_checks(verify: bool = True, allow_tokenizer_mismatch: bool = False) -> Iterator[None]:
    """Within the block, loads that are not told otherwise verify manifests (or not) and refuse a tokenizer
    other than the folder's (or not): how ``--no-verify`` and ``--allow-tokenizer-mismatch`` reach them."""
    tokens = (_VERIFY.set(verify), _ALLOW_TOKENIZER_MISMATCH.set(allow_tokenizer_mismatch))
    try:
        yield
    finally:
        _VERIFY.reset(tokens[0])
        _ALLOW_TOKENIZER_MISMATCH.reset(tokens[1])


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, Any]:
    """What a folder records about its tokenizer: its sha256 (vocabulary, merges, special tokens), kind, size."""
    return {"sha256": tokenizer.sha256(), "kind": tokenizer.kind, "family": tokenizer.family,
            "vocab_size": tokenizer.vocab_size}


def write_manifest(folder: str | Path, tokenizer: dict[str, Any] | None = None) -> Path:
    """Write ``folder/manifest.json``: size and sha256 of every file below ``folder`` (+ the tokenizer's identity).

    Call it last, inside the temporary folder of an :func:`~lmforge.utils.io.atomic_dir`, so the manifest and
    the files it lists appear together. A manifest already there (a model folder staged inside a task folder)
    keeps its tokenizer record unless ``tokenizer`` replaces it.
    """
    folder = Path(folder)
    previous = read_manifest(folder) or {}
    manifest = {"format": MANIFEST_FORMAT, "version": 1, "files": file_entries(folder)}
    tokenizer = tokenizer or previous.get("tokenizer")
    if tokenizer:
        manifest["tokenizer"] = tokenizer
    file = folder / MANIFEST_FILE
    file.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return file


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The parsed ``manifest.json`` of a folder, or None when it has none; an unreadable one is an IntegrityError."""
    file = Path(folder) / MANIFEST_FILE
    if not file.is_file():
        return None
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{file}: damaged ({exc}); load with --no-verify (verify=False) to skip the check") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise IntegrityError(f"{file}: not an lmforge manifest (no 'files' mapping)")
    return manifest


def verify_folder(folder: str | Path, verify: bool | None = None) -> dict[str, Any] | None:
    """Check a saved folder against its manifest and return the manifest (None: no manifest, or not checked).

    Args:
        verify: check the files (default: True, or what :func:`load_checks` set); False checks nothing.

    Raises:
        IntegrityError: a listed file is missing, has another size, or another sha256; the message names it.
    """
    folder = Path(folder)
    if not (_VERIFY.get() if verify is None else verify):
        return None
    manifest = read_manifest(folder)
    if manifest is None:
        warnings.warn(f"{folder}: no {MANIFEST_FILE} (saved by an older lmforge), so damaged files cannot be "
                      "detected; save the model again to add one", stacklevel=2)
        return None
    try:
        check_files(folder, manifest["files"])
    except IntegrityError as exc:
        raise IntegrityError(f"{exc}; use a good copy, or --no-verify (verify=False) to load it anyway") from exc
    return manifest


def folder_tokenizer(folder: str | Path) -> dict[str, Any] | None:
    """The tokenizer identity a model folder records (its manifest, else its ``tokenizer.json``); None if none."""
    folder = Path(folder)
    recorded = (read_manifest(folder) or {}).get("tokenizer")
    if recorded:
        return recorded
    return tokenizer_identity(Tokenizer.load(folder)) if (folder / TOKENIZER_FILE).is_file() else None


def check_tokenizer(folder: str | Path, tokenizer: Tokenizer, source: str | Path = "the given tokenizer",
                    allow_mismatch: bool | None = None) -> None:
    """Refuse ``tokenizer`` for the model in ``folder`` when the folder records another one.

    Raises:
        UserInputError: the identities differ and ``allow_mismatch`` (``--allow-tokenizer-mismatch``) is off.
    """
    if _ALLOW_TOKENIZER_MISMATCH.get() if allow_mismatch is None else allow_mismatch:
        return
    recorded = folder_tokenizer(folder)
    if recorded is None or recorded.get("sha256") == tokenizer.sha256():
        return
    ours = tokenizer_identity(tokenizer)

    def describe(t: dict[str, Any]) -> str:
        return f"{t.get('kind')} {t.get('family')}, {t.get('vocab_size')} ids, sha256 {str(t.get('sha256'))[:12]}"

    raise UserInputError(f"{folder} was trained with another tokenizer ({describe(recorded)}) than {source} "
                         f"({describe(ours)}); use the model's own tokenizer, or pass --allow-tokenizer-mismatch "
                         "(allow_tokenizer_mismatch=True) to use this one anyway")


def read_config(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of an lmforge model folder; a missing folder or file is a CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a model folder (expected a directory with {CONFIG_FILE})")
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing; a model folder needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    return ModelConfig.load(cfg_file)


def load_weights(model: torch.nn.Module, weights: str | Path, strict: bool = True, prefix: str = "") -> None:
    """Fill ``model`` from a safetensors file, checking names and shapes; errors name the tensor.

    ``prefix``: the model's tensors are stored as ``prefix + name`` (a training-time wrapper saved them, e.g.
    ``model.``); stored tensors outside the prefix (the wrapper's own) are then left alone."""
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
            key = prefix + name
            source = key if key in stored else aliases.get(key)
            if source is None or source not in stored:
                if strict:
                    raise CheckpointError(f"{weights}: tensor {key!r} is missing (shape {tuple(target.shape)})")
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
            if tensor.is_floating_point() and not all_finite(tensor):
                # Checked on every load, --no-verify or not: a model with NaN/inf weights only produces garbage.
                raise IntegrityError(f"{weights}: tensor {source!r} holds NaN or infinite values (the file is damaged "
                                     "or training diverged); non-finite weights are always refused, even with "
                                     "--no-verify: use an earlier checkpoint")
            if tensor.dtype == torch.int8 and bool((tensor == -128).any()):
                # Quantised weights are symmetric: the int8 kernels negate them, and -128 has no int8 negation.
                raise IntegrityError(f"{weights}: tensor {source!r} holds -128, outside the [-127, 127] of lmforge's "
                                     "int8 weights (the file is damaged or was not written by lmforge quantize)")
            loaded[name] = tensor
        unexpected = {k for k in stored if k.startswith(prefix)} - {prefix + n for n in state} - set(aliases.values())
        if strict and unexpected:
            raise CheckpointError(f"{weights}: unexpected tensor(s) {', '.join(sorted(unexpected)[:5])}")
    model.load_state_dict(loaded, strict=False)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN or infinity. Its sum is one fast pass, finite whenever every value is
    (NaN and inf propagate); only a non-finite sum, or an overflow, takes the exact elementwise check, which
    writes a flag per value and is many times slower on a CPU.

    >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    >>> all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows; the values are finite
    True
    """
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def materialise(shell: torch.nn.Module) -> torch.nn.Module:
    """A meta-device model -> an uninitialised CPU model with its derived buffers computed.

    Derived buffers (sinusoid tables, RoPE frequencies, ALiBi slopes) are in no folder: every module that
    has them rebuilds them in ``reset_buffers``.
    """
    # What to_empty does, without its empty_like on meta tensors: that goes through torch's Python reference
    # kernels, whose first use imports sympy and the meta registrations (seconds of a fresh process's start).
    model = shell._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()
    return model
