"""A decode step's compiled layer packaged by AOTInductor, so that a new process runs it without Dynamo or inductor.

A regional step (:class:`lmforge.generation.compiled._Region`) runs one compiled layer for every layer, with the
weights as inputs. Saved as torch's precompile (:mod:`lmforge.generation.step_artifact`), a new process still
imports Dynamo and inductor and unpickles inductor's output code before its first compiled token: on GPT-2 int8,
2 cores, that was most of a warm start's 6-9 s. Here the layer is exported (``torch.export``), compiled ahead by
AOTInductor into a shared library, and packaged (``.pt2``) beside inductor's caches. A new process opens it with
torch's C++ package loader (``torch._C._aoti``), which needs neither.

Building a package takes longer than Dynamo's compile (on that model: cold starts of 21-28 s against 13-17 s, most
of it g++ on AOTInductor's C++ wrapper), so the first process does not wait for it. With ``compile="cached"`` (the
regional step's mode) it compiles nothing: it runs the layer eagerly, and exports it only as it exits
(:func:`package_when_exiting`), for a detached child process to package at low priority. Where the layer's code was
saved by Dynamo's precompile instead (or packaging was off), it loads that and, at its second step, exports the layer
for packaging at exit (:func:`package_at_exit`). Later processes open the package. (While a child
builds, other processes on its cores decode slower, a low priority notwithstanding: an eager GPT-2 int8 generation
of 128 tokens on 2 cores took 14-24 s beside one instead of 2-4 s.)

    layer i        [*weights of layer i, x (N, 1, D), mask (N, 1, C), rope..., keys (N, H_kv, C, hd), values, slot]
                   -> package.run -> x (N, 1, D); keys and values written in place at ``slot``

What the package holds is one layer's code; the weights are read from the live model at every call, and a layer is
run by the package only if its :func:`signature` (classes, plain attributes, tensor names and shapes) equals the
layer it was built from: GPT-2's per-layer attention scale, for one, makes the layers differ, and the step is then
compiled whole by Dynamo as before.

Never stale: the file is named by :func:`key`, which covers the layer's signature, the step's input shapes, the
switches the step depends on, and the source of every ``lmforge.nn`` and ``lmforge.models`` module (and this one's
callers); the folder is named for torch's version and the CPU. A package is loaded only from a folder this user owns
that no one else can write to (it holds a shared library). One that fails to load is deleted, with a warning, and
built again. (The exported program the child reads is torch's own archive, written by this user into that folder.)

Example:
    >>> import torch
    >>> from lmforge.nn.weight_only import WeightOnlyLinear
    >>> a, b = WeightOnlyLinear(8, 8, "int8"), WeightOnlyLinear(8, 8, "int8")
    >>> signature(a) == signature(b), signature(a) == signature(WeightOnlyLinear(8, 16, "int8"))
    (True, False)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves, tree_map_only

import lmforge.generation.step_artifact as step_artifact  # the module, not the package (which imports this one)
from lmforge.utils.io import atomic_write_bytes

FORMAT = 1  # of the key: a change makes every older package unused
SUFFIX = ".pt2"
# No precompiled header of AOTInductor's runtime: each new compile-cache folder got one of its own (~9 s to build,
# 130-150 MB in inductor's folder under /tmp, outside lmforge's cache, never removed), which a test's folder uses once.
BUILD_OPTIONS = {"aot_inductor.precompile_headers": False}
STALE_CLAIM_S = 1800  # a claim this old is taken over (its process may have died; at worst two build one package)
_SOURCES = ("lmforge.nn", "lmforge.models", "lmforge.generation.compiled", "lmforge.generation.packaged_region")


def _plain(value) -> object:
    """A description of a module attribute that is the same in every process: plain values, dtypes and enums by
    value, containers and dataclasses (a config) field by field, callables by qualified name, anything else by its
    repr unless that names a memory address, else by its type."""
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device, enum.Enum)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(value) and not isinstance(value, nn.Module):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text


def signature(block: nn.Module) -> str | None:
    """What a layer's compiled code depends on besides its weights' values: its modules' classes and plain
    attributes, and its parameters' and buffers' names, types and shapes. None when a module holds a tensor that
    is neither (export would compile its value in)."""
    parts = []
    for name, module in block.named_modules():
        attributes = {}
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr == "training":
                continue
            if isinstance(value, torch.Tensor):
                return None
            attributes[attr] = _plain(value)
        parts.append([name, f"{type(module).__module__}.{type(module).__qualname__}", attributes])
    parts += [[n, step_artifact._describe(t)] for n, t in (*block.named_parameters(), *block.named_buffers())]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def key(layer_signature: str, inputs: list[torch.Tensor], switches: dict) -> str:
    """The package's file name: the layer, the shapes of the step's inputs, ``switches``, and the source of the
    modules its code comes from."""
    sources = {name: step_artifact._module_state(name) for name in sorted(sys.modules)
               if name.startswith(_SOURCES)}
    text = json.dumps({"format": FORMAT, "layer": layer_signature, "inputs": step_artifact._describe(inputs),
                       "switches": switches, "sources": sources, "torch": torch.__version__}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def path_for(folder: Path, name: str) -> Path:
    return folder / "regions" / f"{name}{SUFFIX}"


def _tensors(inputs: tuple) -> list[torch.Tensor]:
    """The tensors of a step's inputs in the order export flattens them (a None input is a constant)."""
    return [t for t in tree_leaves(inputs) if t is not None]


