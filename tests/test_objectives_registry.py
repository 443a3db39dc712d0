"""Registry, architecture fit, and determinism: same seed -> same batch; a saved state replays the next batch."""

import re

import pytest
import torch

from lmforge.objectives import (
    ARCHITECTURES,
    OBJECTIVES,
    MaskedLM,
    architectures_for,
    build_objective,
    check_architecture,
)

PAD, CLS, SEP, MASK, EOS = 0, 1, 2, 3, 4
SENTINELS = list(range(999, 899, -1))


def options(name: str, seed: int) -> dict:
    if name in ("mlm", "electra", "unilm"):
        return dict(vocab_size=1000, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                    add_cls_sep=True, seed=seed)
    if name == "nsp":
        mlm = MaskedLM(vocab_size=1000, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                       seed=seed + 1)
        return dict(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, mlm=mlm, seed=seed)
    if name == "mlm+nsp":  # flat documents, cut into sentences after each 5
        return dict(vocab_size=1000, mask_token_id=MASK, cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD,
                    sentence_end_ids=[5], seed=seed)
    if name in ("clm", "bilm"):
        return dict(pad_token_id=PAD)
    if name in ("prefix-lm", "permuted-lm"):
        return dict(pad_token_id=PAD, seed=seed)
    if name == "span-corruption":
        return dict(sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, seed=seed)
    if name == "ul2":
        return dict(sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, vocab_size=1000, seed=seed)
    if name == "mass":
        return dict(mask_token_id=MASK, pad_token_id=PAD, seed=seed)
    if name == "enc-dec-lm":
        return dict(eos_token_id=EOS, pad_token_id=PAD, seed=seed)
    if name == "multilingual-denoising":
        return dict(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, vocab_size=1000, languages=["en", "es"],
                    sentence_end_ids=[5], seed=seed)
    return dict(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, sentence_end_ids=[5], mask_prob=0.1,
                delete_prob=0.1, rotate_prob=0.5, seed=seed)


def examples(name: str, step: int) -> list:
    g = torch.Generator().manual_seed(100 + step)
    if name == "nsp":
        return [[torch.randint(10, 900, (5,), generator=g).tolist() for _ in range(4)] for _ in range(6)]
    if name == "multilingual-denoising":  # (language, ids) pairs, as a LanguageMixture yields them
        langs = ["en", "es", "en", "es"]
        return [(lang, torch.randint(5, 900, (n,), generator=g)) for lang, n in zip(langs, (64, 40, 64, 17))]
    return [torch.randint(5, 900, (n,), generator=g) for n in (64, 40, 64, 17)]


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


RANDOM = [n for n in OBJECTIVES if n not in ("clm", "bilm")]  # these two draw no random numbers


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_same_seed_gives_identical_batches(name):
    first = build_objective(name, **options(name, seed=7))
    second = build_objective(name, **options(name, seed=7))
    for step in range(3):
        assert_same(first(examples(name, step)), second(examples(name, step)))


@pytest.mark.parametrize("name", RANDOM)
def test_different_seeds_give_different_batches(name):
    a = build_objective(name, **options(name, seed=7))(examples(name, 0))
    b = build_objective(name, **options(name, seed=8))(examples(name, 0))
    assert any(a[k].shape != b[k].shape or not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_restoring_the_state_replays_the_next_batch(name):
    objective = build_objective(name, **options(name, seed=3))
    objective(examples(name, 0))
    state = objective.state_dict()
    expected = objective(examples(name, 1))
    objective(examples(name, 2))  # move on, then rewind
    objective.load_state_dict(state)
    assert_same(objective(examples(name, 1)), expected)
    # A fresh instance resumes the same way (e.g. after a restart from a checkpoint).
    fresh = build_objective(name, **options(name, seed=99))
    fresh.load_state_dict(state)
    assert_same(fresh(examples(name, 1)), expected)


def test_architecture_table_and_errors():
    assert architectures_for("mlm") == ("encoder",)
    assert architectures_for("clm") == ("decoder",) and architectures_for("prefix-lm") == ("decoder",)
    assert architectures_for("span-corruption") == architectures_for("denoising") == ("encoder-decoder", "decoder")
    for name in OBJECTIVES:
        for arch in ARCHITECTURES:
            if arch in architectures_for(name):
                check_architecture(name, arch)
            else:
                with pytest.raises(ValueError, match=f"'{re.escape(name)}' does not fit arch='{arch}'.*needs arch="):
                    check_architecture(name, arch)
    with pytest.raises(ValueError, match="unknown architecture"):
        check_architecture("mlm", "rnn")
    with pytest.raises(ValueError, match="unknown objective 'xlnet'"):
        build_objective("xlnet")
    assert type(build_objective("Prefix_LM", pad_token_id=0)).__name__ == "PrefixLM"
