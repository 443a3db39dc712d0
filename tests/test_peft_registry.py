"""The PEFT registry: each method describes itself in its own file, and the tables are built from those files."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import fields

import lmforge.peft
from lmforge.peft import METHODS, PeftConfig
from lmforge.peft import model as peft_model
from lmforge.peft.config import OPTION_ORDER
from lmforge.peft.method import PeftMethod
from lmforge.peft.registry import DEFAULT_TARGETS, MERGEABLE, REGISTRY, option_methods


def test_tables_are_the_ones_each_method_states():
    assert METHODS == ("lora", "qlora", "adapter", "prefix", "prompt", "ia3", "bitfit", "mam")
    assert MERGEABLE == ("lora", "qlora", "ia3", "bitfit")
    assert DEFAULT_TARGETS == {
        "lora": ["q", "v"], "qlora": ["q", "v"], "adapter": ["o", "ffn.down"], "ia3": ["k", "v", "ffn.down"],
        "bitfit": ["q", "k", "v", "o", "ffn", "re:.*norm"], "mam": ["ffn"],
    }
    lora, mam = ("lora", "qlora"), ("adapter", "mam")
    assert option_methods(OPTION_ORDER) == {
        "r": lora, "alpha": lora, "dropout": lora, "rslora": lora,
        "nf4_block_size": ("qlora",), "nf4_scaler_block_size": ("qlora",),
        "adapter_dim": mam, "adapter_activation": mam, "adapter_scale": ("mam",),
        "num_virtual_tokens": ("prefix", "prompt", "mam"), "prefix_projection": ("prefix", "mam"),
        "prefix_hidden": ("prefix", "mam"), "prompt_init": ("prompt",), "prompt_init_text": ("prompt",),
        "targets": ("lora", "qlora", "adapter", "ia3", "bitfit", "mam"),
    }


def test_every_option_is_a_config_field_and_every_field_belongs_to_a_method():
    names = {f.name for f in fields(PeftConfig)} - {"method"}
    declared = {option for m in REGISTRY.values() for option in m.options}
    assert declared == names == set(OPTION_ORDER)


def test_every_method_file_is_registered():
    found = {}
    for info in pkgutil.iter_modules(lmforge.peft.__path__):
        module = importlib.import_module(f"lmforge.peft.{info.name}")
        if isinstance(getattr(module, "METHOD", None), PeftMethod):
            found[module.METHOD.name] = module.METHOD
    assert found == REGISTRY


def test_methods_means_one_thing():
    assert not hasattr(peft_model, "METHODS")  # the attach functions are the registry's, not a second table
    assert all(REGISTRY[name].mergeable == PeftConfig(method=name).mergeable for name in METHODS)
