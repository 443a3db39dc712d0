"""A compiled decode step: the one-token decoder forward as one ``torch.compile`` graph over a static KV cache.

``GenerationConfig(compile=True)`` (``model.generate(..., compile=True)``, ``lmforge generate --compile``)
runs the prompt eagerly, then every following token through one compiled graph:

    prompt (eager)  ids (N, T0) -> model, KVCache(capacity=C) -> logits (N, V) of token 1
    token t         ids (N, 1), slot (1,) -> [compiled: embed, layers over StaticKVCache (N, H_kv, C, hd),
                                              head] -> logits (N, V) of token t+1

Shapes never change between steps: the KV buffers hold ``C`` positions (prompt + new tokens rounded
up to a multiple of :data:`CAPACITY_BLOCK`), the write slot is a tensor, and attention spans all ``C``
keys with a mask of the valid ones (real prompt tokens, and positions up to the current one). So one
graph serves every step, and every later call with the same batch size and rounded capacity.

Where the time goes: a decode step multiplies one or a few rows by every weight, so it is bound by
streaming the weights from memory (the tiny GPT: 55 MB of fp32 per token). On a CPU the graph is built
for that (see :data:`CPU_OPTIONS`): the weights are compiled in as constants (inductor's freezing),
pre-packed for inductor's C++ GEMM template, which streams them near the read bandwidth (MKL's kernels
reach a smaller share of it); q/k/v are one GEMM; attention is written out as plain ops inductor fuses
(SDPA's flash kernel costs more than the math for one query row); and the ~60 kernels of a step run with
no per-op dispatch. ``benchmarks/generate.py`` measures the compiled path against the eager one and HF ``generate``
(docs/lab/performance.md).

Regional compilation. A step whose matmuls are opaque ops (:func:`opaque_matmuls`: int8, and bf16 where lmforge's
kernel takes the rows) is compiled unfrozen, with the weights as graph inputs, which those calls do not slow. Its
layers can then share one compiled graph: with ``compile="cached"``, such a step on a CPU compiles one layer
(:class:`_Region`) and runs it for every layer, with the embeddings, mask and head eager around it:

    token t         ids, slot -> embed (eager) -> [compiled layer] x L over each layer's (N, H_kv, C, hd)
                                 -> norm, head (eager) -> logits (N, V)

That is one layer's trace, lowering and kernels instead of L layers', so it starts sooner, and it can be packaged
for new processes (below). Where the step's products are decoding's one or two rows (:data:`WHOLE_MAX_ROWS`), it
runs slower than the whole step: each layer's call from Python into the compiled code costs about 0.1 ms, a dozen
times a token on GPT-2, against a layer's products of 0.5-1 ms (GPT-2 shape, batch 1, 2 cores, one run side by
side, medians of 5: int8 107 against 130 tokens/s, bf16 64 against 71). So ``compile=True``, for a process that
lives long enough to gain from the compile, compiles such a step whole (a regional step made by an earlier
``"cached"`` call too), and ``compile="cached"`` compiles by region. With more rows the products outweigh the calls:
at batch 8 (int8, fbgemm's GEMM) the whole step ran no faster in one process (283-299 against 285-289 tokens/s)
and took 29 s to compile against 12, so such steps compile by region either way. A layer the compiled one does not
fit (another class, or a constant of its own, like GPT-2's per-layer attention scale) makes the step compile whole.

The compiled steps are kept per model (weakly: they go with it) and per (batch size, capacity, dtype,
device), at most :data:`MAX_STEPS_PER_MODEL` of them (least recently used dropped). Each is a fresh
code object to ``torch.compile``, so each compiles once (``dynamic=False``) and its guards never grow.
The first call for a shape pays the compile (10-40 s on a 2-core CPU); later ones only run it. Costs:
each kept step holds its own packed copies of the weights (the tiny GPT, 55 MB of weights: ~130 MB
more resident memory per step), and a step whose weights were written in place or replaced since it
was compiled is compiled again (it would otherwise run the old, frozen values).

Persistent cache. The first call of a step compiles inside :func:`compile_cache_dir`, where inductor keeps its
on-disk caches: the generated C++ kernels and their built libraries (keyed by a hash of their source), and FX graphs
where inductor can cache them. It bypasses graphs holding frozen, mkldnn-packed weights, so for an fp32 or bf16
model a new process traces, lowers and autotunes again and only reuses the built libraries (the C++ compiler's
share). An unfrozen CPU step (its one compiled layer, or the whole step) is precompiled and saved whole beside
inductor's caches (:mod:`lmforge.generation.step_artifact`): a new process loads it in a few seconds instead of
tracing it again. A regional step's layer is also packaged by AOTInductor, in a child process started as this one
exits (:mod:`lmforge.generation.packaged_region`), which later processes open without importing Dynamo or inductor,
most of what a warm start cost before. ``compile="cached"`` does not wait for a layer that is in neither form: the
process decodes that layer eagerly (GPT-2 int8, 2 cores: its second token comes at once, not after a compile of
15-25 s; docs/lab/performance.md) and exports it for packaging as it exits; a process that lives long enough to gain
from the compile passes ``True``, for the whole step. Nothing stale is used: the folder is named for the torch
version, CPU capability and machine, artifacts are keyed by their source, a saved step or package by the model's
structure, the step's shapes and the traced sources, and weights are bound from the live model, never read from the
cache. A damaged artifact does not crash decoding: a saved step that fails to load is deleted and compiled again,
inductor's autotuner skips a candidate kernel that fails to load, and a compile that still fails empties the folder
and compiles once more from scratch, with a warning.
``LMFORGE_COMPILE_CACHE`` names another folder, or ``off`` for inductor's default (a per-user folder in the
system's temporary directory; no step is saved then).

Supported: decoders whose positions go through ``position_ids`` (learned, sinusoidal, RoPE, none), with
greedy search, sampling (all logits processors, EOS, stop strings, several samples per prompt) and
beam search; batches of any size, padded prompts included; streaming. Not supported (a ``ValueError``
says so): encoder-decoders, relative position biases (ALiBi, T5, Shaw: they would place the query at the
last slot of the static cache), and ``use_cache=False``. Tokens equal the eager path's up to fp32
rounding (the compiled kernels sum in another order), which can decide only a near-tied argmax.

Example (a sketch: compiling takes most of a minute on two CPU cores; ``tests/test_generation_compiled.py`` runs it)::

    import torch, lmforge
    model = lmforge.build_model("gpt-tiny", n_layers=2).eval()
    ids = torch.tensor([[5, 6, 7]])
    out = model.generate(ids, max_new_tokens=8, compile=True)
    out.tolist() == model.generate(ids, max_new_tokens=8).tolist()  # True
    cached_steps(model)                                              # [(1, 64, torch.float32, 'cpu')]
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
import types
import warnings
import weakref
from collections import OrderedDict
from pathlib import Path

import torch

import lmforge.generation.packaged_region as packaged_region  # the modules, not the package (which imports this
import lmforge.generation.step_artifact as step_artifact  # one)
from lmforge.generation.stepper import Stepper
from lmforge.nn import gemv
from lmforge.nn.attention import AttentionContext
from lmforge.nn.static_kv_cache import StaticKVCache
from lmforge.nn.weight_only import has_layers, uses_fbgemm_int8
from lmforge.utils.machine import build_tag, user_cache_dir
from lmforge.errors import UserInputError

CAPACITY_BLOCK = 64  # capacities round up to this: at most one compile per 64 positions of prompt + output
MAX_STEPS_PER_MODEL = 4  # compiled (batch, capacity, ...) variants kept per model (each holds packed weights)
SUPPORTED_POSITIONS = ("learned", "sinusoidal", "rope", "none")
# Inductor settings of the step on a CPU: GEMMs by inductor's C++ template, whose pre-packed weights
# stream near the read bandwidth when they come from DRAM (faster than inductor's default packed MKL,
# and than F.linear, for the one-row GEMMs of a decode step; see benchmarks/generate.py). Only
# the template is tried ("CPP"): autotuning against ATen times each GEMM with its weight hot in cache,
# where MKL wins, so it picks the slower kernel for the real, streaming case (and compiles twice as long).
CPU_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}
# On CUDA, replay each decode step as a CUDA graph (inductor's cudagraph trees): one launch per token instead of one
# per kernel, which is what a small model's latency is made of there. A graph replays on fixed addresses, so each
# compiled step owns its KV buffers (:meth:`_CompiledStep.adopt`): every generation of that shape decodes in the
# same memory, which the graph writes in place.
CUDA_GRAPHS = True
# compile=True compiles an unfrozen CPU step of up to this many rows whole, and one of more by region (module docstring)
WHOLE_MAX_ROWS = gemv.MAX_ROWS
# Package that layer with AOTInductor (lmforge.generation.packaged_region), which a new process opens without Dynamo:
# "background" (a child process builds it once this process exits; building it before the first compiled token
# instead made a cold start 8-11 s longer on 2 cores) or "off"
PACKAGE_ENV = "LMFORGE_COMPILE_PACKAGE"
FREEZE = True  # compile the weights in as constants (see _CompiledStep), except for int8 models (below)

# model -> OrderedDict[(batch, capacity, dtype, device), compiled step]
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


CACHE_ENV = "LMFORGE_COMPILE_CACHE"  # a folder for the persistent compile cache, or "off"


def compile_cache_dir() -> Path | None:
    """The folder compiled steps are cached in across processes (None: ``LMFORGE_COMPILE_CACHE=off``).

    ``$LMFORGE_COMPILE_CACHE`` or ``~/.cache/lmforge/compile`` (``$XDG_CACHE_HOME`` honoured), then a subfolder
    named for what built artifacts depend on outside their own keys: torch version, CPU capability, machine.
    """
    value = os.environ.get(CACHE_ENV)
    if value == "off":
        return None
    return (Path(value) if value else user_cache_dir("compile")) / build_tag()


@contextlib.contextmanager
def _cache_in(folder: Path | None):
    if folder is None:
        yield
        return
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    folder.mkdir(parents=True, exist_ok=True)
    with temporary_cache_dir(str(folder)):
        yield


def check_supported(model) -> None:
    """Raise ValueError unless ``model`` can decode through the compiled step."""
    mc = model.config
    if mc.arch != "decoder":
        raise UserInputError(f"compile=True supports decoder models only; {mc.name!r} is {mc.arch} (use compile=False)")
    if mc.sliding_window is not None:
        raise UserInputError(f"compile=True does not support sliding-window attention ({mc.name!r} has "
                             f"sliding_window={mc.sliding_window}); use compile=False")
    if mc.position not in SUPPORTED_POSITIONS:
        raise UserInputError(
            f"compile=True supports position schemes {', '.join(SUPPORTED_POSITIONS)}; {mc.name!r} uses "
            f"{mc.position!r}, whose bias needs the query's position in the cache (use compile=False)"
        )
    if mc.attention in ("lightconv", "dynamicconv") or mc.block == "evolved":
        raise UserInputError(f"compile=True does not support convolution layers ({mc.name!r} has attention="
                             f"{mc.attention!r}, block={mc.block!r}: they cache their inputs); use compile=False")
    if mc.attention.startswith("synthesizer-"):  # C2: its logits are rows of a position-indexed table
        raise UserInputError(f"compile=True does not support synthesizer attention ({mc.name!r} has attention="
                             f"{mc.attention!r}: its weights need each query's position); use compile=False")


def capacity_for(length: int) -> int:
    """KV positions to reserve for ``length`` tokens: rounded up so nearby lengths share one compiled step."""
    return -(-length // CAPACITY_BLOCK) * CAPACITY_BLOCK


def _decode_step(model, ids, slot, positions, valid, keys, values, run_layer=None):
    """One token through ``model`` over a static cache (traced by torch.compile; see the module docstring).

    Args:
        ids: (N, 1) the newest tokens.
        slot: (1,) long, their cache slot (= column in the token buffer).
        positions: (N, C) position ids of every slot.
        valid: (N, C) bool, real tokens (prompt padding False; future slots True: ``slot`` cuts them).
        keys, values: per layer (N, H_kv, C, hd), written in place at ``slot``.
        run_layer: runs each layer instead of the stack (:class:`_Region`: the step itself is then not traced).

    Returns:
        logits (N, V) of the next token.
    """
    C = valid.shape[1]
    visible = valid & (torch.arange(C, device=valid.device) <= slot)  # (N, C): causal over the static slots
    out = model(
        ids,
        attention_mask=visible[:, None, :],  # (N, 1, C): a complete mask, used as is by the stack
        position_ids=positions.index_select(1, slot),  # (N, 1)
        past_key_values=StaticKVCache(keys, values, slot, run_layer=run_layer),
        use_cache=True,
    )
    return out.logits[:, -1]


def _layer_region(block, x, mask, rope, keys, values, slot):
    """One layer of the step over its own (N, H_kv, C, hd) buffers: the region :class:`_Region` compiles once and
    runs for every layer (the layers share their code, and their weights are inputs)."""
    ctx = AttentionContext(mask=mask, rope=rope, cache=StaticKVCache([keys], [values], slot))
    return block(x, ctx, None, layer=0)


def _fresh(fn=_decode_step):
    """``fn`` under a new code object: dynamo keeps compiled graphs (and its recompile limit)
    per code object, so each variant gets its own cache, one graph long, instead of sharing one."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__)