def weights(block: nn.Module) -> list[torch.Tensor]:
    """The tensors a package takes for ``block``, in its order: parameters, then buffers."""
    return [*block.parameters(), *block.buffers()]


class _Apply(nn.Module):
    def __init__(self, block: nn.Module, run):
        super().__init__()
        self.block, self.run = block, run

    def forward(self, *inputs):
        return self.run(self.block, *inputs)


class _Layer(nn.Module):
    """``run(block, *inputs)`` as a function of ``block``'s weights (what is exported), so that the package serves
    every layer of its signature."""

    def __init__(self, block: nn.Module, run):
        super().__init__()
        self.apply_ = _Apply(block, run)
        self.names = [f"block.{n}" for n, _ in (*block.named_parameters(), *block.named_buffers())]

    def forward(self, weights: list[torch.Tensor], *inputs):
        return torch.func.functional_call(self.apply_, dict(zip(self.names, weights)), inputs)


class PackagedRegion:
    """A layer's package, opened: ``region(weights(block), inputs)`` runs it on ``block``'s weights.

    Args:
        loader: torch's ``AOTIModelPackageLoader`` of the package. The caller runs only layers whose
            :func:`signature` is the one the package was located by (:func:`locate`).
    """

    def __init__(self, loader):
        self.loader = loader

    def __call__(self, layer_weights: list[torch.Tensor], inputs: tuple) -> torch.Tensor:
        return self.loader.run([*layer_weights, *_tensors(inputs)])[0]


def _open(path: Path) -> PackagedRegion | None:
    try:
        return PackagedRegion(torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1))
    except Exception as exc:
        warnings.warn(f"compile=True: the packaged layer {path} could not be loaded ({type(exc).__name__}); "
                      "building it again", stacklevel=4)
        path.unlink(missing_ok=True)
        return None


def locate(block: nn.Module, inputs: tuple, folder: Path, switches: dict) -> tuple[Path, str] | None:
    """Where the package of ``block`` for ``inputs`` lives in ``folder``, and the layer's :func:`signature`; None
    when the layer cannot be packaged (a tensor attribute)."""
    layer_signature = signature(block)
    if layer_signature is None:
        return None
    return path_for(folder, key(layer_signature, _tensors(inputs), switches)), layer_signature


def saved(place: tuple[Path, str]) -> PackagedRegion | None:
    """The package at ``place`` (:func:`locate`), opened; None if there is none (or it is damaged: then it is
    deleted, with a warning)."""
    path = place[0]
    if not path.is_file() or not step_artifact.trusted(path, stacklevel=4):
        return None
    return _open(path)


def package_at_exit(place: tuple[Path, str], block: nn.Module, run, inputs: tuple) -> bool:
    """Export ``run(block, *inputs)`` now, and when this process exits have a detached child process, at low
    priority, compile and package it at ``place`` (:func:`locate`) for the next process. False (nothing done) when
    the package is there, another process is building it, or the layer cannot be exported or its folder written
    (with a warning).

    Not while this process decodes: on 2 cores a build beside decoding took both cores' worth of OpenMP barriers
    from it (128 int8 GPT-2 tokens took 30 s instead of about 1.5 s). A server packages when it stops.

    A build claims its package by creating ``building/<name>.pt2`` (the exported program, which the child reads and
    then deletes); a claim older than :data:`STALE_CLAIM_S` is taken over."""
    command = _export(place, block, run, inputs, stacklevel=4)
    if command is not None:
        atexit.register(_start, *command)
    return command is not None


