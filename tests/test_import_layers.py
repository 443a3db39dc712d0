"""Dependencies point one way: no import cycle among lmforge modules, and no import from a higher layer.

Imports inside functions count (see :mod:`import_graph`), so a cycle cannot hide in a function body.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import cycles, import_graph, layer_violations

SRC = Path(__file__).resolve().parents[1] / "src"

# The layers, lowest first; a module may import its own layer and the ones below. The one statement of the order:
# the README's "Where things are" lists them top-down, and tests/test_docs_layers.py checks it against this.
LAYERS = {
    # ground floor
    "": 0,  # the package __init__: its public names resolve lazily, so it imports nothing itself
    "config": 0,
    "tokenization": 0,
    "errors": 0,
    "utils": 0,
    "nn": 1,
    # generation drives any model through the forward contract and imports only nn; Transformer.generate
    # delegates to it, so it sits below the models
    "generation": 2,
    "models": 3,
    "checkpoint": 3,
    "model_folder": 3,  # the folder format the models save through and checkpoint loads with
    # the HF engine builds Transformer shells and writes model folders, so it shares the models' layer; its
    # declarations (hf_family, hf_*) import only config
    "interop": 3,
    "objectives": 4,
    "data": 4,
    "datasets": 4,  # the bundled corpora, read through data.sources
    # the file readers import only the ground floor, and the tokenizer trainer reads its corpora with them
    "data.sources": 0,
    "training": 5,
    "tasks": 6,
    "peft": 6,
    "prompting": 6,
    "embeddings": 6,
    "align": 6,  # reward models, DPO, PPO, GRPO: a Trainer with a loss, like the tasks (whose reward task it holds)
    "distillation": 6,
    "evaluation": 6,  # tasks by name, probes, baselines: on top of tasks (it imports them, they never import it)
    "experiments": 7,  # grids of runs: pretrain and finetune cells, below the quickstart that composes everything
    "cost": 7,  # price-tag reports, scaling fits and plans: above the training loop whose tags they read
    "quickstart": 8,
    "serve": 8,  # the server composes generation, prompting, embeddings and tasks, beside the main job
    "cli": 9,
}


@pytest.fixture(scope="module")
def graph():
    return import_graph(SRC, "lmforge")


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_every_part_has_a_layer(graph):
    parts = {name[len("lmforge."):].split(".")[0] if name != "lmforge" else "" for name in graph}
    assert sorted(parts - set(LAYERS)) == []


def test_imports_point_down(graph):
    assert [v for v in layer_violations(graph, LAYERS, "lmforge") ] == []


# ---------------------------------------------------------------------- the checker itself, on a made-up package
def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"pkg/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "pkg/low.py": "X = 1\n",
    "pkg/high.py": "from pkg.low import X\n",
    "pkg/sub/__init__.py": "from pkg.sub.a import A\n",
    "pkg/sub/a.py": "from pkg.sub.b import B\nA = B\n",
    "pkg/sub/b.py": "import pkg.low\nB = 2\n",
}
SMALL_LAYERS = {"": 0, "low": 0, "sub": 0, "high": 1}


def test_a_clean_package_passes(tmp_path):
    graph = import_graph(_package(tmp_path, CLEAN), "pkg")
    assert graph["pkg.high"] == {"pkg.low"}
    assert cycles(graph) == []
    assert layer_violations(graph, SMALL_LAYERS, "pkg") == []


def test_a_cycle_hidden_in_a_function_is_reported(tmp_path):
    files = {**CLEAN, "pkg/low.py": "X = 1\n\n\ndef late():\n    from pkg.high import X\n    return X\n"}
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert cycles(graph) == [["pkg.high", "pkg.low"]]


def test_a_cycle_through_a_package_init_is_reported(tmp_path):
    # b imports its package by name: pkg.sub's __init__ imports a, which imports b
    files = {**CLEAN, "pkg/sub/b.py": "from pkg.sub import A\nB = 2\n"}
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert cycles(graph) == [["pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


def test_importing_a_submodule_runs_its_package(tmp_path):
    # low imports pkg.sub.b from outside pkg.sub: pkg/sub/__init__.py runs first, and it imports a
    files = {**CLEAN, "pkg/low.py": "import pkg.sub.b\n", "pkg/sub/a.py": "import pkg.low\nA = 1\n"}
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert graph["pkg.low"] == {"pkg.sub", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.low", "pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


def test_a_layer_violation_is_reported(tmp_path):
    files = {**CLEAN, "pkg/low.py": "def helper():\n    from pkg import high\n    return high\n"}
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert layer_violations(graph, SMALL_LAYERS, "pkg") == [("pkg.low", "pkg.high")]


def test_a_module_placed_apart_and_a_lazy_package(tmp_path):
    # low imports pkg.sub.b, placed on the ground floor apart from pkg.sub; pkg/sub/__init__.py imports nothing,
    # (or only the ground floor), so running it pulls no higher layer in
    files = {**CLEAN, "pkg/low.py": "from pkg.sub.b import B\n", "pkg/sub/__init__.py": "import pkg.low\n",
             "pkg/sub/b.py": "B = 2\n"}
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert graph["pkg.low"] == {"pkg.sub", "pkg.sub.b"}
    layers = {**SMALL_LAYERS, "sub": 1, "sub.b": 0}
    assert layer_violations(graph, layers, "pkg") == []
    assert layer_violations(graph, {**layers, "sub.b": 1}, "pkg") == [("pkg.low", "pkg.sub.b")]
    files["pkg/sub/__init__.py"] = "from pkg.sub.a import A\n"  # an eager __init__ is a dependency again
    graph = import_graph(_package(tmp_path, files), "pkg")
    assert ("pkg.low", "pkg.sub") in layer_violations(graph, layers, "pkg")
