"""BART noise functions, each against its defining property, and the collator's decoder contract."""

import itertools
import math

import pytest
import torch

from lmforge.objectives.base import shift_right
from lmforge.objectives.denoising import (
    BartDenoising,
    document_rotation,
    sentence_permutation,
    text_infilling,
    token_deletion,
    token_masking,
)

BOS, PAD, EOS, MASK, STOP = 0, 1, 2, 3, 4


def is_subsequence(small: list, big: list) -> bool:
    it = iter(big)
    return all(t in it for t in small)


def test_token_masking_only_replaces_with_mask():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(10, 20010)
    y = token_masking(x, 0.3, MASK, g)
    assert y.shape == x.shape
    changed = y != x
    assert (y[changed] == MASK).all()
    assert abs(changed.double().mean().item() - 0.3) < 0.015


def test_token_deletion_only_removes_tokens():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(10, 20010)
    y = token_deletion(x, 0.3, g)
    assert is_subsequence(y.tolist(), x.tolist()) and len(set(y.tolist())) == len(y)
    assert abs(1 - len(y) / len(x) - 0.3) < 0.015


def test_text_infilling_replaces_poisson_spans_with_single_masks():
    g = torch.Generator().manual_seed(0)
    lengths, n_masks, n_spans_with_tokens = [], 0, 0
    for _ in range(40):
        x = torch.arange(10, 1010)  # distinct tokens, so the alignment is unique
        y = text_infilling(x, 0.3, MASK, g, poisson_lambda=3.0).tolist()
        kept = [t for t in y if t != MASK]
        assert is_subsequence(kept, x.tolist())  # un-masked tokens keep their order
        assert len(x) - len(kept) == round(0.3 * len(x))  # exactly the budget is removed
        n_masks += y.count(MASK)
        # Removed tokens between consecutive kept tokens (document ends included) form contiguous gaps.
        bounds = [9] + kept + [1010]
        n_spans_with_tokens += sum(b - a > 1 for a, b in zip(bounds, bounds[1:]))
        # Masks with a kept token (or the document edge) on both sides stand for exactly one span.
        padded = [9] + y + [1010]
        for i in range(1, len(padded) - 1):
            if padded[i] == MASK and padded[i - 1] != MASK and padded[i + 1] != MASK:
                lengths.append(padded[i + 1] - padded[i - 1] - 1)
    lengths = torch.tensor(lengths, dtype=torch.float64)
    # 0-length spans insert a <mask> where nothing was removed, so masks outnumber the removed stretches.
    assert n_masks > n_spans_with_tokens
    assert abs((lengths == 0).double().mean().item() - math.exp(-3)) < 0.02  # P(0) = e^-3 = 0.050
    assert abs(lengths.mean().item() - 3.0) < 0.2  # ~3000 isolated spans, sd sqrt(3) -> standard error ~0.03
    assert abs(n_masks / (40 * 300) - 1 / 3) < 0.02  # one mask per span, mean span length lambda = 3


def test_sentence_permutation_preserves_the_multiset_of_sentences():
    g = torch.Generator().manual_seed(0)
    doc = [10, 11, STOP, 12, STOP, 13, 14, 15, STOP, 16, STOP, 17, 18, STOP]
    sentences = sorted(tuple(s) for s in [[10, 11, STOP], [12, STOP], [13, 14, 15, STOP], [16, STOP], [17, 18, STOP]])
    orders = set()
    for _ in range(50):
        y = sentence_permutation(torch.tensor(doc), g, sentence_end_ids=[STOP]).tolist()
        split, current = [], []
        for t in y:
            current.append(t)
            if t == STOP:
                split.append(tuple(current))
                current = []
        assert sorted(split) == sentences and not current
        orders.add(tuple(split))
    assert len(orders) > 10  # 120 possible orders: it really shuffles


def test_sentence_permutation_with_given_boundaries():
    g = torch.Generator().manual_seed(0)
    blocks = [[10, 11, 12], [13, 14], [15]]
    allowed = {tuple(itertools.chain(*p)) for p in itertools.permutations(blocks)}
    seen = {tuple(sentence_permutation(torch.arange(10, 16), g, sentence_lengths=[3, 2, 1]).tolist())
            for _ in range(60)}
    assert seen == allowed
    with pytest.raises(ValueError, match="sum to"):
        sentence_permutation(torch.arange(10, 16), g, sentence_lengths=[3, 2])


def test_document_rotation_is_a_rotation():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(10, 30)
    starts = []
    for _ in range(400):
        y = document_rotation(x, g)
        k = int(y[0]) - 10
        assert torch.equal(y, torch.cat([x[k:], x[:k]]))
        starts.append(k)
    assert torch.bincount(torch.tensor(starts), minlength=20).min() > 5  # every start token occurs (~20 each)


def test_collator_reconstructs_the_original_document():
    bart = BartDenoising(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS,
                         sentence_end_ids=[STOP], mask_prob=0.1, delete_prob=0.1, rotate_prob=0.5, seed=0)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(10, 100, (n,), generator=g) for n in (40, 25, 60)]
    docs[0][[9, 19, 29]] = STOP
    examples = [docs[0], docs[1].tolist(), [docs[2][:30].tolist(), docs[2][30:].tolist()]]  # flat, list, sentences
    batch = bart(examples)
    for x, inp, attn, lab in zip(docs, batch["input_ids"], batch["attention_mask"], batch["labels"]):
        assert lab[lab != -100].tolist() == [BOS] + x.tolist() + [EOS]
        source = inp[attn.bool()].tolist()
        assert source[0] == BOS and source[-1] == EOS
        # Noise only masks, drops, moves: every surviving token comes from the document.
        body = torch.tensor([t for t in source[1:-1] if t != MASK], dtype=torch.long)
        assert (torch.bincount(body, minlength=100) <= torch.bincount(x, minlength=100)).all()
    assert torch.equal(batch["decoder_input_ids"], shift_right(batch["labels"], EOS, PAD))
    assert (batch["decoder_input_ids"][:, 0] == EOS).all()  # BART starts decoding from </s>
    assert torch.equal(batch["decoder_attention_mask"].bool(), batch["labels"] != -100)


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="infill_ratio"):
        BartDenoising(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, infill_ratio=1.5)
    with pytest.raises(ValueError, match="poisson_lambda"):
        BartDenoising(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, poisson_lambda=0)
