"""Inference precision of a model: its dtype (fp32 | bf16) and quantisation (none | int8 | int4).

:func:`quantize_model` swaps every plain ``nn.Linear`` for a :class:`~lmforge.nn.weight_only.WeightOnlyLinear`
(int8 per output row, int4 per group of ``group_size`` inputs), and the token table an LM head is tied to for a
:class:`~lmforge.nn.weight_only.WeightOnlyEmbedding` (rows quantised the same way: the head multiplies by it
with the same kernels, and lookups dequantise the rows they read). Norms, position tables and untied tables
stay in full precision. An int4 layer whose input width is not a multiple of the group size is **kept in full
precision with a notice naming it** (quantising it would need padding the kernel does not take). On an x86 CPU an
int8 layer also rounds its activations per call, for an integer matmul (see :mod:`lmforge.nn.weight_only`).

A quantised model saves as an ordinary model folder whose ``quantization.json`` (covered by the manifest)
records the mode, group size and the layers converted; :func:`lmforge.checkpoint.load` rebuilds those layers
before reading the weights, so the folder loads without re-quantising. Such a folder is for inference only:
:func:`refuse_training` refuses it (train from the full-precision folder, or QLoRA with ``--peft qlora``).

:func:`precision` sets, for a block, the dtype and quantisation every :func:`lmforge.checkpoint.load` applies
(how ``--dtype`` and ``--quantize`` reach the loads a command makes); :func:`apply_precision` applies them
to one model.

Example:
    >>> import lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> record = quantize_model(model, "int8")
    >>> record["mode"], len(record["layers"]) == sum(type(m) is WeightOnlyLinear for m in model.modules()) > 0
    ('int8', True)
    >>> record["embeddings"], type(model.embed_tokens).__name__          # gpt-tiny's LM head is tied to it
    (['embed_tokens'], 'WeightOnlyEmbedding')
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from lmforge.errors import UserInputError
from lmforge.model_folder import save
from lmforge.models.heads import LMHead
from lmforge.nn import gemv
from lmforge.nn.weight_only import DEFAULT_GROUP_SIZE, MODES, WeightOnlyEmbedding, WeightOnlyLinear
from lmforge.utils.machine import native_bf16

QUANT_FILE = "quantization.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
QUANTIZE_CHOICES = ("none", *MODES)

_PRECISION = contextvars.ContextVar("lmforge_precision", default=(None, None))


def _notice(message: str) -> None:
    print(f"notice: {message}", file=sys.stderr, flush=True)


def _linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]


def _tied_tables(model: nn.Module) -> list[tuple[str, nn.Embedding]]:
    """The token table a tied LM head multiplies by (``decoder_embed_tokens`` if the model has one), if any."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, LMHead) or head.weight is not None or head.proj is not None:  # not tied to a table
        return []
    for name in ("decoder_embed_tokens", "embed_tokens"):
        table = getattr(model, name, None)
        if type(table) is nn.Embedding:
            return [(name, table)]
    return []


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def quantize_model(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, Any]:
    """Quantise ``model``'s linear layers in place; returns the record :func:`save_quantized` stores.

    Returns:
        ``{"mode", "group_size", "layers": [linears converted], "embeddings": [tied tables converted],
        "kept": {name: why kept in full precision}}``.
    """
    if mode not in MODES:
        raise UserInputError(f"quantisation {mode!r}: expected one of {', '.join(MODES)}")
    if quantization_of(model) is not None:
        raise UserInputError(f"the model is already quantised ({quantization_of(model)['mode']}); "
                             "quantise the full-precision model instead")
    layers, tables, kept = [], [], {}
    for name, layer in [*_linears(model), *_tied_tables(model)]:
        width = layer.in_features if isinstance(layer, nn.Linear) else layer.embedding_dim
        if mode == "int4" and width % group_size:
            kept[name] = f"input width {width} is not a multiple of the group size {group_size}"
            _notice(f"{name}: kept in full precision ({kept[name]})")
            continue
        if isinstance(layer, nn.Linear):
            _swap(model, name, WeightOnlyLinear.from_linear(layer, mode, group_size))
            layers.append(name)
        else:
            _swap(model, name, WeightOnlyEmbedding.from_embedding(layer, mode, group_size))
            tables.append(name)
    record = {"mode": mode, "group_size": group_size, "layers": layers, "embeddings": tables, "kept": kept}
    model._lmforge_quantization = record
    return record


def quantization_of(model: nn.Module) -> dict[str, Any] | None:
    """The quantisation record of a model :func:`quantize_model` converted (or a quantised folder gave), or None."""
    return getattr(model, "_lmforge_quantization", None)


