"""The persistent compile cache of compiled decoding: reused by a new process, never stale, rebuilt when damaged.

Each compile runs in its own process, as a user's would: a library that a process has loaded cannot be
damaged under it (the test would crash instead of the loader)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.generation import compiled, packaged_region, step_artifact
from lmforge.models.quantize import quantize_model
from lmforge.nn.weight_only import uses_fbgemm_int8
from lmforge.utils.machine import build_tag

SRC = str(Path(compiled.__file__).resolve().parents[2])
# One process: a tiny GPT with seed S (int8 weights when asked), its compiled and eager greedy tokens as JSON
# on the last line.
SCRIPT = """
import json, sys, torch, lmforge
from lmforge.models.quantize import quantize_model
torch.manual_seed(int(sys.argv[1]))
model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100).eval()
if sys.argv[2] == "int8":
    quantize_model(model, "int8")
ids = torch.tensor([[5, 6, 7]])
with torch.no_grad():
    out = [model.generate(ids, max_new_tokens=4, compile=c).tolist() for c in ({"cached": "cached"}.get(sys.argv[3],
                                                                                                       True), False)]
print(json.dumps(out + ["torch._dynamo" in sys.modules]))
"""
DYNAMO = {}  # seed -> whether that process imported Dynamo (the last call's)


def decode_in_a_new_process(seed: int, cache: Path, precision: str = "fp32", package: str = "off",
                            compile: str = "True") -> tuple[list, list, str]:
    env = {**os.environ, compiled.CACHE_ENV: str(cache), compiled.PACKAGE_ENV: package, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(seed), precision, compile], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled_tokens, eager_tokens, DYNAMO[seed] = json.loads(done.stdout.strip().splitlines()[-1])
    return compiled_tokens, eager_tokens, done.stderr


def libraries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.so"))


def test_cache_folder_is_keyed_by_torch_and_cpu_and_can_be_off(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path))
    folder = compiled.compile_cache_dir()
    assert folder.parent == tmp_path and torch.__version__.split("+")[0] in folder.name
    assert torch.backends.cpu.get_cpu_capability() in folder.name
    monkeypatch.setenv(compiled.CACHE_ENV, "off")
    assert compiled.compile_cache_dir() is None


def test_new_processes_reuse_the_cache_never_a_stale_result_and_rebuild_a_damaged_one(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path))
    folder = compiled.compile_cache_dir()
    got, eager_a, _ = decode_in_a_new_process(0, tmp_path)
    assert got == eager_a
    built = libraries(folder)
    assert built, "the first compile left no built kernels in the cache folder"

    # Same shapes, other weights, a new process on the same cache: the result is this model's own (weights are
    # bound from the live model, never read from the cache).
    got, eager_b, _ = decode_in_a_new_process(1, tmp_path)
    assert got == eager_b != eager_a

    # Damage every built library: a new process still decodes right instead of crashing.
    for lib in built:
        lib.write_bytes(b"not a shared library")
    got, eager, err = decode_in_a_new_process(0, tmp_path)
    assert got == eager == eager_a, err


def test_a_compile_failing_on_the_cache_empties_it_and_compiles_again(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path))
    folder = compiled.compile_cache_dir()
    folder.mkdir(parents=True)
    (folder / "damaged.so").write_bytes(b"junk")
    model = torch.nn.Linear(2, 2)
    step = compiled._CompiledStep(model, torch.device("cpu"))

    def damaged(*args):
        raise OSError("damaged.so: invalid ELF header")

    step.fn = damaged
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: (lambda *args: ("compiled again", args)))
    with pytest.warns(UserWarning, match="gave an error \\(OSError\\); rebuilding it"):
        assert step(1, 2) == ("compiled again", (1, 2))
    assert not (folder / "damaged.so").exists() and step.compiled


def test_a_failure_without_a_cache_says_to_turn_compile_off(monkeypatch):
    monkeypatch.setenv(compiled.CACHE_ENV, "off")
    step = compiled._CompiledStep(torch.nn.Linear(2, 2), torch.device("cpu"))

    def broken(*args):
        raise OSError("no compiler")

    step.fn = broken
    with pytest.raises(RuntimeError, match="generate with compile=False instead"):
        step()


def test_an_int8_step_is_saved_whole_reused_by_a_new_process_and_rebuilt_when_damaged(tmp_path):
    """An int8 model's step (unfrozen: its matmuls are opaque ops) is saved whole by torch's precompile
    (lmforge.generation.step_artifact): a new process loads it instead of tracing, so it does not write it again.
    A file whose body is damaged is deleted, with a warning, and compiled and saved again."""
    folder = tmp_path / build_tag()
    got, eager_a, _ = decode_in_a_new_process(0, tmp_path, "int8")
    assert got == eager_a
    saved = sorted((folder / "steps").glob("*" + step_artifact.SUFFIX))
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    quantize_model(model, "int8")
    if not uses_fbgemm_int8(model, torch.device("cpu")):  # no opaque int8 op here: the step is frozen, not saved
        assert saved == []
        return
    assert len(saved) == 1
    path, inode = saved[0], saved[0].stat().st_ino

    got, eager_b, _ = decode_in_a_new_process(1, tmp_path, "int8")  # other weights: read from the live model
    assert got == eager_b != eager_a
    assert path.stat().st_ino == inode, "a new process compiled the step again instead of loading it"

    # (A header naming changed sources is never unpickled: test_step_artifact.py; it takes the path of a missing file.)
    head = path.read_bytes().partition(b"\n")[0]
    assert "lmforge.generation.compiled" in json.loads(head)["sources"]
    path.write_bytes(head + b"\nnot a pickle")
    got, eager, err = decode_in_a_new_process(0, tmp_path, "int8")
    assert got == eager == eager_a, err
    assert "could not be loaded" in err and path.read_bytes().partition(b"\n")[2] != b"not a pickle"


def test_an_int8_layer_is_packaged_after_its_first_process_and_a_new_process_runs_it_without_dynamo(tmp_path):
    """A cold process with ``compile="cached"`` decodes the int8 step's layer eagerly, without importing Dynamo, and
    as it exits exports the layer and has a child process package it (lmforge.generation.packaged_region); the next
    ``"cached"`` process opens the package and decodes without importing Dynamo, with its own weights. (A damaged
    package is deleted and built again: test_packaged_region.py. A layer compiled with Dynamo is exported at its second
    step: the regional test below.)"""
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    quantize_model(model, "int8")
    regions = tmp_path / build_tag() / "regions"
    got, eager_a, _ = decode_in_a_new_process(0, tmp_path, "int8", package="background", compile="cached")
    if not uses_fbgemm_int8(model, torch.device("cpu")):  # no opaque int8 op: a frozen step, compiled whole
        assert got == eager_a and DYNAMO[0]
        assert not regions.exists()  # and never packaged
        return
    assert got == eager_a and not DYNAMO[0]  # nothing was compiled
    deadline = time.monotonic() + 600
    while not list(regions.glob("*.pt2")) or list(regions.glob("building/*")):  # the child deletes its program
        assert time.monotonic() < deadline, "the packaging did not finish"
        time.sleep(0.5)
    (path,) = regions.glob("*.pt2")

    got, eager_b, _ = decode_in_a_new_process(1, tmp_path, "int8", package="background", compile="cached")
    assert got == eager_b != eager_a and not DYNAMO[1]  # the package ran, on this model's weights
    assert list(regions.glob("*.pt2")) == [path]  # and nothing was built again


def test_a_cached_int8_step_compiles_one_layer_for_all_a_compile_true_one_the_whole_step(monkeypatch, tmp_path):
    """Regional compilation (compiled._Region): with ``compile="cached"`` an unfrozen step runs one layer's code for
    every layer, with each layer's guards checked once per generation. With nothing cached the layer runs eagerly and
    is to be packaged at exit; a ``compile=True`` call then compiles the step whole (faster per token), and the
    packaging stays. GPT-2's per-layer attention scale is a constant the region rejects at the second layer: that step
    takes the packaging back and is compiled whole at once. Where the layer's precompiled code is saved (here by a
    process with packaging off), a cached step loads it, and has the layer packaged after its second step. A step of
    more rows than decoding's one or two compiles by region with ``compile=True`` too. All decode as eager does."""
    calls = []  # (what, package name): no package is built in this process
    for what in ("package_when_exiting", "package_at_exit", "cancel"):
        monkeypatch.setattr(packaged_region, what, lambda place, *args, what=what: calls.append((what, place[0].name)))
    ids = torch.tensor([[5, 6, 7]])

    def generate(model, compile):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=6, compile=compile).tolist()

    for by_layer in (False, True):
        monkeypatch.setenv(compiled.PACKAGE_ENV, "background")
        torch.manual_seed(0)
        model = lmforge.build_model("gpt-tiny", n_layers=3, d_model=32, n_heads=2, d_ff=64, vocab_size=100,
                                    attn_scale_by_layer=by_layer).eval()
        quantize_model(model, "int8")
        monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path / str(by_layer)))  # (their first layers are alike)
        calls.clear()
        eager = generate(model, False)
        assert generate(model, "cached") == eager
        (step,) = compiled._STEPS[model].values()
        regional = step.region is not None and step.region.eager and step.region.checked == {0, 1, 2}
        assert generate(model, True) == eager
        assert generate(model, True) == eager  # guards checked again
        if not uses_fbgemm_int8(model, torch.device("cpu")):  # no opaque int8 op here: a frozen step, compiled whole
            assert step.region is None and step.freeze and not calls
            continue
        name = calls[0][1]
        assert step.region is None and step.precompiled  # the whole step
        if by_layer:  # the second layer's scale failed the region's guards
            assert calls == [("package_when_exiting", name), ("cancel", name)]
            continue
        assert regional and calls == [("package_when_exiting", name)]

        del compiled._STEPS[model]  # a new process's steps, with the layer's code saved but not packaged:
        monkeypatch.setenv(compiled.PACKAGE_ENV, "off")
        assert generate(model, "cached") == eager  # compiled by Dynamo and saved
        (step,) = compiled._STEPS[model].values()
        assert step.region.precompiled and step.region.checked == {0, 1, 2} and not step.region.eager
        del compiled._STEPS[model]
        monkeypatch.setenv(compiled.PACKAGE_ENV, "background")
        assert generate(model, "cached") == eager  # loaded, and packaged after its second step
        (step,) = compiled._STEPS[model].values()
        assert step.region.precompiled and not step.region.eager and not step.precompiled
        assert calls == [("package_when_exiting", name), ("package_at_exit", name)]
        with torch.no_grad():  # more rows than compiled.WHOLE_MAX_ROWS: by region with compile=True too
            rows = ids.repeat(compiled.WHOLE_MAX_ROWS + 1, 1)
            assert model.generate(rows, max_new_tokens=6, compile=True).tolist() == model.generate(
                rows, max_new_tokens=6).tolist()
        assert next(reversed(compiled._STEPS[model].values())).region is not None


