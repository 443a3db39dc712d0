"""MLM (BERT / whole-word / SpanBERT): selection and replacement rates, special tokens, word and span structure."""

import math

import pytest
import torch

from lmforge.objectives.mlm import MaskedLM, add_cls_sep, truncated_geometric

PAD, CLS, SEP, MASK, UNK = 0, 1, 2, 3, 4
SPECIALS = [PAD, CLS, SEP, MASK, UNK]
V = 1000


def make_mlm(**kw):
    kw = {"vocab_size": V, "mask_token_id": MASK, "pad_token_id": PAD, "special_token_ids": [UNK],
          "cls_token_id": CLS, "sep_token_id": SEP, "seed": 0, **kw}
    return MaskedLM(**kw)


def runs(flags: torch.Tensor) -> list[tuple[int, int]]:
    """(start, length) of each run of True in a 1-D bool tensor."""
    out, start = [], None
    for i, f in enumerate(flags.tolist() + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i - start))
            start = None
    return out


def test_rates_on_one_million_tokens():
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(5, V, (1000, 1000), generator=g)  # 1M tokens
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[:, 500] = UNK  # a special token inside the text
    batch = make_mlm()(list(ids))
    inp, labels = batch["input_ids"], batch["labels"]

    special = torch.isin(ids, torch.tensor(SPECIALS))
    selected = labels != -100
    assert not (selected & special).any()
    assert torch.equal(inp[special], ids[special])
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inp[~selected], ids[~selected])  # only selected tokens change

    n_sel = selected.sum().item()
    assert abs(n_sel / (~special).sum().item() - 0.15) < 0.002  # sd ~ 0.00036
    masked = (inp == MASK) & selected
    changed = (inp != MASK) & (inp != ids) & selected
    unchanged = (inp == ids) & selected
    assert abs(masked.sum().item() / n_sel - 0.8) < 0.006  # sd ~ 0.001
    # A random draw equals the original with probability 1/995, which the unchanged share absorbs.
    assert abs(changed.sum().item() / n_sel - 0.1) < 0.005
    assert abs(unchanged.sum().item() / n_sel - 0.1) < 0.005

    # Random replacements: uniform over the non-special vocabulary (chi-square, 994 dof, sd ~ 44.6).
    drawn = inp[changed]
    assert not torch.isin(drawn, torch.tensor(SPECIALS)).any()
    counts = torch.bincount(drawn, minlength=V)[5:].double()
    expected = counts.sum() / len(counts)
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 994 + 6 * 44.6


def test_padding_is_never_selected():
    mlm = make_mlm(mlm_probability=1.0, mask_prob=1.0, random_prob=0.0, add_cls_sep=True)
    batch = mlm([[10, 11, 12, 13, 14], [15]])
    assert batch["input_ids"].tolist() == [[CLS] + [MASK] * 5 + [SEP], [CLS, MASK, SEP, PAD, PAD, PAD, PAD]]
    assert batch["labels"].tolist() == [[-100, 10, 11, 12, 13, 14, -100], [-100, 15] + [-100] * 5]
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]


def test_add_cls_sep_frames_the_example():
    assert add_cls_sep([7, 8], CLS, SEP).tolist() == [CLS, 7, 8, SEP]
    with pytest.raises(ValueError, match="cls_token_id"):
        MaskedLM(vocab_size=V, mask_token_id=MASK, pad_token_id=PAD, add_cls_sep=True)


def random_words(n_words: int, g: torch.Generator, continuation: range) -> tuple[list[int], list[int]]:
    """Token ids of n_words words of 1-4 pieces, and the word index of each token."""
    ids, word_of = [], []
    for w in range(n_words):
        n_pieces = int(torch.randint(1, 5, (), generator=g))
        ids.append(int(torch.randint(5, continuation.start, (), generator=g)))
        ids += torch.randint(continuation.start, continuation.stop, (n_pieces - 1,), generator=g).tolist()
        word_of += [w] * n_pieces
    return ids, word_of


@pytest.mark.parametrize("span_masking", [False, True])
def test_whole_word_masking_masks_all_pieces_or_none(span_masking):
    continuation = range(500, V)  # e.g. the '##' pieces of a WordPiece vocabulary
    g = torch.Generator().manual_seed(0)
    examples = [random_words(300, g, continuation) for _ in range(20)]
    mlm = make_mlm(continuation_token_ids=continuation, whole_word=not span_masking, span_masking=span_masking,
                   add_cls_sep=True)
    labels = mlm([ids for ids, _ in examples])["labels"][:, 1:]  # drop [CLS]
    n_words = n_selected = 0
    for (ids, word_of), lab in zip(examples, labels):
        word_of = torch.tensor(word_of)
        sel = lab[: len(ids)] != -100
        per_word = torch.zeros(300, dtype=torch.float64).index_add_(0, word_of, sel.double())
        size = torch.bincount(word_of, minlength=300).double()
        assert torch.all((per_word == 0) | (per_word == size)), "a word was partially masked"
        n_words += 300
        n_selected += int((per_word > 0).sum())
    assert abs(n_selected / n_words - 0.15) < 0.02  # 15% of words (6000 words, sd ~ 0.005)


def test_span_masking_follows_spanbert():
    mlm = make_mlm(span_masking=True, add_cls_sep=True)
    g = torch.Generator().manual_seed(1)
    batch = mlm(list(torch.randint(5, V, (20, 5000), generator=g)))
    inp, labels = batch["input_ids"], batch["labels"]
    lengths, decisions = [], {"mask": 0, "other": 0}
    for row_inp, row_lab in zip(inp, labels):
        sel = row_lab != -100
        assert int(sel.sum()) == round(0.15 * 5000)  # exact per-sequence budget
        for start, n in runs(sel):
            lengths.append(n)
            masked = row_inp[start : start + n] == MASK
            # 80/10/10 is decided once per span: a span is all [MASK] or has no [MASK] at all.
            assert masked.all() or not masked.any()
            decisions["mask" if masked.all() else "other"] += 1
    lengths = torch.tensor(lengths, dtype=torch.float64)
    assert lengths.max() <= 10
    ell = torch.arange(1, 11, dtype=torch.float64)
    clipped_mean = float((ell * 0.2 * 0.8 ** (ell - 1)).sum() / (0.2 * 0.8 ** (ell - 1)).sum())
    assert math.isclose(clipped_mean, 3.797, abs_tol=1e-3)  # SpanBERT reports a mean of 3.8
    # ~3950 spans, sd of a length ~2.5 -> standard error ~0.04; the budget cut shortens one span per row.
    assert abs(lengths.mean().item() - clipped_mean) < 0.2
    # The length distribution itself: P(len = 1) = 0.2 / (1 - 0.8^10) = 0.224.
    assert abs((lengths == 1).double().mean().item() - float(truncated_geometric(0.2, 10)[0])) < 0.03
    assert abs(decisions["mask"] / sum(decisions.values()) - 0.8) < 0.05
