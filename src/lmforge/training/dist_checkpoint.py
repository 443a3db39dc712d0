"""Sharded checkpoints for FSDP through ``torch.distributed.checkpoint`` (DCP): save, reshard on load, consolidate.

Layout of an FSDP checkpoint (the rest of the run folder is as in :mod:`lmforge.training.state`)::

    OUT/checkpoints/step-00000500/
        dcp/shard-00001-model-00001-of-00001.safetensors   rank 0's slices of every weight and Adam moment
        dcp/shard-00002-model-00001-of-00001.safetensors   rank 1's slices, ... (one file per rank)
        model/config.json                                  the ModelConfig, to rebuild the model from
        trainer_state.json                                 step, counters, optimizer hyper-parameters, and for
                                                           every rank its RNG states, objective and loader position
        manifest.json                                      sha256 of every file above, "layout": "sharded"

Every rank writes its own shard at the same time; nothing is gathered to one process. The shards are DCP's
safetensors storage (``HuggingFaceStorageWriter(save_distributed=True)``): each slice's place in the full
tensor is JSON in the shard's safetensors header. The default ``FileSystemWriter`` would also write a
``.metadata`` index with pickle, and reading it back unpickles; this layout needs no pickle at all. Non-tensor
state never enters DCP: it is JSON in ``trainer_state.json``.

Resharding. Loading asks DCP for the slices the *current* sharding needs and DCP reads them from whichever
shards hold them, so a checkpoint of W ranks loads on W' ranks, into a plain single-process model (``single``,
``ddp``), and back. A plain checkpoint (``model.safetensors`` + ``optimizer.safetensors``) loads into an FSDP
model too: rank 0 reads it and FSDP scatters the slices. The loader position is mapped to the same global
sample when the number of ranks or the batch size changes (:func:`reshard_data_state`).

Consolidation (:func:`consolidate`, ``lmforge checkpoint consolidate``) turns any checkpoint into a model folder
(``config.json`` + a single ``model.safetensors``) that :func:`lmforge.load` reads.

Example:
    >>> import pathlib, tempfile, torch, lmforge
    >>> from lmforge.training.state import CheckpointManager
    >>> run = pathlib.Path(tempfile.mkdtemp())   # stands for a run folder of `lmforge pretrain`
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
    >>> _ = CheckpointManager(run / "checkpoints").save(500, model, torch.optim.AdamW(model.parameters()), {})
    >>> consolidate(run / "checkpoints" / "step-00000500", run / "gpt-500").name
    'gpt-500'
    >>> lmforge.load(run / "gpt-500").config.n_layers
    1
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

# torch.distributed.checkpoint is imported by the functions that use it: it pulls in DTensor and sympy (seconds),
# and every command that imports the trainer (``lmforge finetune --help`` too) would pay that at start.

from lmforge import checkpoint as model_checkpoint
from lmforge.config import ModelConfig
from lmforge.model_folder import materialise
from lmforge.models import Transformer
from lmforge.tokenization import Tokenizer
from lmforge.training.distributed import DistContext
from lmforge.training.state import (
    FORMAT,
    MANIFEST_FILE,
    MODEL_DIR,
    OPTIMIZER_FILE,
    SHARDS_DIR,
    STATE_FILE,
    CheckpointManager,
    CorruptCheckpoint,
    from_json,
    load_checkpoint,
    to_json,
    verify_checkpoint,
    write_manifest,
)
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_dir, atomic_write_text
from lmforge.errors import InputFileNotFound

LAYOUT = "sharded"
RUN_CHECKPOINTS = "checkpoints"
RUN_TOKENIZER = "tokenizer"
RUN_MODEL = "model"  # where a finished run writes its final model (or task) folder


@contextlib.contextmanager
def _quiet_single_process():
    # DCP warns that it "assumes the intent is to load in a single process" even when no_dist says so.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def is_sharded(folder: str | Path) -> bool:
    """True for a checkpoint folder in the sharded (DCP) layout."""
    return (Path(folder) / SHARDS_DIR).is_dir()


def empty_model(config: ModelConfig) -> nn.Module:
    """An lmforge Transformer for ``config`` on the CPU, with uninitialised weights and derived buffers filled
    (skipping the random initialisation that loading would overwrite)."""
    with torch.device("meta"):
        model = Transformer(config)
    return materialise(model)


# ---------------------------------------------------------------------------------- optimizer groups
def param_groups_json(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's groups without their tensors: parameter names and hyper-parameters, as JSON."""
    return to_json([{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups])


def _check_groups(saved: list[dict[str, Any]], optimizer: torch.optim.Optimizer, where: Path) -> None:
    if [g.get("names") for g in saved] != [g.get("names") for g in optimizer.param_groups]:
        raise model_checkpoint.CheckpointError(
            f"{where}: the optimizer was saved for other parameters (e.g. a different model or no_decay setting)")


def _groups_to_load(template: list[dict[str, Any]], saved: list[dict[str, Any]],
                    optimizer: torch.optim.Optimizer, where: Path) -> list[dict[str, Any]]:
    """``template``'s groups (parameters by name) with the saved hyper-parameters, after checking that the
    saved groups name the same parameters as ``optimizer``'s."""
    _check_groups(saved, optimizer, where)
    groups = []
    for mine, theirs in zip(template, saved):
        hyper = {k: (tuple(v) if k == "betas" else v) for k, v in theirs.items() if k in mine and k != "params"}
        groups.append({**mine, **hyper})
    return groups


# ---------------------------------------------------------------------------------- save
def _write_shards(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    writer = HuggingFaceStorageWriter(str(folder), save_distributed=True)
    # A rank's full disk comes back as DCP's CheckpointException (a BaseException) holding the OSError.
    with environment_errors(folder, "write"):
        dcp.save({"model": model_state, "optimizer": optimizer_state["state"]}, storage_writer=writer)


def save_sharded(manager: CheckpointManager, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 state: dict[str, Any], ctx: DistContext) -> Path:
    """Write checkpoint ``step`` of an FSDP ``model``: each rank its DCP shard, rank 0 the JSON files.

    Collective: every rank calls it. ``state`` (JSON-able: step, counters, per-rank entries) is used on rank 0.
    The folder is built under a temporary name that rank 0 chooses and shares, and renamed into place only
    once every shard is written; then ``latest`` moves and old checkpoints rotate out.
    """
    final = manager.path(step)
    if ctx.is_main:
        manager.clean_temporaries()
        with atomic_dir(final) as tmp:
            ctx.broadcast_json(str(tmp))
            _write_shards(tmp / SHARDS_DIR, model, optimizer)  # returns once every rank's shard is on disk
            atomic_write_text(tmp / MODEL_DIR / model_checkpoint.CONFIG_FILE,
                              json.dumps(model.config.to_dict(), indent=2) + "\n")
            payload = {"format": FORMAT, "version": 1, **state,
                       "optimizer": {"param_groups": param_groups_json(optimizer)}}
            (tmp / STATE_FILE).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
            write_manifest(tmp, step, layout=LAYOUT)
        manager.publish(final)
    else:
        _write_shards(Path(ctx.broadcast_json()) / SHARDS_DIR, model, optimizer)
    ctx.barrier()  # no rank goes on (or reads `latest`) before the checkpoint is in place
    return final


# ---------------------------------------------------------------------------------- load
def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 saved_groups: list[dict[str, Any]] | None, ctx: DistContext) -> None:
    """Fill ``model`` (FSDP-sharded or plain) and ``optimizer`` from a sharded checkpoint of any world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    reader = HuggingFaceStorageReader(str(folder / SHARDS_DIR))
    if optimizer is None:
        model_state = get_model_state_dict(model)
        with _quiet_single_process():
            dcp.load({"model": model_state}, storage_reader=reader, no_dist=not ctx.grouped)
        set_model_state_dict(model, model_state)
        return
    # The templates say which slice of which tensor this rank holds; DCP reads exactly those.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    wanted = {"model": model_state, "optimizer": optimizer_state["state"]}
    with _quiet_single_process():
        dcp.load(wanted, storage_reader=reader, no_dist=not ctx.grouped)
    groups = _groups_to_load(optimizer_state["param_groups"], saved_groups or [], optimizer, folder)
    set_state_dict(model, optimizer, model_state_dict=wanted["model"],
                   optim_state_dict={"state": wanted["optimizer"], "param_groups": groups})


def _optimizer_by_name(path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A plain checkpoint's optimizer state, keyed by parameter name (the form FSDP's loaders take)."""
    groups = from_json(meta["param_groups"])
    names = [name for group in groups for name in group["names"]]  # positional index -> name
    state: dict[str, dict[str, Any]] = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            _, index, field = key.split(".", 2)
            state.setdefault(names[int(index)], {})[field] = f.get_tensor(key)
    for index, entry in meta["scalars"].items():
        state.setdefault(names[int(index)], {}).update(entry)
    groups = [{**g, "params": g["names"], **({"betas": tuple(g["betas"])} if "betas" in g else {})} for g in groups]
    return {"state": state, "param_groups": groups}


def load_full_into_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                           meta: dict[str, Any], ctx: DistContext) -> None:
    """Fill an FSDP ``model`` (and ``optimizer``) from a plain checkpoint: rank 0 reads the files, FSDP
    scatters each rank's slices (so only rank 0 ever holds the whole state)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    full_model: dict[str, torch.Tensor] = {}
    full_optimizer: dict[str, Any] = {}
    if ctx.is_main:
        copy = empty_model(model.config)
        model_checkpoint.load_weights(copy, folder / MODEL_DIR / model_checkpoint.WEIGHTS_FILE)
        full_model = copy.state_dict()
        if optimizer is not None:
            _check_groups(from_json(meta["param_groups"]), optimizer, folder)
            full_optimizer = _optimizer_by_name(folder / OPTIMIZER_FILE, meta)
    set_model_state_dict(model, full_model, options=options)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, full_optimizer, options=options)


def load_training_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                             raw: dict[str, Any], ctx: DistContext) -> dict[str, Any]:
    """Fill ``model`` and ``optimizer`` from a checkpoint of either layout, for ``ctx.strategy``; return the
    trainer state with its tensors decoded (``raw`` is ``trainer_state.json`` as read)."""
    sharded_model = ctx.strategy == "fsdp"
    if is_sharded(folder):
        load_sharded(folder, model, optimizer, raw.get("optimizer", {}).get("param_groups"), ctx)
    elif sharded_model:
        load_full_into_sharded(folder, model, optimizer, raw["optimizer"], ctx)
    else:
        return load_checkpoint(folder, model, optimizer, raw)
    return from_json({k: v for k, v in raw.items() if k != "optimizer"})


# ---------------------------------------------------------------------------------- per-rank state
def reshard_data_state(saved: list[Any], current: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """A loader position saved by the ranks of one run, for a rank of another world size or batch size.

    lmforge's loaders give sample ``g`` of an epoch to rank ``g % W`` and cut each rank's samples into
    consecutive batches, so ``b`` batches on each of W ranks of size B consumed exactly the epoch's global
    samples ``[0, b * B * W)``. The new rank resumes at the batch that starts there; when that is not a
    whole batch, it starts at the one before, and the returned count of samples are seen twice.

    Args:
        saved: the loader states of the saved ranks (``state_dict()`` of each), in rank order.
        current: this rank's loader ``state_dict()`` now (its rank, world size and batch size).

    Returns:
        ``(state to load, samples repeated)``; ``(None, 0)`` when the states are not lmforge loader states.
    """
    keys = {"epoch", "batch", "batch_size", "world_size", "rank"}
    if not saved or not all(isinstance(s, dict) and keys <= set(s) for s in [*saved, current]):
        return None, 0
    first = saved[0]
    consumed = first["batch"] * first["batch_size"] * first["world_size"]
    batch, repeated = divmod(consumed, current["batch_size"] * current["world_size"])
    return {**first, "rank": current["rank"], "world_size": current["world_size"],
            "batch_size": current["batch_size"], "batch": batch}, repeated


# ---------------------------------------------------------------------------------- consolidation
def find_checkpoint(src: str | Path) -> Path:
    """The checkpoint folder ``src`` names: a ``step-NNNNNNNN`` folder itself, or the newest intact checkpoint
    of a ``checkpoints`` folder or of a run folder. Read-only (a running job's temporary folders are left
    alone); damaged checkpoints are skipped with a warning, as on resume.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint.
        CorruptCheckpoint: ``src`` is a checkpoint folder that fails its checksums, or every one is damaged.
    """
    src = Path(src)
    if (src / MANIFEST_FILE).is_file():
        verify_checkpoint(src)
        return src
    manager = CheckpointManager(src / RUN_CHECKPOINTS if (src / RUN_CHECKPOINTS).is_dir() else src)
    names = [manager.path(s).name for s in reversed(manager.steps())]
    latest = manager.latest_name()
    if latest in names:
        names.insert(0, names.pop(names.index(latest)))
    if not names:
        raise InputFileNotFound(f"{src}: no training checkpoint (expected a step-NNNNNNNN folder, a checkpoints "
                                "folder or a run folder)")
    problems = []
    for name in names:
        try:
            verify_checkpoint(manager.root / name)
            return manager.root / name
        except CorruptCheckpoint as exc:
            problems.append(str(exc))
            warnings.warn(f"checkpoint {name} is corrupt ({exc}); trying the previous one", stacklevel=2)
    raise CorruptCheckpoint(f"{manager.root}: every checkpoint is damaged:\n  " + "\n  ".join(problems))


def consolidate(src: str | Path, dst: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write the weights of a training checkpoint (either layout, any world size) as a model folder.

    Args:
        src: a checkpoint folder, a ``checkpoints`` folder or a run folder (see :func:`find_checkpoint`).
        dst: the model folder to write (``config.json`` + ``model.safetensors``), replaced atomically.
        tokenizer: a tokenizer folder to include; default: the run's ``tokenizer/`` when ``src`` is inside a run.

    Returns:
        ``dst``, loadable by :func:`lmforge.load`.
    """
    return write_model_folder(find_checkpoint(src), dst, tokenizer)


