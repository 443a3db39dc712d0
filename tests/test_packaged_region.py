"""What names a packaged layer, which layers may run it, and what makes a package unusable
(lmforge.generation.packaged_region); building one and opening it in a new process is in test_compile_cache.py."""

from __future__ import annotations

import os

import pytest
import torch

import lmforge
from lmforge.generation import compiled, packaged_region
from lmforge.models.quantize import quantize_model
from lmforge.nn import gemv


def layers(**changes):
    model = lmforge.build_model("gpt-tiny", **{"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64,
                                               "vocab_size": 100, **changes})
    quantize_model(model, "int8")
    return list(model.decoder.layers)


def test_layers_of_one_model_share_a_signature_unless_a_constant_or_shape_differs():
    first, second = layers()
    assert packaged_region.signature(first) == packaged_region.signature(second)
    with torch.no_grad():
        second.ffn.up.scales.mul_(2)  # other weight values: the same code
    assert packaged_region.signature(first) == packaged_region.signature(second)
    # GPT-2's per-layer attention scale is a constant of each layer's code
    first, second = layers(attn_scale_by_layer=True)
    assert packaged_region.signature(first) != packaged_region.signature(second)
    assert packaged_region.signature(layers(d_ff=128)[0]) != packaged_region.signature(first)
    first.attn.table = torch.ones(2)  # a tensor that is not a parameter or buffer would be compiled in
    assert packaged_region.signature(first) is None


def test_the_name_follows_the_layer_shapes_switches_and_source(monkeypatch):
    layer = layers()[0]
    signature = packaged_region.signature(layer)
    inputs = [torch.zeros(1, 1, 32), torch.zeros(1, 2, 64, 16)]
    name = packaged_region.key(signature, inputs, {"threads": 2})
    assert packaged_region.key(signature, inputs, {"threads": 2}) == name
    assert packaged_region.key(signature, [inputs[0], torch.zeros(1, 2, 128, 16)], {"threads": 2}) != name
    assert packaged_region.key(signature, inputs, {"threads": 1}) != name
    assert packaged_region.key(packaged_region.signature(layers(d_ff=128)[0]), inputs, {"threads": 2}) != name
    monkeypatch.setattr(gemv, "available", lambda: False)  # a function of lmforge.nn replaced: other code
    assert packaged_region.key(signature, inputs, {"threads": 2}) != name


def test_the_step_names_its_switches_and_the_layer_inputs_as_the_package_takes_them():
    assert set(compiled._switches()) >= {"gemv", "threads", "grad", "inference"}
    mask, rope = torch.ones(1, 1, 4, dtype=torch.bool), (torch.zeros(1, 1, 4, 8), torch.ones(1, 1, 4, 8))
    flat = packaged_region._tensors((torch.zeros(1), mask, rope, None, torch.ones(3)))
    assert [t.shape for t in flat] == [(1,), (1, 1, 4), (1, 1, 4, 8), (1, 1, 4, 8), (3,)]


def test_a_package_others_can_write_is_not_opened_and_a_damaged_one_is_deleted(tmp_path):
    layer = layers()[0]
    inputs = (torch.zeros(1, 1, 32), None, torch.zeros(1, 2, 64, 16))
    place = packaged_region.locate(layer, inputs, tmp_path, {})
    assert packaged_region.saved(place) is None  # absent
    path = place[0]
    assert path == packaged_region.path_for(tmp_path, packaged_region.key(packaged_region.signature(layer),
                                                                          packaged_region._tensors(inputs), {}))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a zip")
    os.chmod(path.parent, 0o777)
    with pytest.warns(UserWarning, match="another user can write it or its folder"):
        assert packaged_region.saved(place) is None
    assert path.exists()
    os.chmod(path.parent, 0o700)
    with pytest.warns(UserWarning, match="could not be loaded"):
        assert packaged_region.saved(place) is None
    assert not path.exists()


def test_the_packaging_switch_takes_background_or_off(monkeypatch):
    monkeypatch.delenv(compiled.PACKAGE_ENV, raising=False)
    assert compiled.package_mode() == "background"
    monkeypatch.setenv(compiled.PACKAGE_ENV, "off")
    assert compiled.package_mode() == "off"
    monkeypatch.setenv(compiled.PACKAGE_ENV, "sometimes")
    with pytest.raises(ValueError, match="LMFORGE_COMPILE_PACKAGE='sometimes': use background or off"):
        compiled.package_mode()
