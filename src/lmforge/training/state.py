"""Training checkpoints: what exact resume needs, written atomically, verified on load, rotated.

Layout of a run folder's checkpoints::

    OUT/checkpoints/step-00000500/
        model/config.json, model/model.safetensors   the weights (lmforge.checkpoint format)
        optimizer.safetensors                         AdamW moments and step counters, flattened (absent from
                                                      a finished run's ``final_checkpoint: weights``)
        trainer_state.json                            step, counters, RNG states, objective and loader
                                                      positions, optimizer hyper-parameters
        manifest.json                                 sha256 of every file above (written last)
    OUT/checkpoints/latest                            "step-00000500": the newest complete checkpoint

FSDP runs write the *sharded* layout instead (``dcp/`` shards in place of the weight and optimizer files, and
``"layout": "sharded"`` in the manifest): see :mod:`lmforge.training.dist_checkpoint`. Both layouts share the
manifest, the ``latest`` pointer, rotation and fallback defined here.

Nothing is pickled: tensors go to safetensors and everything else to JSON. Generator states (torch,
numpy, Python's ``random``) become lists or base64 text (:func:`to_json` / :func:`from_json`).

Crash safety. A checkpoint is built in a temporary sibling folder and renamed into place
(:func:`lmforge.utils.io.atomic_dir`); only then is ``latest`` rewritten (atomically), and only then are
old checkpoints deleted. A SIGKILL at any moment therefore leaves ``latest`` naming a complete folder.
Silent damage (a truncated or altered file) is caught by the manifest's checksums; :meth:`CheckpointManager.
latest_valid` then warns and falls back to the previous checkpoint.

Example:
    >>> import random, tempfile
    >>> state = capture_rng()
    >>> a = random.random()
    >>> restore_rng(from_json(json.loads(json.dumps(to_json(state)))))
    >>> random.random() == a
    True
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lmforge import checkpoint as model_checkpoint
from lmforge.errors import LmforgeError
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_dir, atomic_write_text
from lmforge.utils.manifest import sha256_file

FORMAT = "lmforge-train-checkpoint"
MODEL_DIR = "model"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"
STEP_DIR = re.compile(r"^step-(\d{8})$")
REQUIRED = (f"{MODEL_DIR}/{model_checkpoint.CONFIG_FILE}", f"{MODEL_DIR}/{model_checkpoint.WEIGHTS_FILE}",
            OPTIMIZER_FILE, STATE_FILE)
SHARDS_DIR = "dcp"  # the sharded layout's DCP folder: one safetensors shard per rank
REQUIRED_SHARDED = (f"{MODEL_DIR}/{model_checkpoint.CONFIG_FILE}", STATE_FILE)


class CorruptCheckpoint(LmforgeError, ValueError):
    """A checkpoint folder is incomplete or fails its checksums; the message says which file."""


# ---------------------------------------------------------------------------------- JSON encoding
def to_json(value: Any) -> Any:
    """Plain-JSON form of nested dicts/lists holding tensors, numpy arrays and scalars.

    Tensors and arrays become ``{"__tensor__"|"__ndarray__": base64, "dtype", "shape"}``; tuples become lists.
    """
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        # numpy has no bfloat16: its bytes travel as uint8 (reshape first: a 0-d tensor cannot be viewed).
        raw = (t.reshape(-1).view(torch.uint8) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        return {"__tensor__": base64.b64encode(raw).decode("ascii"), "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return {"__ndarray__": base64.b64encode(a.tobytes()).decode("ascii"), "dtype": a.dtype.str,
                "shape": list(a.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint's JSON state")


def from_json(value: Any) -> Any:
    """Inverse of :func:`to_json` (tuples come back as lists)."""
    if isinstance(value, dict):
        if "__tensor__" in value:
            raw = bytearray(base64.b64decode(value["__tensor__"]))
            dtype = getattr(torch, value["dtype"])
            flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            return flat.reshape(value["shape"]).clone()
        if "__ndarray__" in value:
            raw = base64.b64decode(value["__ndarray__"])
            return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


# ---------------------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """States of Python's ``random``, numpy's global generator, torch's CPU and CUDA generators."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"python": [version, list(mt), gauss], "numpy": [kind, keys, int(pos), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng` (after a round trip through :func:`to_json`/:func:`from_json`)."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------- optimizer
def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into flat tensors (``state.<index>.<key>``) and JSON-able rest."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": to_json(sd["param_groups"]), "scalars": scalars}


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path, meta: dict[str, Any]) -> None:
    """Restore what :func:`optimizer_tensors` split, checking that the parameter groups still match."""
    current = optimizer.state_dict()["param_groups"]
    saved = from_json(meta["param_groups"])
    mine = [g.get("names", g["params"]) for g in current]
    theirs = [g.get("names", g["params"]) for g in saved]
    if mine != theirs:
        raise model_checkpoint.CheckpointError(
            f"{path}: the optimizer was saved for other parameters (e.g. a different model or no_decay setting)")
    state: dict[int, dict[str, Any]] = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = f.get_tensor(name)
    for index, entry in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entry)
    for group, old in zip(saved, current):
        group["params"] = old["params"]
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": saved})