class _GuardsFailed(Exception):
    """A layer the compiled region does not fit (its guards fail): the step is compiled whole instead."""


def _weights(model) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


class _CompiledStep:
    """One compiled step: ``torch.compile`` of a fresh copy of :func:`_decode_step`, compiled at its first
    call. With :data:`FREEZE` the weights are compiled in as constants (inductor's freezing: pre-packed
    GEMM weights, q/k/v concatenated once), so the step remembers which tensors they were and their
    version counters: a weight written in place (fine-tuning, ``load_state_dict``) or replaced since
    makes it :meth:`stale`. A step whose matmuls are opaque kernel calls (:func:`opaque_matmuls`) is not frozen:
    there is nothing for freezing to pack, and its weights are graph inputs. On a CPU such a step compiles one
    layer and runs it for every layer (:class:`_Region`), and that layer is precompiled and saved whole
    (:mod:`lmforge.generation.step_artifact`), so a new process neither traces nor lowers it again.

    ``whole=False`` (``compile="cached"``): such a step compiles one layer for all (:class:`_Region`), which starts
    sooner; ``True``, the whole step up to :data:`WHOLE_MAX_ROWS` rows, which runs faster (module docstring)."""

    def __init__(self, model, device: torch.device, batch: int = 1, dtype: torch.dtype = torch.float32,
                 whole: bool = True):
        self.graphs = CUDA_GRAPHS and device.type == "cuda"
        self.buffers: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.freeze = FREEZE and not opaque_matmuls(model, device, batch, dtype)
        self.backend = _backend(device, self.graphs, self.freeze, aten=has_layers(model, "int4"))
        self.cpu = device.type == "cpu"
        # An unfrozen CPU step is compiled ahead (torch's precompile) and saved whole (lmforge.generation.step_artifact)
        self.savable = not self.freeze and self.cpu
        self.region: _Region | None = None  # one layer compiled for all, until a layer does not fit it
        self.rows = batch
        self.fn = self._fresh_fn(self.savable and not self.wants_whole(whole))
        self.versions = [(t, t._version) for t in _weights(model)]
        self.compiled = False
        self.precompiled = False  # self.fn is a precompiled step, whose guards this class checks itself ...
        self.check_guards = False  # ... at the first step of each generation

    def _fresh_fn(self, regional: bool):
        """A new ``torch.compile`` of :func:`_decode_step` (compiled at its first call); ``regional``: the eager step
        over a new :class:`_Region` (compiled at its first layer)."""
        if not regional:
            self.region = None
            return torch.compile(_fresh(), fullgraph=True, dynamic=False, backend=self.backend)
        self.region = _Region(self.backend)
        return functools.partial(_decode_step, run_layer=self.region)

    def wants_whole(self, whole: bool) -> bool:
        """Whether a call with ``whole`` (``compile=True``) is to run this step whole rather than by region."""
        return whole and self.rows <= WHOLE_MAX_ROWS

    def _whole(self) -> None:
        """Compile the step whole from now on: some layer does not fit the region compiled from the first, or a
        ``compile=True`` call wants the faster step."""
        self.fn = self._fresh_fn(regional=False)
        self.compiled = self.precompiled = False

    def stale(self, model) -> bool:
        if not self.freeze:
            return False
        weights = _weights(model)
        return len(weights) != len(self.versions) or any(
            w is not t or t._version != v for w, (t, v) in zip(weights, self.versions)
        )

    def adopt(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        """With CUDA graphs, the step's own cache buffers holding ``keys``/``values`` (copied in), else the same
        lists: a graph's inputs that it writes must sit at the addresses it was recorded with. So on CUDA one model
        decodes one compiled generation of a shape at a time (the server's slot batch keeps its own buffers)."""
        if not self.graphs:
            return keys, values
        if self.buffers is None:
            self.buffers = ([torch.empty_like(k) for k in keys], [torch.empty_like(v) for v in values])
        for mine, theirs in zip(self.buffers[0] + self.buffers[1], keys + values):
            mine.copy_(theirs)
        return self.buffers

    def __call__(self, *args):
        try:
            out = self._run(*args)
        except _GuardsFailed:  # rerunning the step rewrites the same keys and values at the slot
            self._whole()
            out = self._run(*args)
        # A CUDA graph's output lives in memory its next replay overwrites: hand out a copy (N x V, small).
        return out.clone() if self.graphs else out

    def _run(self, *args):
        if self.compiled and not self.check_guards:
            return self.fn(*args)
        if self.compiled:  # a saved step, at the first step of a generation: is it still this model's?
            self.check_guards = False
            if self.region is not None:
                self.region.checked.clear()  # each layer's guards are checked at its first call
                return self.fn(*args)
            if self.fn.guard_check(*args):
                return self.fn(*args)
            self._whole()
        if self.graphs:  # args: model, ids, slot, positions, valid, keys, values: the cache is this step's own
            for t in (*args[5], *args[6]):
                torch._dynamo.mark_static_address(t)
        folder = compile_cache_dir()
        saved = _artifact_path(folder, args) if self.savable and self.region is None else None

        def first_call():
            if self.region is not None:  # it compiles, or opens its package, at the first layer
                return self._first_call(args, saved)
            # Dynamo reads the freezing switch while tracing (it decides whether weights become graph
            # constants), from the global config; only this first call traces.
            import torch._inductor.config as inductor_config  # here: importing inductor takes a second or more

            with inductor_config.patch(freezing=self.freeze), _cache_in(folder):
                return self._first_call(args, saved)

        try:
            out = first_call()
        except _GuardsFailed:
            raise
        except Exception as exc:
            if folder is None or not folder.is_dir():
                raise _compile_failed(exc) from exc
            # Perhaps a damaged cached artifact: compile once more with the cache emptied.
            warnings.warn(f"compile=True: the compile cache {folder} gave an error ({type(exc).__name__}); "
                          "rebuilding it", stacklevel=2)
            shutil.rmtree(folder, ignore_errors=True)
            self.fn = self._fresh_fn(self.region is not None)
            try:
                out = first_call()
            except _GuardsFailed:
                raise
            except Exception as again:  # a compiler or toolchain failure: say which switch to turn off
                raise _compile_failed(again) from again
        self.compiled = True
        return out

    def _first_call(self, args, saved: Path | None):
        """Compile (or load the step saved at ``saved``) and run it once. A loaded step's guards are checked
        here; later calls skip them (:meth:`_run` checks them again at each generation's first step). A regional
        step runs eagerly, and its region compiles (or loads) at the first layer."""
        if saved is None:
            if self.region is None and self.cpu:  # a whole step compiles now
                _check_vec_isa_ahead()
            return self.fn(*args)
        fn = _precompiled(self.fn, args, saved)
        if fn is None:
            return self.fn(*args)
        self.fn, self.precompiled = fn, True
        return fn(*args)


class _Region:
    """The compiled code of one layer, run for every layer of a step (regional compilation).

    The layers of a stack are one class, with their weights as graph inputs (an unfrozen step), so one layer's
    trace serves all of them: one layer's graph to trace, lower and build kernels for instead of twelve, and a
    smaller file (GPT-2's int8 step: 345 KB against 2.66 MB saved whole). The embeddings, mask and head run
    eagerly around it, a few dozen ops per token. The region is precompiled (``aot_compile``), so a call runs the
    compiled code without Dynamo's per-call guard checks; they are checked here once per layer at the first step
    of every generation instead. A layer they reject (another class, or a constant of its own, like GPT-2's
    per-layer attention scale) raises :class:`_GuardsFailed`, and the step is compiled whole. Where the layer's
    AOTInductor package is in the cache (:mod:`lmforge.generation.packaged_region`), it runs instead, and each
    layer's signature stands in for the guards. A layer that is in neither form runs eagerly (unless packaging is
    off), and is packaged as this process exits, for the next one: ``compile="cached"`` does not wait for a compile."""

    def __init__(self, backend):
        self.backend = backend
        self.eager = False  # decoding eagerly, with the layer to be packaged at exit
        self.fn = None  # torch.compile of _layer_region, made when needed (creating it imports Dynamo)
        self.package: packaged_region.PackagedRegion | None = None  # the layer packaged by AOTInductor, if there is one
        self.weights: dict[int, list[torch.Tensor]] = {}  # layer -> its weights, as the package takes them
        self.compiled = False
        self.precompiled = False
        self.checked: set[int] = set()  # layers whose guards (or signature) passed in this generation
        self.place: tuple[Path, str] | None = None  # where its package is (packaged_region.locate), if it can have one
        self.to_package = False  # export the layer for packaging at its next call (compiled by Dynamo here)

    def __call__(self, block, x, ctx, i: int) -> torch.Tensor:
        cache = ctx.cache
        args = (block, x, ctx.mask, ctx.rope, cache.keys[i], cache.values[i], cache.index)
        if not self.compiled:
            self._compile(args)
        elif self.to_package and i == 0:  # at the second step, not before the first compiled token
            self.to_package = False
            packaged_region.package_at_exit(self.place, block, _layer_region, args[1:])
        if self.eager or self.package is not None:  # each layer's signature stands in for the guards
            if i not in self.checked:
                if packaged_region.signature(block) != self.place[1]:  # (the package's, if there is one)
                    if self.eager:
                        packaged_region.cancel(self.place)  # a package of layer 0 would not serve this model
                    raise _GuardsFailed(f"layer {i}")
                self.weights[i] = packaged_region.weights(block)
                self.checked.add(i)
            return _layer_region(*args) if self.eager else self.package(self.weights[i], args[1:])
        if i in self.checked or not self.precompiled:  # (Dynamo checks a plain compile's guards)
            return self.fn(*args)
        if not self.fn.guard_check(*args):
            raise _GuardsFailed(f"layer {i}")
        self.checked.add(i)
        return self.fn(*args)

    def _compile(self, args) -> None:
        """Open the layer's package (:mod:`lmforge.generation.packaged_region`). Without one, where the layer's
        precompiled code is saved (:mod:`lmforge.generation.step_artifact`) or :data:`PACKAGE_ENV` is ``off``, load
        or compile it with Dynamo, and have it packaged for later processes once this one exits (unless ``off``).
        With neither, the layer runs eagerly, and is exported and packaged as this process exits."""
        folder = compile_cache_dir()
        mode = package_mode() if folder is not None else "off"
        self.eager = False
        if mode != "off":
            self.place = packaged_region.locate(args[0], args[1:], folder, _switches())
            self.package = packaged_region.saved(self.place) if self.place is not None else None
        saved = _artifact_path(folder, args)
        if self.package is None and mode == "background" and self.place is not None and not saved.is_file():
            packaged_region.package_when_exiting(self.place, args[0], _layer_region, args[1:])
            self.eager = True
        elif self.package is None:
            self.fn = torch.compile(_fresh(_layer_region), fullgraph=True, dynamic=False, backend=self.backend)
            with _cache_in(folder):
                fn = _precompiled(self.fn, args, saved)
            self.fn, self.precompiled = fn or self.fn, fn is not None
            self.to_package = mode == "background" and self.place is not None
        self.compiled = True


def package_mode() -> str:
    """How a regional step's layer is packaged for new processes (:data:`PACKAGE_ENV`)."""
    mode = os.environ.get(PACKAGE_ENV, "background")
    if mode not in ("background", "off"):
        raise UserInputError(f"${PACKAGE_ENV}={mode!r}: use background or off")
    return mode


def _artifact_path(folder: Path | None, args) -> Path | None:
    """Where the precompiled function of these inputs is saved in the compile cache ``folder`` (None: no cache)."""
    return None if folder is None else step_artifact.path_for(folder, step_artifact.fingerprint(args, _switches()))


def _precompiled(fn, args, saved: Path | None):
    """``fn`` (a ``torch.compile``) precompiled for ``args``: loaded from ``saved`` when it is there and its guards
    hold, else compiled ahead and saved there. None, with a warning, when torch's precompile fails (it covers less
    than torch.compile): the caller compiles for this process only."""
    loaded = step_artifact.load(saved, globals()) if saved is not None else None
    if loaded is None or not loaded.guard_check(*args):
        _check_vec_isa_ahead()
        try:
            loaded = fn.aot_compile((args, {}))
        except Exception as exc:
            warnings.warn(f"compile=True: torch's precompile failed ({type(exc).__name__}: {exc}); the step is "
                          "compiled for this process only", stacklevel=5)
            return None
        if saved is not None:
            step_artifact.save(loaded, saved)
    loaded.disable_guard_check()
    return loaded


def opaque_matmuls(model, device: torch.device, batch: int, dtype: torch.dtype) -> bool:
    """Whether a step's matmuls run lmforge's own kernels, one opaque op each: an int8 model's integer matmuls
    (:mod:`lmforge.nn.weight_only`), or a bf16 model's rows on a CPU (:func:`lmforge.nn.linear.linear`, where the
    kernel builds: built here, before tracing, up to :func:`lmforge.nn.gemv.bf16_max_rows` rows). Never an int4
    model's, whatever its dtype: the step must freeze its weights, so that their packing is folded once."""
    if uses_fbgemm_int8(model, device):
        return True
    if has_layers(model, "int4"):  # (unfrozen, every token would repack every int4 weight)
        return False
    return device.type == "cpu" and dtype == torch.bfloat16 and gemv.available() and batch <= gemv.bf16_max_rows()


_VEC_ISA_CHECK: list[threading.Thread] = []  # inductor's check of the CPU's vector instructions, once started


def _check_vec_isa_ahead() -> None:
    """Start inductor's check of the CPU's vector instructions in a thread, once per process.

    The check builds a test program with the C++ compiler and loads it in a new Python process: seconds of a cold
    start (about 2.7 s on GPT-2's int8 step, 2 cores), spent waiting on those subprocesses. Started as a compile
    begins, it runs while Dynamo traces; the backend waits for it before inductor asks (:func:`_backend`)."""
    if _VEC_ISA_CHECK:
        return
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list  # here, not in the thread: one importer at a time

    def check():
        with contextlib.suppress(Exception):  # inductor asks again, and reports, at its own call
            valid_vec_isa_list()

    thread = threading.Thread(target=check, name="lmforge-vec-isa-check", daemon=True)
    _VEC_ISA_CHECK.append(thread)
    thread.start()


def _compile_failed(exc: Exception) -> RuntimeError:
    return RuntimeError(f"compile=True: torch.compile of the decode step failed ({type(exc).__name__}: {exc}); "
                        "generate with compile=False instead")


def _backend(device: torch.device, graphs: bool = False, frozen: bool = True, aten: bool = False):
    """Inductor, with :data:`CPU_OPTIONS` on a CPU when the weights are frozen (its GEMM template needs them
    constant), and CUDA graphs (:data:`CUDA_GRAPHS`) on a GPU. ``aten``: ATen's kernels are candidates too (an int4
    model's: inductor's int4 template needs AVX-512, and with no candidate left the compile fails).

    No decomposition table is passed: inductor cannot key its FX graph cache on one (it holds C++ functions), so a
    new process would lower and generate every kernel again. (SDPA's CPU kernel, slow for the step's one query
    row, is avoided in the model instead: :func:`lmforge.nn.attention.one_compiled_row`.)"""
    if device.type == "cpu":
        patches = dict(CPU_OPTIONS) if frozen else {}
        if frozen and aten:
            patches["max_autotune_gemm_backends"] += ",ATEN"
        # No size and stride assert per input and op output in the wrapper: a Python call each (27 per layer,
        # ~5% of an int8 step). Dynamo's guards check the inputs' sizes and strides already (for a region, each
        # layer's at the first step of each generation).
        patches["size_asserts"] = False
    else:
        patches = {"triton.cudagraphs": graphs}

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        for thread in _VEC_ISA_CHECK:  # (its result is cached: inductor then asks without waiting)
            thread.join()
        return compile_fx(gm, example_inputs, config_patches=patches)

    return backend


def compiled_step(model, batch: int, capacity: int, dtype: torch.dtype, device: torch.device,
                  whole: bool = True) -> _CompiledStep:
    """The compiled step for this model and shape, built on first use (the compile itself happens at its
    first call); a stale one (weights changed since it froze them) is replaced. ``whole=False``
    (``compile="cached"``): an unfrozen CPU step compiles by region, and a layer not in the compile cache runs
    eagerly instead of compiling, and is packaged as the process exits (:class:`_Region`). ``True``: a step of up to
    :data:`WHOLE_MAX_ROWS` rows is compiled whole, a regional one made earlier included."""
    steps = _STEPS.setdefault(model, OrderedDict())
    key = (batch, capacity, dtype, str(device))
    step = steps.get(key)
    if step is None or step.stale(model):
        step = steps[key] = _CompiledStep(model, torch.device(device), batch, dtype, whole)
        while len(steps) > MAX_STEPS_PER_MODEL:
            steps.popitem(last=False)
    elif step.region is not None and step.wants_whole(whole):
        step._whole()
    step.check_guards = step.compiled and (step.precompiled or step.region is not None)
    steps.move_to_end(key)
    return step


def _switches() -> dict:
    """What else a saved step depends on (:mod:`lmforge.generation.step_artifact`): the CPU kernels' switch and
    availability, the thread count (built into inductor's C++ loops) and the grad mode."""
    return {"gemv": [os.environ.get(gemv.ENV), gemv.available(), gemv.bf16_max_rows()],
            "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(),
            "inference": torch.is_inference_mode_enabled()}


def cached_steps(model) -> list[tuple]:
    """Keys (batch, capacity, dtype, device) of the compiled steps kept for ``model``, oldest first."""
    return list(_STEPS.get(model, {}))


class CompiledStepper(Stepper):
    """A :class:`Stepper` (same interface) whose token steps after the prompt run the compiled graph.

    Args as :class:`Stepper`, always with a cache; the model must pass :func:`check_supported`.
    """

    def __init__(self, model, input_ids, attention_mask, max_new_tokens: int, start_id: int, pad_id: int,
                 whole: bool = True):
        check_supported(model)
        self.whole = whole  # see compiled_step
        super().__init__(model, input_ids, attention_mask, max_new_tokens, start_id, pad_id, use_cache=True)
        self.capacity = capacity_for(self.tokens.shape[1])
        self.cache.capacity = self.capacity  # the prefill allocates buffers of the final size
        self.static: StaticKVCache | None = None

    def prefill(self) -> torch.Tensor:
        logits = self._forward(0)  # eager: the prompt's shape varies, and runs once
        N, L_max = self.tokens.shape
        C, device = self.capacity, self.tokens.device
        self._slots = torch.arange(C, device=device)  # slot i is the view _slots[i:i+1]: no per-step tensor
        self._valid = torch.zeros(N, C, dtype=torch.bool, device=device)
        self._valid[:, :L_max] = self.valid
        # (N, C) even when the rows share positions: one input shape whether or not the prompts were padded
        self._positions = torch.zeros(N, C, dtype=torch.long, device=device)
        self._positions[:, :L_max] = self.positions
        self.static = StaticKVCache.from_cache(self.cache, C, self._slots[:1])
        self.cache = None  # the static buffers hold everything from here on
        self._step = None  # looked up at the first step: beam search widens the batch after the prompt
        return logits

    def step(self, tokens: torch.Tensor, forward: bool = True) -> torch.Tensor | None:
        i = self.length
        self.tokens[:, i] = tokens
        self.length += 1
        if not forward:
            return None
        s = self.static
        if self._step is None:
            self._step = compiled_step(self.model, self.batch_size, self.capacity, s.keys[0].dtype, s.keys[0].device,
                                       self.whole)
            s.keys, s.values = self._step.adopt(s.keys, s.values)
        ids = tokens.reshape(-1, 1).contiguous()  # (N, 1), strides fixed: a column view's would follow L_max
        return self._step(self.model, ids, self._slots[i:i + 1], self._positions,
                          self._valid, s.keys, s.values)

    def select(self, index: torch.Tensor, same_source: bool = False) -> None:
        super().select(index, same_source)  # tokens, prompt mask and positions (no eager cache after the prompt)
        if self.static is None:  # before the prompt ran: the eager bookkeeping is all there is
            return
        self.static.reorder(index)
        if index.shape[0] != self._valid.shape[0]:
            self._step = None  # another batch size: another compiled step
        if not same_source:
            self._valid = self._valid.index_select(0, index)
            self._positions = self._positions.index_select(0, index)
