"""The persistent compile cache of compiled decoding: reused by a new process, never stale, rebuilt when damaged.

Each compile runs in its own process, as a user's would: a library that a process has loaded cannot be
damaged under it (the test would crash instead of the loader)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmforge.generation import compiled

SRC = str(Path(compiled.__file__).resolve().parents[2])
# One process: a tiny GPT with seed S, its compiled and eager greedy tokens as JSON on the last line.
SCRIPT = """
import json, sys, torch, lmforge
torch.manual_seed(int(sys.argv[1]))
model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100).eval()
ids = torch.tensor([[5, 6, 7]])
out = [model.generate(ids, max_new_tokens=4, compile=c).tolist() for c in (True, False)]
print(json.dumps(out))
"""


def decode_in_a_new_process(seed: int, cache: Path) -> tuple[list, list, str]:
    env = {**os.environ, compiled.CACHE_ENV: str(cache), "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(seed)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled_tokens, eager_tokens = json.loads(done.stdout.strip().splitlines()[-1])
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