def read_quantization(folder: str | Path) -> dict[str, Any] | None:
    """The record in a model folder's ``quantization.json``, or None for a full-precision folder."""
    file = Path(folder) / QUANT_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserInputError(f"{file}: not valid JSON ({exc}); quantise the model again") from exc
    if record.get("mode") not in MODES or not isinstance(record.get("layers"), list):
        raise UserInputError(f"{file}: expected a mode ({', '.join(MODES)}) and a list of layers")
    return record


def quantized_shell(model: nn.Module, record: dict[str, Any]) -> nn.Module:
    """Give ``model`` empty quantised layers where ``record`` lists them, ready for the folder's weights."""
    for name in record["layers"]:
        try:
            layer = model.get_submodule(name)
        except AttributeError as exc:
            raise UserInputError(f"{QUANT_FILE}: layer {name!r} is not in the model the config builds") from exc
        _swap(model, name, WeightOnlyLinear(layer.in_features, layer.out_features, record["mode"],
                                            record.get("group_size", DEFAULT_GROUP_SIZE), layer.bias is not None))
    for name in record.get("embeddings", []):  # folders written before tables were quantised have none
        table = getattr(model, name, None)
        if type(table) is not nn.Embedding:
            raise UserInputError(f"{QUANT_FILE}: embedding {name!r} is not in the model the config builds")
        _swap(model, name, WeightOnlyEmbedding(table.num_embeddings, table.embedding_dim, record["mode"],
                                               record.get("group_size", DEFAULT_GROUP_SIZE)))
    model._lmforge_quantization = record
    return model


def quant_file_text(model: nn.Module) -> dict[str, str]:
    """The extra file a quantised model's folder carries (``{}`` for a full-precision model)."""
    record = quantization_of(model)
    return {} if record is None else {QUANT_FILE: json.dumps(record, indent=1) + "\n"}


def save_quantized(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write a (quantised) model as a model folder with its ``quantization.json``; returns the path."""
    return save(model, path, tokenizer=tokenizer, extra_files=quant_file_text(model))


def refuse_training(folder: str | Path, what: str = "training") -> None:
    """Refuse a quantised model folder as the start of ``what``: its weights are rounded and frozen."""
    record = read_quantization(folder) if Path(folder).is_dir() else None
    if record is not None:
        raise UserInputError(f"{folder}: a {record['mode']}-quantised model folder is for inference only, not for "
                             f"{what}; train from the full-precision folder (with --peft qlora to fine-tune on "
                             "4-bit weights)")


# ---------------------------------------------------------------------------------------- precision
@contextlib.contextmanager
def precision(dtype: str | None = None, quantize: str | None = None) -> Iterator[None]:
    """Within the block, :func:`lmforge.checkpoint.load` gives models in ``dtype`` (fp32 | bf16), quantised
    (``quantize``: none | int8 | int4) unless their folder already is."""
    token = _PRECISION.set((dtype, quantize))
    try:
        yield
    finally:
        _PRECISION.reset(token)


def current_precision() -> tuple[str | None, str | None]:
    """(dtype, quantize) set by the innermost :func:`precision` block, (None, None) outside any."""
    return _PRECISION.get()


def apply_precision(model: nn.Module, dtype: str | None = None, quantize: str | None = None) -> nn.Module:
    """``model`` quantised (weight-only, unless already quantised) and cast to ``dtype``, in place.

    Quantisation reads the fp32 weights, before the cast; a quantised model given ``quantize`` again keeps
    its own quantisation. ``bf16`` on a CPU without native bf16 runs lmforge's bf16 kernel
    (:mod:`lmforge.nn.gemv`), or warns where that is unavailable: its matmuls then take oneDNN's slower fallback.
    """
    if dtype is not None and dtype not in DTYPES:
        raise UserInputError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise UserInputError(f"--quantize {quantize}: expected one of {', '.join(QUANTIZE_CHOICES)}")
    if quantize not in (None, "none") and quantization_of(model) is None:
        quantize_model(model, quantize)
    if dtype == "bf16":
        if next(model.parameters()).device.type == "cpu" and not native_bf16("cpu") and not gemv.available():
            warnings.warn("--dtype bf16: this CPU has no native bf16 instructions (AVX512-BF16/AMX) and lmforge's "
                          f"bf16 kernel is unavailable ({gemv.unavailable_reason()}), so bf16 matmuls take oneDNN's "
                          "slower emulated fallback, likely slower than fp32; use --dtype fp32", stacklevel=2)
        quantized = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
        scales = [m.scales.data for m in quantized]
        model.to(torch.bfloat16)  # casts floating tensors only: the int8/uint8 weights keep their dtype
        for module, kept in zip(quantized, scales):
            module.scales.data = kept  # fp32 as saved (a bf16 round trip would move every weight); cast per call
    elif dtype == "fp32":
        model.to(torch.float32)
    return model
