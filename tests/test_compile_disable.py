"""``@compile_disable`` (lmforge.nn.compile_disable): the compiler is not imported by the model code, and once it is
loaded the marked methods are exactly ``torch.compiler.disable``'d. Each check runs in a fresh interpreter, since
this test process may have loaded ``torch._dynamo`` already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_importing_the_cli_and_the_models_does_not_import_the_compiler():
    loaded = _python("import sys, lmforge.cli.main, lmforge.cli.finetune, lmforge.cli.pretrain, lmforge.models, "
                     "lmforge.nn.moe; print('torch' in sys.modules, 'torch._dynamo' in sys.modules)")
    assert loaded == "True False"


def test_methods_are_disabled_when_the_compiler_loads_and_compiled_calls_skip_them():
    code = """
import torch
from helpers import tiny_config
from lmforge.models.transformer import Transformer
from lmforge.nn.compile_disable import compile_disable
from lmforge.nn.moe import Experts

marked = lambda f: getattr(f, "_torchdynamo_disable", False)
print(marked(Transformer._labelled_loss), marked(Transformer._add_nsp_loss), marked(Experts._eager))
import torch._dynamo
from torch._dynamo.utils import counters
print(marked(Transformer._labelled_loss), marked(Transformer._add_nsp_loss), marked(Experts._eager))

class Later:  # defined with the compiler loaded: disabled at once
    @compile_disable
    def f(self):
        return 1
print(marked(Later.f), Later().f())

torch.manual_seed(0)
model = Transformer(tiny_config(arch="decoder", position="learned")).eval()
ids = torch.randint(1, 97, (2, 8))
eager = model(input_ids=ids, labels=ids).loss
compiled = torch.compile(model, backend="eager")(input_ids=ids, labels=ids).loss
torch.testing.assert_close(compiled, eager)
print(any("compiler.disable" in reason for reason in counters["graph_break"]))
"""
    assert _python(code).splitlines() == ["False False False", "True True True", "True 1", "True"]
