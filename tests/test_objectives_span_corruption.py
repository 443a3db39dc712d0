"""T5 span corruption: the paper's example, T5's length arithmetic, mask statistics, exact reconstruction."""

import pytest
import torch

from lmforge.objectives.base import shift_right
from lmforge.objectives.span_corruption import (
    SpanCorruption,
    compute_input_and_target_lengths,
    corrupt_spans,
    random_spans_noise_mask,
)

PAD, EOS = 0, 1
SENTINELS = list(range(32099, 31899, -1))  # T5-style: <extra_id_0> = 32099, counting down (200 here)


def runs(mask: torch.Tensor) -> list[int]:
    """Lengths of the runs of True."""
    starts = mask & ~torch.cat([torch.tensor([False]), mask[:-1]])
    ids = torch.cumsum(starts.long(), 0)[mask]
    return torch.bincount(ids)[1:].tolist()


def test_thank_you_for_inviting_me():
    words = "Thank you for inviting me to your party last week .".split()
    vocab = {w: 100 + i for i, w in enumerate(words)}
    names = {v: k for k, v in vocab.items()} | {SENTINELS[0]: "<X>", SENTINELS[1]: "<Y>", SENTINELS[2]: "<Z>",
                                                  EOS: "</s>"}
    tokens = torch.tensor([vocab[w] for w in words])
    noise = torch.tensor([w in ("for", "inviting", "last") for w in words])
    inputs, targets = corrupt_spans(tokens, noise, SENTINELS, EOS)
    assert " ".join(names[t] for t in inputs.tolist()) == "Thank you <X> me to your party <Y> week . </s>"
    assert " ".join(names[t] for t in targets.tolist()) == "<X> for inviting <Y> last <Z> </s>"


def test_sentinels_stay_aligned_when_the_text_starts_or_ends_with_noise():
    tokens = torch.arange(10, 16)
    inputs, targets = corrupt_spans(tokens, torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.bool), SENTINELS, EOS)
    s0, s1 = SENTINELS[:2]
    assert inputs.tolist() == [s0, 12, 13, s1, EOS]
    assert targets.tolist() == [s0, 10, 11, s1, 14, 15, EOS]  # no closing sentinel: the text ends in noise


@pytest.mark.parametrize(
    "inputs_length, density, mean, expected",
    # (512, 0.5): 767 raw tokens would give 512 inputs but 513 targets; T5 drops one token to get 512/512.
    [(512, 0.15, 3.0, (568, 114)), (128, 0.15, 3.0, (141, 29)), (512, 0.5, 3.0, (766, 512))],
)
def test_lengths_helper_matches_t5(inputs_length, density, mean, expected):
    assert compute_input_and_target_lengths(inputs_length, density, mean) == expected
    expanded, targets_length = expected
    # End to end: blocks of the expanded length become exactly these shapes, without padding.
    t5 = SpanCorruption(sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, noise_density=density,
                        mean_noise_span_length=mean, seed=0)
    g = torch.Generator().manual_seed(0)
    batch = t5(list(torch.randint(2, 30000, (8, expanded), generator=g)))
    assert batch["input_ids"].shape == (8, inputs_length) and batch["attention_mask"].all()
    assert batch["labels"].shape == (8, targets_length) and (batch["labels"] != -100).all()


def test_noise_mask_statistics_match_the_settings():
    g = torch.Generator().manual_seed(0)
    mask = random_spans_noise_mask(568, 0.15, 3.0, g)
    assert int(mask.sum()) == round(568 * 0.15) and len(runs(mask)) == round(85 / 3)
    assert not mask[0] and mask[-1]  # kept first, noise last, as in T5

    noise = total = 0
    span_lengths, first_span_starts = [], set()
    for _ in range(400):
        length = int(torch.randint(50, 1000, (), generator=g))
        mask = random_spans_noise_mask(length, 0.15, 3.0, g)
        noise += int(mask.sum())
        total += length
        span_lengths += runs(mask)
        first_span_starts.add(int(mask.nonzero()[0]))
    assert abs(noise / total - 0.15) < 0.005
    assert abs(sum(span_lengths) / len(span_lengths) - 3.0) < 0.1
    assert min(span_lengths) >= 1 and max(span_lengths) > 6  # random segmentation, not fixed spans
    assert len(first_span_starts) > 50  # span positions are random


def test_batch_reconstructs_the_original_and_shifts_decoder_inputs():
    g = torch.Generator().manual_seed(3)
    examples = [torch.randint(2, 30000, (n,), generator=g) for n in (60, 200, 37)]
    batch = SpanCorruption(sentinel_ids=SENTINELS, eos_token_id=EOS, pad_token_id=PAD, seed=0)(examples)
    sentinel_set = set(SENTINELS)
    for x, inp, attn, lab in zip(examples, batch["input_ids"], batch["attention_mask"], batch["labels"]):
        inp = inp[attn.bool()].tolist()
        lab = lab[lab != -100].tolist()
        assert inp[-1] == EOS and lab[-1] == EOS
        # Fill each input sentinel with the target tokens that follow the same sentinel.
        spans, current = {}, None
        for t in lab[:-1]:
            if t in sentinel_set:
                current = t
                spans[current] = []
            else:
                spans[current].append(t)
        rebuilt = [tok for t in inp[:-1] for tok in (spans[t] if t in sentinel_set else [t])]
        assert rebuilt == x.tolist()
        used = [t for t in inp if t in sentinel_set]
        assert used == SENTINELS[: len(used)]  # unique, in order
    assert torch.equal(batch["decoder_input_ids"], shift_right(batch["labels"], PAD, PAD))
    assert (batch["decoder_input_ids"][:, 0] == PAD).all()  # T5 starts decoding from pad
    assert torch.equal(batch["decoder_attention_mask"].bool(), batch["labels"] != -100)


def test_too_few_sentinels_is_an_error():
    t5 = SpanCorruption(sentinel_ids=SENTINELS[:2], eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(ValueError, match="sentinels needed"):
        t5([list(range(2, 200))])
