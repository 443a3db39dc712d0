"""A compiled decode step saved whole, so that a new process runs it without tracing it again.

Inductor's own caches (:func:`lmforge.generation.compiled.compile_cache_dir`) spare a new process the lowering and
the C++ build, but not Dynamo's trace of the step. torch's precompile (``torch.compile(fn).aot_compile``) captures
the whole result instead: the step's bytecode, its guards and the compiled graph. One file per compiled function (a
regional step's one compiled layer, :class:`lmforge.generation.compiled._Region`, or a whole step) is kept beside
inductor's caches, and a new process loads it instead of compiling. On the GPT-2 shape with int8 weights (2 cores,
`lmforge generate --compile`), saving the whole step took a warm start to its first compiled token in 10.1 s against
12.8 s (medians of 6, alternated in one sitting).

Only steps that are not frozen are saved this way (:func:`lmforge.generation.compiled.opaque_matmuls`: int8, and
bf16 where lmforge's kernel takes the rows). Their weights are inputs, read from the live model at every call, so
an artifact never holds or replays weights. A frozen step would carry its weights in the file.

Never stale:
- The file is named for everything the graph depends on outside its traced code: the model's configuration,
  every parameter's and buffer's name, shape and type, the module classes, the step's input shapes, and the
  switches the step depends on (``LMFORGE_GEMV`` and the CPU kernels' availability, the thread count, the grad
  mode). The folder is already named for torch's version and the CPU.
- A header records, for each Python module the trace went through, a hash of its source file and of its
  module-level names (so a function replaced at run time counts as a change). These are checked before
  anything is unpickled; any difference means the step is compiled again and the file replaced.
- Dynamo's saved guards are checked at the first step of every generation. A failure compiles again.

Safety: the file's body is a pickle (torch's format for it, as for inductor's own cache entries). It is read only
from a folder this user owns that no one else can write to, from a file this user wrote. A file that fails to
load is deleted, with a warning, and the step is compiled again.

Example:
    >>> import torch
    >>> fingerprint([torch.ones(2, 3)]) == fingerprint([torch.zeros(2, 3)])   # shapes count, values do not
    True
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
import types
import warnings
from pathlib import Path

import torch

from lmforge.utils.io import atomic_write_bytes

FORMAT = 1  # of the header and file name: a change makes every older file unused
SUFFIX = ".step"


def _describe(value) -> object:
    """A JSON-able description of a step input or model tensor: what the compiled graph specialises on."""
    if isinstance(value, torch.Tensor):
        return [type(value).__qualname__, str(value.dtype), list(value.shape), list(value.stride()), str(value.device)]
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, torch.nn.Module):
        return {
            "config": repr(getattr(value, "config", None)),
            "modules": [[n, type(m).__module__ + "." + type(m).__qualname__] for n, m in value.named_modules()],
            "tensors": [[n, _describe(t)] for n, t in (*value.named_parameters(), *value.named_buffers())],
        }
    return [type(value).__qualname__, repr(value)]


def fingerprint(args, switches: dict | None = None) -> str:
    """A hash of the step's inputs (the model's structure and tensor shapes, not their values) and ``switches``."""
    text = json.dumps({"format": FORMAT, "args": _describe(list(args)), "switches": switches or {}}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _module_state(name: str) -> str | None:
    """A hash of module ``name``'s source file and of its module-level bindings (callables by their qualified
    name, plain constants by value); None when the module has no source file (then nothing can tell a change)."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # e.g. __main__ run from standard input: no spec to find
            spec = None
        origin = spec.origin if spec is not None else None
    if not origin or not os.path.isfile(origin):
        return None
    digest = hashlib.sha256(Path(origin).read_bytes())
    for key, value in sorted(vars(module).items()) if module is not None else ():
        if key.startswith("__"):  # the module's own dunders, and the names Dynamo adds while it traces
            continue
        if isinstance(value, (bool, int, float, str, type(None))):
            described = repr(value)
        elif callable(value) and not isinstance(value, types.ModuleType):
            described = f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"
        else:
            described = type(value).__qualname__
        digest.update(f"\0{key}={described}".encode())
    return digest.hexdigest()


def _sources(fn) -> dict[str, str | None]:
    return {s.module: _module_state(s.module) for s in fn.source_info().inlined_sources}


def trusted(path: Path, stacklevel: int = 3) -> bool:
    """:func:`_trusted`, with a warning when it is not."""
    if _trusted(path):
        return True
    warnings.warn(f"compile=True: not loading {path}: another user can write it or its folder", stacklevel=stacklevel)
    return False


def _trusted(path: Path) -> bool:
    """The file and its folder belong to this user and no one else can write them."""
    if not hasattr(os, "getuid"):
        return False
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def path_for(folder: Path, key: str) -> Path:
    return folder / "steps" / f"{key}{SUFFIX}"


def save(fn, path: Path) -> None:
    """Write ``fn`` (an ``aot_compile`` result) to ``path``: a JSON header line, then torch's serialised form."""
    try:
        sources = _sources(fn)
        if None in sources.values():  # traced through code without a source file: a change could not be told
            return
        header = json.dumps({"format": FORMAT, "torch": torch.__version__, "sources": sources}, sort_keys=True)
        body = type(fn).serialize(fn).serialized_data
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(path, header.encode() + b"\n" + body)
    except Exception as exc:  # decoding goes on; the next process compiles again
        warnings.warn(f"compile=True: could not save the compiled step to {path} ({type(exc).__name__}: {exc})",
                      stacklevel=4)


def load(path: Path, f_globals: dict):
    """The step saved at ``path``, or None: absent, written by another user, or traced through source that has
    changed since. A damaged file is deleted, with a warning."""
    if not path.is_file():
        return None
    try:
        if not trusted(path, stacklevel=4):
            return None
        data = path.read_bytes()
        head, _, body = data.partition(b"\n")
        header = json.loads(head)
        if header.get("format") != FORMAT or header.get("torch") != torch.__version__:
            return None
        if any(state is None or _module_state(name) != state for name, state in header["sources"].items()):
            return None  # traced code changed: compile again (the new file replaces this one)
        from torch._dynamo.aot_compile import AOTCompiledFunction

        return AOTCompiledFunction.deserialize(body, f_globals=f_globals)
    except Exception as exc:
        warnings.warn(f"compile=True: the saved step {path} could not be loaded ({type(exc).__name__}); "
                      "compiling it again", stacklevel=3)
        path.unlink(missing_ok=True)
        return None
