"""What names a saved decode step and what makes one unusable (lmforge.generation.step_artifact); the round trip
through a new process is in test_compile_cache.py."""

from __future__ import annotations

import json
import os
import sys
import types
import warnings

import pytest
import torch

import lmforge
from lmforge.generation import step_artifact
from lmforge.nn import gemv


def tiny(d_ff: int = 64):
    return lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=d_ff, vocab_size=100)


def test_the_name_follows_shapes_structure_and_switches_but_not_values():
    torch.manual_seed(0)
    a, b = tiny(), tiny()
    ids = torch.zeros(1, 1, dtype=torch.long)
    name = step_artifact.fingerprint([a, ids], {"threads": 2})
    assert step_artifact.fingerprint([b, ids], {"threads": 2}) == name  # other weights, same graph
    assert step_artifact.fingerprint([a, torch.zeros(2, 1, dtype=torch.long)], {"threads": 2}) != name
    assert step_artifact.fingerprint([a, ids], {"threads": 1}) != name
    assert step_artifact.fingerprint([tiny(d_ff=128), ids], {"threads": 2}) != name
    b.decoder.layers[0].ffn = torch.nn.Identity()  # another module where one was: another graph
    assert step_artifact.fingerprint([b, ids], {"threads": 2}) != name


def test_a_module_state_changes_with_a_replaced_function_or_flag_not_with_names_dynamo_adds(monkeypatch):
    name = gemv.__name__
    state = step_artifact._module_state(name)
    monkeypatch.setattr(gemv, "__compiled_fn_1", object(), raising=False)  # Dynamo's own additions
    assert step_artifact._module_state(name) == state
    monkeypatch.setattr(gemv, "available", lambda: False)
    assert step_artifact._module_state(name) != state
    monkeypatch.undo()
    monkeypatch.setattr(gemv, "ENV", "ANOTHER")
    assert step_artifact._module_state(name) != state
    assert step_artifact._module_state("sys") is None  # built in: no source file to hash


def test_a_file_others_can_write_is_not_loaded_and_a_damaged_one_is_deleted(tmp_path):
    path = step_artifact.path_for(tmp_path, "k")
    assert step_artifact.load(path, {}) is None  # absent
    path.parent.mkdir(parents=True)
    path.write_bytes(json.dumps({"format": step_artifact.FORMAT, "torch": torch.__version__, "sources": {}}).encode()
                     + b"\nnot a pickle")
    os.chmod(path.parent, 0o777)
    with pytest.warns(UserWarning, match="another user can write it or its folder"):
        assert step_artifact.load(path, {}) is None
    assert path.exists()
    os.chmod(path.parent, 0o700)
    with pytest.warns(UserWarning, match="could not be loaded"):
        assert step_artifact.load(path, {}) is None
    assert not path.exists()


def test_a_file_from_another_torch_or_format_is_left_unused(tmp_path):
    path = step_artifact.path_for(tmp_path, "k")
    path.parent.mkdir(parents=True, mode=0o700)
    for header in ({"format": step_artifact.FORMAT, "torch": "0.0", "sources": {}},
                   {"format": step_artifact.FORMAT + 1, "torch": torch.__version__, "sources": {}},
                   {"format": step_artifact.FORMAT, "torch": torch.__version__,
                    "sources": {step_artifact.__name__: "stale"}}):
        path.write_bytes(json.dumps(header).encode() + b"\nnot a pickle")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # never unpickled: no warning, nothing deleted
            assert step_artifact.load(path, {}) is None
        assert path.exists()


def test_a_step_traced_through_code_without_a_source_file_is_not_saved(tmp_path, monkeypatch):
    class Source:
        module = "made_at_run_time"

    class Traced:  # what save() asks of an aot_compile result, before serialising it
        def source_info(self):
            return types.SimpleNamespace(inlined_sources={Source()})

    monkeypatch.setitem(sys.modules, Source.module, types.ModuleType(Source.module))
    path = step_artifact.path_for(tmp_path, "k")
    step_artifact.save(Traced(), path)  # nothing to tell a later change of that code by: no file
    assert not path.exists() and step_artifact._module_state(Source.module) is None
