"""benchmarks/train_step.py's plumbing (not its timings): the nanoGPT reference and the interleaved timer."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for nanoGPT's model.py with the same constructor and forward signatures.
FAKE_NANOGPT = '''
from dataclasses import dataclass
import torch

@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool

class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        print("number of parameters: 0.01M")
        self.config = config
        self.wte = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.head = torch.nn.Linear(config.n_embd, config.vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.wte(idx))
        # nanoGPT's own loss uses .view, which needs contiguous targets
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
'''


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_step_bench", ROOT / "benchmarks" / "train_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_nanogpt_reference_has_the_gpt_shape_and_takes_the_batch(bench, tmp_path, capsys):
    (tmp_path / "model.py").write_text(FAKE_NANOGPT)
    case = bench.gpt_case(batch=2, seq=16, vocab=64)
    model = bench.nanogpt_model(str(tmp_path), case, seq=16)
    ours, theirs = case.ours.config, model.gpt.config
    assert (theirs.n_layer, theirs.n_head, theirs.n_embd, theirs.vocab_size, theirs.block_size) == (
        ours.n_layers, ours.n_heads, ours.d_model, 64, 16)
    assert theirs.dropout == 0.0 and theirs.bias
    assert not case.batch_ours["labels"].is_contiguous()  # a shifted slice: the wrapper must cope
    loss = model(**case.batch_ours).loss
    assert loss.ndim == 0 and loss.requires_grad
    assert capsys.readouterr().out == ""  # nanoGPT's parameter-count print is swallowed


def test_nanogpt_checkout_without_model_py_is_a_clear_error(bench, tmp_path):
    case = bench.gpt_case(batch=1, seq=8, vocab=32)
    with pytest.raises(SystemExit, match=r"model\.py not found.*nanoGPT checkout"):
        bench.nanogpt_model(str(tmp_path), case, seq=8)


def test_time_steps_interleaves_the_steps_and_reports_each(bench):
    calls = []
    steps = [lambda name=name: calls.append(name) for name in "abc"]
    timed = bench.time_steps(steps, "cpu", warmup=1, repeats=2)
    assert calls == list("abc" * 3)  # warm-up, then each repeat runs every step once, in turn
    assert len(timed) == 3 and all(seconds >= 0 and faults >= 0 for seconds, faults in timed)


def test_a_run_is_steady_only_when_the_matmul_peak_held(bench):
    assert bench.steady(400.0, 380.0) and bench.steady(400.0, 440.0)
    assert not bench.steady(400.0, 300.0) and not bench.steady(300.0, 400.0)


def test_mfu_is_over_the_higher_of_the_two_peak_readings(bench):
    rows = [{"lmforge_mfu": 1.47, "hf_mfu": 0.5}]
    assert bench.mfu_over_the_higher_peak(rows, 227.0, 416.0) == 416.0
    assert rows[0]["lmforge_mfu"] == pytest.approx(1.47 * 227 / 416)
    assert rows[0]["hf_mfu"] == pytest.approx(0.5 * 227 / 416)
    rows = [{"lmforge_mfu": 0.6, "hf_mfu": 0.5}]
    assert bench.mfu_over_the_higher_peak(rows, 400.0, 380.0) == 400.0 and rows == [{"lmforge_mfu": 0.6, "hf_mfu": 0.5}]