# ---------------------------------------------------------------------------------- files
def write_manifest(folder: Path, step: int | None, layout: str = "full", weights_only: bool = False) -> None:
    """Checksum every file of a (temporary) checkpoint folder into ``manifest.json``; the last file written."""
    files = {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "version": 1, "step": step, "files": files}
    if layout != "full":
        manifest["layout"] = layout
    if weights_only:
        manifest["weights_only"] = True
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def write_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                     state: dict[str, Any]) -> Path:
    """Write one checkpoint folder atomically (see the module docstring); ``state`` must be JSON-able.

    ``optimizer=None`` writes a weights-only checkpoint: its state says ``"optimizer": null``, and resuming from
    it restarts the optimizer (:func:`load_checkpoint` warns)."""
    tensors, optimizer_meta = optimizer_tensors(optimizer) if optimizer is not None else ({}, None)
    payload = json.dumps({"format": FORMAT, "version": 1, **state, "optimizer": optimizer_meta}, indent=1)
    with atomic_dir(folder) as tmp:
        model_checkpoint.save(model, tmp / MODEL_DIR, manifest=False)  # the checkpoint's manifest covers it
        if optimizer is not None:
            with environment_errors(tmp / OPTIMIZER_FILE, "write"):
                save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata={"format": "pt"})
        (tmp / STATE_FILE).write_text(payload + "\n", encoding="utf-8")
        write_manifest(tmp, state.get("step"), weights_only=optimizer is None)
    return folder


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """Check a checkpoint folder against its manifest; return its parsed ``trainer_state.json``.

    Raises:
        CorruptCheckpoint: a missing manifest or file, a checksum mismatch, or unreadable state.
    """
    manifest_path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{manifest_path}: missing or unreadable ({exc})") from exc
    sharded = manifest.get("layout") == "sharded"
    required = REQUIRED_SHARDED if sharded else REQUIRED
    for name in required if not manifest.get("weights_only") else [n for n in required if n != OPTIMIZER_FILE]:
        if name not in files:
            raise CorruptCheckpoint(f"{folder}: the manifest does not list {name}")
    if sharded and not any(name.startswith(f"{SHARDS_DIR}/") for name in files):
        raise CorruptCheckpoint(f"{folder}: the manifest lists no {SHARDS_DIR}/ shard")
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path}: missing")
        if sha256_file(path) != want:
            raise CorruptCheckpoint(f"{path}: checksum mismatch (the file was truncated or altered)")
    try:
        return json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CorruptCheckpoint(f"{folder / STATE_FILE}: not valid JSON ({exc})") from exc


