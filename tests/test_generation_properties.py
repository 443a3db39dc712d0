"""Generation properties on lmforge's own position schemes: the cache changes nothing, left padding
changes nothing, seeds reproduce, EOS and stop strings end sequences where their definitions say."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_config

from lmforge.generation import decode_outputs, generate
from lmforge.models import Transformer
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.linear import apply_linear, decoding_weights, linear

N = 10


@torch.no_grad()
def _model(**overrides) -> Transformer:
    model = Transformer(tiny_config(**overrides))
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.3)  # sharp logits: near-ties would make "identical" flaky
    return model.eval()


DECODERS = {
    "learned": dict(position="learned"),
    "rope-gqa-llama": dict(position="rope", n_kv_heads=2, norm="rmsnorm", activation="swiglu", bias=False),
    "alibi": dict(position="alibi"),
    "t5-bias": dict(position="t5-bias"),
    "shaw": dict(position="relative", relative_values=True),
}
ENCODER_DECODERS = {
    "t5-like": dict(arch="encoder-decoder", position="t5-bias", norm="rmsnorm", bias=False),
    "bart-like": dict(arch="encoder-decoder", position="learned", norm_position="post", embedding_norm=True),
}
ALL = {**DECODERS, **ENCODER_DECODERS}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(1, 97, (n,), generator=g).tolist() for n in (3, 7, 5)]


SETTINGS = {
    "greedy-penalties": dict(repetition_penalty=1.3, no_repeat_ngram_size=2),
    "beam": dict(num_beams=3, num_return_sequences=2, length_penalty=0.8),
    "sample": dict(strategy="sample", top_k=20, top_p=0.9, seed=7),
}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", ALL)
def test_cached_equals_uncached(name, setting, device):
    model = _model(**ALL[name]).to(device)
    prompts = _prompts()
    cached = generate(model, prompts, max_new_tokens=N, ignore_eos=True, **SETTINGS[setting])
    uncached = generate(model, prompts, max_new_tokens=N, ignore_eos=True, use_cache=False, **SETTINGS[setting])
    assert torch.equal(cached.sequences, uncached.sequences)
    if cached.scores is not None:
        torch.testing.assert_close(cached.scores, uncached.scores)


@pytest.mark.parametrize("setting", ["greedy-penalties", "beam"])
@pytest.mark.parametrize("name", ALL)
def test_padded_batch_equals_one_by_one(name, setting, device):
    """Decoders are left-padded (positions count real tokens only); encoder-decoder sources are padded too."""
    model = _model(**ALL[name]).to(device)
    prompts = _prompts()
    batch = generate(model, prompts, max_new_tokens=N, ignore_eos=True, **SETTINGS[setting])
    alone = [generate(model, [p], max_new_tokens=N, ignore_eos=True, **SETTINGS[setting]) for p in prompts]
    assert batch.tolist() == [row for out in alone for row in out.tolist()]
    if batch.scores is not None:
        torch.testing.assert_close(batch.scores, torch.cat([out.scores for out in alone]))


@pytest.mark.parametrize("name", ["learned", "rope-gqa-llama"])
def test_right_padded_mask_is_repacked_to_the_left(name):
    model = _model(**DECODERS[name])
    prompts = _prompts()
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    right = generate(model, ids, mask, max_new_tokens=N, ignore_eos=True)
    assert torch.equal(right.sequences, generate(model, prompts, max_new_tokens=N, ignore_eos=True).sequences)


def test_eos_ends_each_sequence_and_pads_after_it():
    model = _model(position="rope")
    prompts = _prompts()
    free = generate(model, prompts, max_new_tokens=N, ignore_eos=True).tolist()
    eos = free[1][3]  # row 1 ends at step 4 (or earlier, if eos occurs before)
    out = generate(model, prompts, max_new_tokens=N, eos_token_id=eos, pad_token_id=96)
    for row, full, n in zip(out.sequences.tolist(), free, out.lengths.tolist()):
        expected = full[: full.index(eos) + 1] if eos in full else full
        assert row[:n] == expected and n == len(expected)
        assert row[n:] == [96] * (len(row) - n)
    assert out.lengths[1] <= 4  # EOS did end a sequence early


def test_generation_stops_when_every_sequence_ended():
    model = _model(position="learned")
    prompt = [_prompts()[0]]
    first = generate(model, prompt, max_new_tokens=N, ignore_eos=True).tolist()[0][0]
    out = generate(model, prompt, max_new_tokens=N, eos_token_id=first)
    assert out.sequences.shape == (1, 1) and out.lengths.tolist() == [1]


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone():
    model = _model(position="alibi")
    prompts = _prompts()
    settings = dict(max_new_tokens=N, ignore_eos=True, strategy="sample", temperature=1.5)
    state = torch.random.get_rng_state()
    a = generate(model, prompts, seed=11, **settings).sequences
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, generate(model, prompts, seed=11, **settings).sequences)
    assert not torch.equal(a, generate(model, prompts, seed=12, **settings).sequences)
    torch.manual_seed(5)  # without a seed, sampling draws from the global generator
    b = generate(model, prompts, **settings).sequences
    torch.manual_seed(5)
    assert torch.equal(b, generate(model, prompts, **settings).sequences)


def test_several_samples_per_prompt_are_grouped_by_prompt():
    model = _model(position="learned")
    prompts = _prompts()
    out = generate(model, prompts, max_new_tokens=N, ignore_eos=True, strategy="sample", seed=0, num_return_sequences=3)
    assert out.sequences.shape == (9, N)
    rows = out.tolist()
    assert len({tuple(r) for r in rows}) > 3  # independent draws, not copies


class _Letters:
    """A stand-in tokenizer: id i decodes to one letter, so stop strings are easy to place."""

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_stop_string_ends_at_the_token_that_completes_it(num_beams):
    model = _model(position="rope")
    tok = _Letters()
    prompts = _prompts()
    settings = dict(max_new_tokens=N, ignore_eos=True, num_beams=num_beams, num_return_sequences=num_beams)
    free = generate(model, prompts, **settings)
    stop = tok.decode(free.tolist()[num_beams])[3:5]  # prompt 1's best output spells it at steps 4-5
    out = generate(model, prompts, stop_strings=[stop], tokenizer=tok, **settings)
    ended_by_stop = 0
    for row in out.tolist():
        text = tok.decode(row)  # one letter per token
        if stop in text:  # ended by the token that completes the first occurrence
            assert text.find(stop) + len(stop) == len(row)
            ended_by_stop += 1
        else:  # only the length limit ended it
            assert len(row) == N
    assert ended_by_stop
    if num_beams == 1:  # greedy follows the same path as without the stop string, cut where it completes
        for row, full in zip(out.tolist(), free.tolist()):
            full_text = tok.decode(full)
            assert row == (full[: full_text.find(stop) + len(stop)] if stop in full_text else full)
    texts = decode_outputs(tok, out, [stop])
    assert all(t.count(stop) <= 1 and (stop not in t or t.endswith(stop)) for t in texts)


def test_generation_runs_in_eval_mode_and_restores_the_mode():
    model = _model(position="learned", dropout=0.5)
    prompts = _prompts()
    expected = generate(model, prompts, max_new_tokens=N, ignore_eos=True).sequences
    model.train()
    assert torch.equal(generate(model, prompts, max_new_tokens=N, ignore_eos=True).sequences, expected)
    assert model.training


def test_outputs_are_ordinary_tensors():
    out = generate(_model(), _prompts(), max_new_tokens=3, ignore_eos=True)
    out.sequences[0, 0] = 1  # inference tensors would refuse this outside inference mode
    assert not out.sequences.is_inference()


@pytest.mark.parametrize(
    "overrides, call, message",
    [
        (dict(arch="encoder", head="mlm"), dict(), "cannot generate"),
        (dict(position="learned", max_seq_len=12), dict(max_new_tokens=10), "max_seq_len=12"),
        (dict(), dict(stop_strings=["x"]), "need a tokenizer"),
    ],
)
def test_errors_say_what_to_change(overrides, call, message):
    model = _model(**overrides)
    with pytest.raises(ValueError, match=message):
        generate(model, _prompts(), **call)


def test_empty_decoder_prompt_is_an_error():
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(_model(), [[5, 6], []], max_new_tokens=2)


def test_one_prompt_may_be_a_flat_list_or_a_1d_tensor():
    model = _model()
    expected = generate(model, [[5, 6, 7]], max_new_tokens=3, ignore_eos=True).sequences
    assert torch.equal(generate(model, [5, 6, 7], max_new_tokens=3, ignore_eos=True).sequences, expected)
    assert torch.equal(generate(model, torch.tensor([5, 6, 7]), max_new_tokens=3, ignore_eos=True).sequences, expected)


def test_kv_cache_capacity_avoids_reallocation():
    cache = KVCache(capacity=40)
    k = torch.randn(1, 2, 30, 4)
    cache.update(0, k, k)
    storage = cache._keys[0].data_ptr()
    for _ in range(10):
        cache.update(0, k[:, :, :1], k[:, :, :1])
    assert cache._keys[0].data_ptr() == storage and cache.seq_len() == 40
    cache.update(0, k[:, :, :1], k[:, :, :1])  # beyond the reservation it still grows
    assert cache.seq_len() == 41 and cache._keys[0].shape[2] >= 41


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_features", [96, 24])  # wide, square
def test_decoding_linear_kernels_equal_f_linear(rows, bias, out_features):
    """Registered weights use other kernels while decoding (one row, a few rows, many rows): same results."""
    layer = torch.nn.Linear(24, out_features, bias=bias)
    x = torch.randn(rows, 1, 24)
    with decoding_weights([layer.weight]), torch.no_grad():
        got = apply_linear(layer, x)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_decoding_linear_falls_back_when_grads_are_on_or_the_weight_changed():
    layer = torch.nn.Linear(8, 32)
    x = torch.randn(3, 8)
    with decoding_weights([layer.weight]):
        linear(x, layer.weight, layer.bias).sum().backward()  # grads on: F.linear, so the weight gets one
        assert layer.weight.grad is not None
        with torch.no_grad():
            layer.weight.mul_(2.0)  # a stale copy must not be used
            torch.testing.assert_close(linear(x[:1], layer.weight, layer.bias), layer(x[:1]))
    calls = []
    layer.register_forward_hook(lambda *args: calls.append(1))
    with decoding_weights([layer.weight]), torch.no_grad():
        apply_linear(layer, x)
    assert calls == [1]  # a hooked layer runs its own forward


@pytest.mark.parametrize("num_beams", [1, 3])
def test_cross_attention_keys_and_values_are_computed_once(num_beams):
    model = _model(**ENCODER_DECODERS["bart-like"])
    calls = []
    for layer in model.decoder.layers:
        layer.cross_attn.k.register_forward_hook(lambda *args: calls.append(1))
    generate(model, _prompts(), max_new_tokens=N, ignore_eos=True, num_beams=num_beams)
    assert len(calls) == len(model.decoder.layers)  # at the first step only, not once per token