def test_a_saved_step_is_checked_at_each_generation_and_compiled_again_when_its_guards_fail(monkeypatch):
    monkeypatch.setenv(compiled.CACHE_ENV, "off")
    model = torch.nn.Linear(2, 2)
    step = compiled._CompiledStep(model, torch.device("cpu"))

    class Saved:  # an aot_compile result: guards, then the graph
        guards_hold = True

        def guard_check(self, *args):
            return self.guards_hold

        def __call__(self, *args):
            return "saved step"

    step.fn, step.compiled, step.precompiled = Saved(), True, True
    compiled._STEPS[model] = OrderedDict({(1, 64, torch.float32, "cpu"): step})
    assert compiled.compiled_step(model, 1, 64, torch.float32, torch.device("cpu")) is step and step.check_guards
    assert step(1) == "saved step" and not step.check_guards
    step.fn.guards_hold = False
    assert step(1) == "saved step"  # within a generation the guards are not checked again
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: (lambda *args: ("compiled again", args)))
    compiled.compiled_step(model, 1, 64, torch.float32, torch.device("cpu"))
    assert step(1) == ("compiled again", (1,)) and step.compiled and not step.precompiled
    compiled.compiled_step(model, 1, 64, torch.float32, torch.device("cpu"))
    assert not step.check_guards  # a step compiled for this process only has Dynamo's own guards