def write_model_folder(folder: Path, dst: str | Path, tokenizer: str | Path | None = None,
                       model: nn.Module | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """:func:`consolidate` for a checkpoint folder already verified by :func:`find_checkpoint` (or, with
    ``model``, that model's weights written in the folder's place, e.g. an average of checkpoints).
    ``tokenizer`` defaults to the run's (``RUN/tokenizer``, else the one in its final ``RUN/model``)."""
    if model is None:
        model = checkpoint_model(folder)
    run = folder.parent.parent
    if tokenizer is None and (run / RUN_TOKENIZER).is_dir():
        tokenizer = run / RUN_TOKENIZER
    elif tokenizer is None and (run / RUN_MODEL / model_checkpoint.TOKENIZER_FILE).is_file():
        tokenizer = run / RUN_MODEL
    return model_checkpoint.save(model, dst, tokenizer=Tokenizer.load(tokenizer) if tokenizer else None,
                                 extra_files=extra_files)


def stored_prefix(stored: set[str], names: list[str]) -> str:
    """The prefix under which a checkpoint stores a model's tensors ``names``: ``""`` for the model itself, or
    what a training-time wrapper put before them (``model.`` for permuted LM's two-stream wrapper, which adds
    its own ``query_init``; ``discriminator.`` for ELECTRA's pair, beside its generator). ``""`` when no prefix holds every name, so that the loader names a missing tensor.

    Example:
        >>> stored_prefix({"model.w", "model.b", "query_init"}, ["w", "b"]), stored_prefix({"w", "b"}, ["w", "b"])
        ('model.', '')
    """
    if not names or all(n in stored for n in names):
        return ""
    for key in sorted(stored):
        if key.endswith("." + names[0]):
            prefix = key[: len(key) - len(names[0])]
            if all(prefix + n in stored for n in names):
                return prefix
    return ""


def saved_config(model_dir: Path) -> ModelConfig:
    """The config of the model a checkpoint's run saves as ``RUN/model``: the checkpoint's own, or for ELECTRA's
    generator + discriminator pair (whose config records both, under ``electra``) the discriminator's."""
    file = model_dir / model_checkpoint.CONFIG_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None  # read_config names the problem
    if isinstance(data, dict) and isinstance(data.get("electra"), dict) and "discriminator" in data["electra"]:
        return ModelConfig.from_dict(data["electra"]["discriminator"], source=f"{file} (electra.discriminator)")
    return model_checkpoint.read_config(model_dir)


def checkpoint_model(folder: Path) -> nn.Module:
    """The model of a verified checkpoint folder (either layout), its weights loaded; a run that trained the
    model inside a wrapper (its tensors stored under a prefix, see :func:`stored_prefix`) gives the model it
    saves: permuted LM's encoder, ELECTRA's discriminator."""
    model = empty_model(saved_config(folder / MODEL_DIR))
    names = list(model.state_dict())
    if is_sharded(folder):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        reader = HuggingFaceStorageReader(str(folder / SHARDS_DIR))
        # DCP keys are "model." + the saved module's state-dict key (the optimizer's are "optimizer.")
        stored = {k.removeprefix("model.") for k in reader.read_metadata().state_dict_metadata if k.startswith("model.")}
        prefix = stored_prefix(stored, names)
        state = {prefix + name: tensor for name, tensor in model.state_dict().items()}
        with _quiet_single_process():
            dcp.load({"model": state}, storage_reader=reader, no_dist=True)
        model.load_state_dict({name[len(prefix):]: tensor for name, tensor in state.items()})
    else:
        weights = folder / MODEL_DIR / model_checkpoint.WEIGHTS_FILE
        with safe_open(str(weights), framework="pt") as f:  # stored names, and the tied ones' aliases
            stored = set(f.keys()) | set(json.loads((f.metadata() or {}).get("aliases", "{}")))
        model_checkpoint.load_weights(model, weights, prefix=stored_prefix(stored, names))
    return model


def unsharded_copy(model: nn.Module, ctx: DistContext) -> nn.Module | None:
    """The whole FSDP ``model`` as a plain CPU Transformer on rank 0 (None elsewhere). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not ctx.is_main:
        return None
    copy = empty_model(model.config)
    copy.load_state_dict(full)
    return copy
