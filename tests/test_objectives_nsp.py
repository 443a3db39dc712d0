"""NSP (BERT): pair layout, 50% IsNext, real successors vs other documents, joint MLM masking."""

import pytest
import torch

from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.nsp import IS_NEXT, NOT_NEXT, NextSentencePrediction

PAD, CLS, SEP, MASK = 0, 1, 2, 3


def sentence(doc: int, idx: int, n: int = 3) -> list[int]:
    """Tokens that encode (document, sentence index): 1000 + 100 * doc + 10 * idx + k."""
    return [1000 + 100 * doc + 10 * idx + k for k in range(n)]


def decode(token: int) -> tuple[int, int]:
    return (token - 1000) // 100, (token - 1000) % 100 // 10


def corpus(n_docs: int, n_sents: int = 5) -> list[list[list[int]]]:
    return [[sentence(d, s) for s in range(n_sents)] for d in range(n_docs)]


def test_layout_token_types_and_padding():
    nsp = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, seed=0)
    docs = [[sentence(0, 0, 2), sentence(0, 1, 4)], [sentence(1, 0, 1), sentence(1, 1, 1)]]
    batch = nsp(docs)
    for row, types, attn in zip(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]):
        n = int(attn.sum())
        assert row[n:].eq(PAD).all() and types[n:].eq(0).all()
        ids, types = row[:n].tolist(), types[:n].tolist()
        assert ids[0] == CLS and ids[-1] == SEP and ids.count(SEP) == 2
        first_sep = ids.index(SEP)
        assert types == [0] * (first_sep + 1) + [1] * (n - first_sep - 1)
    assert batch["next_sentence_label"].shape == (2,)


def test_half_of_the_pairs_are_next_and_they_really_are():
    nsp = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, seed=0)
    batch = nsp(corpus(2000))
    labels = batch["next_sentence_label"]
    assert abs(labels.float().mean().item() - 0.5) < 0.04  # sd ~ 0.011
    for d, (ids, label) in enumerate(zip(batch["input_ids"].tolist(), labels.tolist())):
        a_doc, a_idx = decode(ids[1])
        b_doc, b_idx = decode(ids[ids.index(SEP) + 1])
        assert a_doc == d
        if label == IS_NEXT:
            assert (b_doc, b_idx) == (d, a_idx + 1)
        else:
            assert label == NOT_NEXT and b_doc != d


def test_truncation_keeps_the_pair_within_max_length():
    nsp = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, max_length=12, seed=0)
    docs = [[sentence(d, s, 8) for s in range(3)] for d in range(4)]
    batch = nsp(docs)
    assert batch["input_ids"].shape == (4, 12)
    assert (batch["input_ids"] == SEP).sum(1).tolist() == [2, 2, 2, 2]


def test_joint_mlm_never_masks_the_framing():
    mlm = MaskedLM(vocab_size=2000, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                   mlm_probability=0.5, seed=1)
    nsp = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, mlm=mlm, seed=0)
    batch = nsp(corpus(50))
    # Both [SEP]s survive (random replacements never draw a special id), and no framing token is a target.
    assert (batch["input_ids"][:, 0] == CLS).all()
    assert ((batch["input_ids"] == SEP).sum(1) == 2).all()
    framing = torch.isin(batch["input_ids"], torch.tensor([CLS, SEP]))
    assert (batch["labels"][framing] == -100).all()
    assert (batch["labels"] != -100).any()


def test_whole_word_masking_of_the_pairs_keeps_words_whole():
    # Sentences of 6 pieces, two words of 3: pieces k = 1, 2, 4, 5 continue the word before them.
    docs = [[sentence(d, i, 6) for i in range(5)] for d in range(20)]
    cont = [t for doc in docs for sent in doc for t in sent if t % 10 in (1, 2, 4, 5)]
    mlm = MaskedLM(vocab_size=3000, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                   mlm_probability=0.3, whole_word=True, continuation_token_ids=cont, seed=1)
    batch = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, mlm=mlm, seed=0)(docs)
    selected = batch["labels"] != -100
    original = torch.where(selected, batch["labels"], batch["input_ids"])  # (B, T)
    word = torch.cumsum(~torch.isin(original, torch.tensor(cont)), 1)  # (B, T) a word = a start and its pieces
    assert selected.any()
    for b in range(len(word)):
        for w in word[b][selected[b]].unique():
            assert bool(selected[b][word[b] == w].all()), (b, int(w))
            assert int((word[b] == w).sum()) == 3  # a selected word is one of the sentences' 3-piece words


def test_invalid_inputs_are_rejected():
    nsp = NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD)
    with pytest.raises(ValueError, match="at least 2 documents"):
        nsp(corpus(1))
    with pytest.raises(ValueError, match="at least 2 sentences"):
        nsp([[sentence(0, 0)], [sentence(1, 0), sentence(1, 1)]])
    plain_mlm = MaskedLM(vocab_size=2000, mask_token_id=MASK, pad_token_id=PAD)
    with pytest.raises(ValueError, match="cls_token_id and sep_token_id"):
        NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, mlm=plain_mlm)
