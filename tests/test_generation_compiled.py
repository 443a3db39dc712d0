"""Compiled decoding (``compile=True``): the same tokens as eager decoding, one compile per shape, clear
errors where it does not apply. Models are 2-layer and 32 wide, so each compile takes seconds; the
models are shared per module so tests with the same shapes reuse one compiled step."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_config
from torch._dynamo.utils import counters

import lmforge
from lmforge.generation import GenerationConfig, generate
from lmforge.generation.compiled import CAPACITY_BLOCK, cached_steps, capacity_for
from lmforge.models import Transformer

N = 12
PRESETS = {
    "gpt2-learned": dict(position="learned"),
    "llama-rope-gqa": dict(position="rope", n_kv_heads=2, norm="rmsnorm", activation="swiglu", bias=False),
}


@torch.no_grad()
def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(tiny_config(max_seq_len=128, **overrides))
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.3)  # sharp logits: fp32 rounding must not decide an argmax
    return model.eval()


@pytest.fixture(scope="module")
def models() -> dict[str, Transformer]:
    return {name: _model(**overrides) for name, overrides in PRESETS.items()}


RAGGED = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]  # left-padded into one batch


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("prompts", [[[5, 6, 7]], RAGGED], ids=["batch1", "ragged3"])
@pytest.mark.parametrize("name", PRESETS)
def test_compiled_greedy_equals_eager(models, name, prompts, device):
    model = models[name] if device == "cpu" else _model(**PRESETS[name]).to(device)
    eager = generate(model, prompts, max_new_tokens=N, ignore_eos=True)
    compiled = generate(model, prompts, max_new_tokens=N, ignore_eos=True, compile=True)
    assert torch.equal(compiled.sequences, eager.sequences)
    assert torch.equal(compiled.lengths, eager.lengths)


def test_second_call_reuses_the_compiled_step(models):
    model = models["gpt2-learned"]
    generate(model, RAGGED, max_new_tokens=N, compile=True)  # compiled here, or by an earlier test
    before, steps = _graphs(), cached_steps(model)
    # Other prompts and another length in the same capacity block: same shapes, nothing recompiles.
    out = generate(model, [[1, 2], [3, 4, 5, 6], [7]], max_new_tokens=N + 5, ignore_eos=True, compile=True)
    eager = generate(model, [[1, 2], [3, 4, 5, 6], [7]], max_new_tokens=N + 5, ignore_eos=True)
    assert torch.equal(out.sequences, eager.sequences)
    generate(model, [[1, 2], [3, 4], [5, 6]], max_new_tokens=N, compile=True)  # unpadded: same shapes too
    assert _graphs() == before
    assert cached_steps(model) == steps


def test_weights_written_in_place_are_not_served_stale():
    # The step compiles the weights in as constants (freezing): a later in-place write must reach it.
    model = _model(**PRESETS["gpt2-learned"])
    generate(model, [[5, 6, 7]], max_new_tokens=4, compile=True)
    with torch.no_grad():
        model.decoder.layers[0].ffn.up.weight.mul_(3.0)
        model.embed_tokens.weight.mul_(1.5)  # the tied head's weight too
    eager = generate(model, [[5, 6, 7]], max_new_tokens=N, ignore_eos=True)
    compiled = generate(model, [[5, 6, 7]], max_new_tokens=N, ignore_eos=True, compile=True)
    assert torch.equal(compiled.sequences, eager.sequences)


def test_capacity_rounds_up_to_blocks():
    assert capacity_for(1) == capacity_for(CAPACITY_BLOCK) == CAPACITY_BLOCK
    assert capacity_for(CAPACITY_BLOCK + 1) == 2 * CAPACITY_BLOCK


def test_compiled_eos_and_sampling_equal_eager(models):
    model = models["gpt2-learned"]
    eos = generate(model, RAGGED, max_new_tokens=N, ignore_eos=True).sequences[0, 3].item()
    for settings in (dict(eos_token_id=eos), dict(strategy="sample", top_k=20, top_p=0.9, seed=3)):
        eager = generate(model, RAGGED, max_new_tokens=N, **settings)
        compiled = generate(model, RAGGED, max_new_tokens=N, compile=True, **settings)
        assert torch.equal(compiled.sequences, eager.sequences), settings
        assert torch.equal(compiled.lengths, eager.lengths), settings
    assert int(compiled.lengths.min()) >= 1


def test_later_calls_of_one_compiled_step_equal_eager(device):
    """Every generation after the first reuses the compiled step (on CUDA its graph and its cache buffers): other
    prompts of the same shapes, sampling and beam search (rows reordered in the step's buffers) stay exact."""
    model = _model(**PRESETS["llama-rope-gqa"]).to(device)
    g = torch.Generator().manual_seed(5)
    for settings in (dict(), dict(strategy="sample", top_k=20, seed=3), dict()):
        prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 2, 3)]
        eager = generate(model, prompts, max_new_tokens=N, ignore_eos=True, **settings)
        compiled = generate(model, prompts, max_new_tokens=N, ignore_eos=True, compile=True, **settings)
        assert torch.equal(compiled.sequences, eager.sequences), settings
    assert len(cached_steps(model)) == 1
    beams = dict(max_new_tokens=6, num_beams=3, num_return_sequences=3, ignore_eos=True)
    for prompt in ([[5, 6, 7]], [[9, 3, 4]]):
        eager, compiled = generate(model, prompt, **beams), generate(model, prompt, compile=True, **beams)
        assert torch.equal(compiled.sequences, eager.sequences)
        assert torch.allclose(compiled.scores, eager.scores, atol=1e-5)