_AT_EXIT: dict[Path, tuple] = {}  # package path -> what package_when_exiting exports as this process exits


def package_when_exiting(place: tuple[Path, str], block: nn.Module, run, inputs: tuple) -> None:
    """As :func:`package_at_exit`, with the export too left to this process's exit: a process that decodes eagerly
    while nothing is cached (``compile="cached"``) pays no export (about 3 s on GPT-2's int8 layer, 2 cores) before
    its tokens. Only the shapes of ``inputs`` are kept (as meta tensors: not a layer's KV buffers until exit), and the
    export runs on zeros of them, in the grad and inference modes of this call (part of the package's key).
    :func:`cancel` takes it back."""
    shapes = tree_map_only(torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                       device="meta"), inputs)
    _AT_EXIT.setdefault(place[0], (place, block, run, shapes, torch.is_grad_enabled(),
                                   torch.is_inference_mode_enabled()))
    atexit.unregister(_export_when_exiting)  # registered once
    atexit.register(_export_when_exiting)


def cancel(place: tuple[Path, str]) -> None:
    """Take back :func:`package_when_exiting` of ``place`` (a later layer does not fit the package)."""
    _AT_EXIT.pop(place[0], None)


def _export_when_exiting() -> None:
    for place, block, run, shapes, grad, inference in list(_AT_EXIT.values()):
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            inputs = tree_map_only(torch.Tensor, lambda m: torch.empty_strided(m.shape, m.stride(),
                                                                               dtype=m.dtype).zero_(), shapes)
            command = _export(place, block, run, inputs, stacklevel=2)
        if command is not None:
            _start(*command)
    _AT_EXIT.clear()


def _export(place: tuple[Path, str], block: nn.Module, run, inputs: tuple, stacklevel: int
            ) -> tuple[list[str], dict, Path] | None:
    """Claim ``place``'s package and export the layer to the claim; the child's command, environment and claim, or
    None (see :func:`package_at_exit`)."""
    path = place[0]
    if path.exists():
        return None
    program_path = path.parent / "building" / path.name
    try:
        program_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            if time.time() - program_path.stat().st_mtime > STALE_CLAIM_S:
                program_path.unlink(missing_ok=True)
        os.close(os.open(program_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return None
    except OSError as exc:
        warnings.warn(f"compile=True: cannot write {program_path.parent} to package the step's layer ({exc})",
                      stacklevel=stacklevel)
        return None
    try:
        with torch.no_grad():
            program = torch.export.export(_Layer(block, run), (weights(block), *inputs), strict=False)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        atomic_write_bytes(program_path, buffer.getvalue())
    except Exception as exc:
        program_path.unlink(missing_ok=True)
        warnings.warn(f"compile=True: could not export the step's layer for packaging ({type(exc).__name__}: {exc})",
                      stacklevel=stacklevel)
        return None
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding lmforge, for the child
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(path.parents[1]),
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", __name__, str(program_path), str(path), str(torch.get_num_threads())]
    return command, env, program_path


def _start(command: list[str], env: dict, program_path: Path) -> None:
    quiet = subprocess.DEVNULL
    try:
        subprocess.Popen(command, env=env, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
    except OSError:
        program_path.unlink(missing_ok=True)  # the next process claims it again


def _package(program, path: Path) -> None:
    """Compile an exported layer with AOTInductor and write its package to ``path`` (atomically)."""
    from torch._inductor import aoti_compile_and_package  # here: importing inductor takes a second or more

    buffer = io.BytesIO()
    aoti_compile_and_package(program, package_path=buffer, inductor_configs=BUILD_OPTIONS)
    atomic_write_bytes(path, buffer.getvalue())


def _child(program_path: str, path: str, threads: str) -> None:
    """The build :func:`package_at_exit` starts: package the exported program, then delete it."""
    os.nice(10)  # the user's decoding goes first
    torch.set_num_threads(int(threads))  # inductor builds its loops for this many threads
    try:
        from lmforge.nn import gemv

        gemv.available()  # registers lmforge's operators, which the program calls
        if step_artifact.trusted(Path(program_path)):  # written by this user, in a folder only they can write
            _package(torch.export.load(program_path), Path(path))
    finally:
        Path(program_path).unlink(missing_ok=True)


if __name__ == "__main__":
    _child(*sys.argv[1:])
