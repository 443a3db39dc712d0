"""Prefix LM: bidirectional within the prefix, causal after, padding keys hidden, labels ignore the prefix."""

import pytest
import torch

from lmforge.objectives.prefix_lm import PrefixLM


def make_batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    examples = [torch.randint(5, 100, (n,), generator=g) for n in lengths]
    return examples, PrefixLM(pad_token_id=0, seed=seed)(examples)


def test_mask_is_bidirectional_in_the_prefix_and_causal_after():
    examples, batch = make_batch([9, 9, 6, 4, 9])
    mask, labels = batch["attention_mask"], batch["labels"]
    B, T = batch["input_ids"].shape
    assert mask.shape == (B, T, T) and mask.dtype == torch.bool
    for b, x in enumerate(examples):
        n = len(x) - 1  # real input positions
        p = int(mask[b, 0, :].sum())  # query 0 sees exactly the prefix
        assert 1 <= p <= n - 1
        for i in range(T):
            for j in range(T):
                expected = (j <= i or j < p) and j < n
                assert bool(mask[b, i, j]) == expected, (b, i, j)
        # Labels: aligned next tokens, ignored while the target still lies inside the prefix.
        expected_labels = [-100] * (p - 1) + x[p:].tolist() + [-100] * (T - n)
        assert labels[b].tolist() == expected_labels
        assert torch.equal(batch["input_ids"][b, :n], x[:-1])


def test_no_position_sees_the_token_it_predicts():
    _, batch = make_batch([12] * 16 + [5] * 16)
    mask, labels = batch["attention_mask"], batch["labels"]
    T = labels.size(1)
    future = torch.arange(T)[None, :] > torch.arange(T)[:, None]  # (T, T): key j > query i
    for b in range(labels.size(0)):
        rows = labels[b] != -100
        assert not (mask[b][rows] & future[rows]).any()
    assert mask.any(-1).all()  # no empty softmax row, padding queries included


def test_prefix_length_is_uniform_over_one_to_t_minus_one():
    _, batch = make_batch([11] * 2000)  # T = 10: P uniform on 1..9
    prefix = batch["attention_mask"][:, 0, :].sum(1)
    counts = torch.bincount(prefix, minlength=10)
    assert counts[0] == 0 and counts.sum() == 2000
    assert (counts[1:] > 2000 / 9 * 0.7).all()  # each value ~222 +- 14


def test_short_sequences_are_rejected():
    with pytest.raises(ValueError, match="at least 3 tokens"):
        PrefixLM(pad_token_id=0)([[5, 6]])