def load_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fill ``model`` (and ``optimizer``) from a checkpoint folder; return its state with tensors decoded."""
    state = verify_checkpoint(folder) if state is None else state
    model_checkpoint.load_weights(model, folder / MODEL_DIR / model_checkpoint.WEIGHTS_FILE)
    if optimizer is not None and state.get("optimizer") is None:
        warnings.warn(f"{folder} holds no optimizer state (the run finished with final_checkpoint: weights): the "
                      "weights continue from it, the optimizer restarts with empty AdamW moments", stacklevel=3)
    elif optimizer is not None:
        try:
            load_optimizer(optimizer, folder / OPTIMIZER_FILE, state["optimizer"])
        except SafetensorError as exc:
            raise CorruptCheckpoint(f"{folder / OPTIMIZER_FILE}: unreadable ({exc})") from exc
    return from_json({k: v for k, v in state.items() if k != "optimizer"})


class CheckpointManager:
    """``OUT/checkpoints``: numbered checkpoint folders, the ``latest`` pointer, rotation and fallback.

    Args:
        root: the ``checkpoints`` folder (created on first save).
        keep: how many of the newest checkpoints to keep (older ones are deleted after each save).

    Example:
        >>> import tempfile, lmforge
        >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> manager = CheckpointManager(Path(tempfile.mkdtemp()) / "checkpoints", keep=2)
        >>> manager.save(100, model, optimizer, {"step": 100}).name
        'step-00000100'
        >>> manager.latest_valid()[0].name
        'step-00000100'
    """

    def __init__(self, root: str | Path, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.root / f"step-{step:08d}"

    def steps(self) -> list[int]:
        """Steps of the checkpoint folders present, ascending (complete or not; see :meth:`latest_valid`)."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())

    def latest_name(self) -> str | None:
        """The folder name ``latest`` points to, or None if it is missing or unreadable."""
        try:
            name = (self.root / LATEST_FILE).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return name if STEP_DIR.match(name) else None

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` (without ``optimizer``: weights only), point ``latest`` at it, then delete all
        but the newest ``keep``."""
        self.clean_temporaries()
        return self.publish(write_checkpoint(self.path(step), model, optimizer, state))

    def publish(self, folder: Path) -> Path:
        """Point ``latest`` at a complete checkpoint folder, then delete all but the newest ``keep``."""
        atomic_write_text(self.root / LATEST_FILE, folder.name + "\n")
        self.rotate()
        return folder

    def rotate(self) -> None:
        latest = self.latest_name()
        for step in self.steps()[:-self.keep]:
            if self.path(step).name != latest:
                shutil.rmtree(self.path(step), ignore_errors=True)

    def clean_temporaries(self) -> None:
        """Remove what a killed save leaves behind: ``.step-*.tmp`` folders, and restore a ``.step-*.old``
        whose replacement never arrived."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.name.startswith(".step-") and p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            elif p.name.startswith(".step-") and p.name.endswith(".old"):
                target = self.root / p.name[1:-len(".old")]
                if target.exists():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.replace(p, target)
            elif p.name.startswith(f".{LATEST_FILE}.") and p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)

    def latest_valid(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that passes :func:`verify_checkpoint`, with its state; None if there is none.

        ``latest`` is tried first, then the other folders from the newest down. Each corrupt one is reported
        with a warning naming the damaged file, so a fallback is never silent.

        Raises:
            CorruptCheckpoint: checkpoint folders exist but every one of them is damaged.
        """
        self.clean_temporaries()
        names = [self.path(s).name for s in reversed(self.steps())]
        latest = self.latest_name()
        if latest in names:
            names.remove(latest)
            names.insert(0, latest)
        if not names:
            return None
        problems = []
        for name in names:
            folder = self.root / name
            try:
                return folder, verify_checkpoint(folder)
            except CorruptCheckpoint as exc:
                problems.append(str(exc))
                warnings.warn(f"checkpoint {name} is corrupt ({exc}); falling back to the previous checkpoint",
                              stacklevel=2)
        raise CorruptCheckpoint(f"{self.root}: every checkpoint is damaged:\n  " + "\n  ".join(problems))