def test_compiled_beam_search_equals_eager(models):
    model = models["gpt2-learned"]
    settings = dict(max_new_tokens=6, num_beams=2, num_return_sequences=2, ignore_eos=True)
    eager = generate(model, [[5, 6, 7]], **settings)
    compiled = generate(model, [[5, 6, 7]], compile=True, **settings)
    assert torch.equal(compiled.sequences, eager.sequences)
    assert torch.allclose(compiled.scores, eager.scores, atol=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (dict(position="alibi"), "position schemes"),
    (dict(arch="encoder-decoder"), "decoder models only"),
])
def test_unsupported_models_fail_clearly(overrides, message):
    model = Transformer(tiny_config(**overrides)).eval()
    with pytest.raises(ValueError, match=message):
        generate(model, [[1, 2]], max_new_tokens=2, compile=True)


def test_cli_compile_streams_what_eager_prints(tmp_path, capsys):
    from lmforge.cli.main import main
    from lmforge.tokenization import train_tokenizer

    (tmp_path / "corpus.txt").write_text("the cat sat on the mat. the dog sat on the log.\n" * 40, encoding="utf-8")
    tok = train_tokenizer([tmp_path / "corpus.txt"], kind="byte-bpe", vocab_size=280, family="gpt",
                          show_progress=False)
    model = _model(vocab_size=len(tok))
    folder = lmforge.save(model, tmp_path / "model", tokenizer=tok)
    args = ["generate", "--model", str(folder), "--prompt", "the cat", "--max-new-tokens", "10", "--ignore-eos"]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0  # streamed, through the compiled step
    assert capsys.readouterr().out == eager and eager.strip()
    assert main([*args, "--compile", "now"]) == 0  # (an fp32 step compiles now either way)
    assert capsys.readouterr().out == eager


def test_compile_needs_the_cache_and_takes_true_false_or_cached():
    with pytest.raises(ValueError, match="use_cache"):
        GenerationConfig(compile=True, use_cache=False)
    with pytest.raises(ValueError, match=r"GenerationConfig.compile='later' must be True, False or 'cached'"):
        GenerationConfig(compile="later")
    assert GenerationConfig(compile="cached").compile == "cached"
