"""mlm+nsp batches and RoBERTa's four input formats, checked on hand-made examples: the pair layout, 50%
IsNext over 10k pairs, segment vs sentence pairs, FULL-SENTENCES packing, sentence-aligned document segments
(DOC-SENTENCES), and one-line refusals of formats that do not fit the objective."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from lmforge.config import ConfigError
from lmforge.data.loader import sentence_segments
from lmforge.objectives import MaskedLM, MaskedLMAndNSP, build_objective
from lmforge.objectives.input_formats import FullSentences, check_format, pack_full_sentences
from lmforge.objectives.nsp import IS_NEXT, NOT_NEXT

PAD, CLS, SEP, MASK, END = 0, 1, 2, 3, 9  # END closes a sentence


def bert(**kw) -> MaskedLMAndNSP:
    options = dict(vocab_size=100, mask_token_id=MASK, cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD,
                   sentence_end_ids=[END], mlm_probability=0.0, seed=0)
    return MaskedLMAndNSP(**{**options, **kw})


def test_mlm_nsp_batch_layout_by_hand():
    # Two documents of two sentences each: segment-pair must split them after the first sentence.
    docs = [[10, 11, END, 12, END], [20, END, 21, 22, END]]
    batch = bert(next_prob=1.0)(docs)  # always IsNext
    assert batch["input_ids"].tolist() == [[CLS, 10, 11, END, SEP, 12, END, SEP],
                                           [CLS, 20, END, SEP, 21, 22, END, SEP]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1] * 8, [1] * 8]
    assert batch["labels"].eq(-100).all()  # mlm_probability=0: nothing to predict
    assert batch["next_sentence_label"].tolist() == [IS_NEXT, IS_NEXT]

    batch = bert(next_prob=0.0)(docs)  # always NotNext: B is a run of the other document's sentences
    first, second = batch["input_ids"].tolist()
    assert first[:5] == [CLS, 10, 11, END, SEP] and first[5:-1] in ([20, END], [21, 22, END])
    assert second[:4] == [CLS, 20, END, SEP] and second[4:second.index(SEP, 4)] in ([10, 11, END], [12, END])
    assert batch["next_sentence_label"].tolist() == [NOT_NEXT, NOT_NEXT]
    assert batch["attention_mask"][0].sum() == len(first) - first.count(PAD)

    # With masking: only text is a target, the framing and token types are untouched.
    masked = bert(mlm_probability=0.5, seed=3)(docs)
    plain = bert(seed=3)(docs)  # same pairs (the MLM has its own generator)
    targets = masked["labels"] != -100
    assert targets.any()
    assert torch.equal(masked["labels"][targets], plain["input_ids"][targets])
    assert torch.equal(masked["input_ids"][~targets], plain["input_ids"][~targets])
    framing = torch.isin(plain["input_ids"], torch.tensor([CLS, SEP, PAD]))
    assert not targets[framing].any()
    assert torch.equal(masked["token_type_ids"], plain["token_type_ids"])


def corpus(n_docs: int, n_sents: int = 5, seed: int = 0) -> list[list[int]]:
    """Flat documents; token 1000 + 100 * doc + 10 * sentence + k, each sentence closed by END."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for d in range(n_docs):
        doc = []
        for s in range(n_sents):
            doc += [1000 + 100 * (d % 90) + 10 * s + k for k in range(int(torch.randint(1, 4, (), generator=g)))]
            doc.append(END)
        docs.append(doc)
    return docs


@pytest.mark.parametrize("fmt", ["segment-pair", "sentence-pair"])
def test_half_of_10k_pairs_are_next(fmt):
    objective = bert(format=fmt, vocab_size=10_000, seed=5)
    labels = torch.cat([objective(corpus(100, seed=b))["next_sentence_label"] for b in range(100)])  # 10k pairs
    assert len(labels) == 10_000
    assert abs(labels.float().mean().item() - 0.5) <= 0.02  # sd 0.005


def sentences_of(doc: list[int]) -> list[list[int]]:
    out, cur = [], []
    for t in doc:
        cur.append(t)
        if t == END:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def pair(row: list[int]) -> tuple[list[int], list[int]]:
    first = row.index(SEP)
    return row[1:first], row[first + 1:row.index(SEP, first + 1)]


def test_segment_pair_splits_a_document_at_a_sentence_end():
    docs = corpus(40, n_sents=6)
    batch = bert(vocab_size=10_000, seed=1)(docs)
    for d, (row, label) in enumerate(zip(batch["input_ids"].tolist(), batch["next_sentence_label"].tolist())):
        a, b = pair(row)
        sentences = sentences_of(docs[d])
        assert a[-1] == END and docs[d][:len(a)] == a  # A: the first k sentences (k >= 1)
        if label == IS_NEXT:
            assert a + b == docs[d] and b  # B: the rest of the document
        else:  # B: consecutive sentences of another document, from a random one on
            other = next(i for i, doc in enumerate(docs) if i != d and " ".join(map(str, b)) in " ".join(map(str, doc)))
            assert sentences_of(b)[0] in sentences_of(docs[other])
            assert len(sentences_of(b)) >= 1 and not set(b) & set(t for s in sentences for t in s if t != END)


def test_sentence_pair_uses_one_sentence_each():
    docs = corpus(40, n_sents=6)
    batch = bert(vocab_size=10_000, format="sentence-pair", seed=1)(docs)
    for d, (row, label) in enumerate(zip(batch["input_ids"].tolist(), batch["next_sentence_label"].tolist())):
        a, b = pair(row)
        sentences = sentences_of(docs[d])
        assert a in sentences and len(sentences_of(b)) == 1
        if label == IS_NEXT:
            assert sentences.index(b) == sentences.index(a) + 1
        else:
            assert b not in sentences


def test_single_sentence_documents_and_truncation():
    # One sentence: cut in two at a random token, so an IsNext pair still exists; one token: always NotNext.
    batch = bert(next_prob=1.0)([[10, 11, 12, 13], [20], [30, 31, END]])
    rows = batch["input_ids"].tolist()
    a, b = pair(rows[0])
    assert a + b == [10, 11, 12, 13] and a and b
    assert rows[1][:3] == [CLS, 20, SEP]
    assert batch["next_sentence_label"].tolist() == [IS_NEXT, NOT_NEXT, IS_NEXT]
    long = bert(max_length=8)(corpus(4, n_sents=6))
    assert long["input_ids"].shape[1] <= 8 and ((long["input_ids"] == SEP).sum(1) == 2).all()


def test_full_sentences_pack_across_documents_with_an_extra_separator():
    segments = [[5, END, 6, 6, END], [7, END], [8, 8, 8, END, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    rows = [r.tolist() for r in pack_full_sentences(segments, [END], separator_id=SEP, max_length=8)]
    assert rows == [[5, END, 6, 6, END, SEP, 7, END],  # documents 0 and 1, separated
                    [8, 8, 8, END, 4],  # document 2 does not fit after them (needs 1 + 5 more)
                    [1, 2, 3, 4, 5, 6, 7, 8],  # a sentence longer than a row is cut ...
                    [9, 10]]  # ... and continues in the next row
    mlm = MaskedLM(vocab_size=100, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                   add_cls_sep=True, mlm_probability=0.0)
    batch = FullSentences(mlm, sentence_end_ids=[END], separator_id=SEP, max_length=8)(segments[:3])
    assert batch["input_ids"].tolist() == [[CLS, 5, END, 6, 6, END, SEP, 7, END, SEP],
                                           [CLS, 8, 8, 8, END, 4, SEP, PAD, PAD, PAD]]
    mlm.generator.manual_seed(4)
    state = FullSentences(mlm, sentence_end_ids=[END], separator_id=SEP, max_length=8).state_dict()
    assert torch.equal(state["generator"], mlm.generator.get_state())  # the state is the MLM's


def test_doc_sentences_segments_end_at_sentence_ends_within_documents():
    # Two documents: [5 E 6 6 E 7 7 7 7 7 7 E] and [8 E]; at most 5 tokens a segment.
    tokens = np.array([5, END, 6, 6, END, 7, 7, 7, 7, 7, 7, END, 8, END])
    offsets = np.array([0, 12, 14])
    start, length = sentence_segments(tokens, offsets, max_len=5, end_ids=[END])
    pieces = [tokens[s:s + n].tolist() for s, n in zip(start, length)]
    assert pieces == [[5, END, 6, 6, END], [7, 7, 7, 7, 7], [7, END], [8, END]]  # the long sentence is cut at 5


def test_doc_sentences_dataset_covers_every_document(tmp_path):
    from lmforge.data.loader import DocumentDataset
    from lmforge.data.prepare import prepare
    from lmforge.tokenization import train_tokenizer
    text = "".join(f"Story {i} starts. It goes on for a while, then more! Does it end? Yes.\n\n" for i in range(60))
    (tmp_path / "c.txt").write_text(text)
    tok = train_tokenizer([tmp_path / "c.txt"], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
    prepare([tmp_path / "c.txt"], tok, tmp_path / "data", progress=False)
    ends = tok.sentence_end_ids()
    plain = DocumentDataset(tmp_path / "data", max_len=12, batch_size=4, shuffle=False)
    aligned = DocumentDataset(tmp_path / "data", max_len=12, batch_size=4, shuffle=False, sentence_end_ids=ends)
    first = [x.tolist() for x in aligned.get_batch(0, 0)]
    doc = tok.encode("Story 0 starts. It goes on for a while, then more! Does it end? Yes.", add_special_tokens=False)
    covered = []
    for segment in first:
        assert len(segment) <= 12 and segment[-1] in ends  # whole sentences only
        covered += segment
        if len(covered) == len(doc):
            break
    assert covered == doc
    assert [x.tolist() for x in plain.get_batch(0, 0)][0] == doc[:12]  # plain mlm still cuts every 12 tokens
    assert aligned.state_dict()["sentence_end_ids"] == sorted(ends) and "sentence_end_ids" not in plain.state_dict()


def test_formats_that_do_not_fit_are_refused_in_one_line():
    assert check_format("mlm", "full-sentences") == "full-sentences"
    assert check_format("mlm+nsp", "sentence-pair") == "sentence-pair" and check_format("mlm", None) is None
    cases = [("mlm", "segment-pair", "format='segment-pair' trains NSP: use it with --objective mlm+nsp; "
                                     "--objective mlm takes format=full-sentences|doc-sentences"),
             ("mlm+nsp", "doc-sentences", "format='doc-sentences' has no NSP: use it with --objective mlm; "
                                          "--objective mlm+nsp takes format=segment-pair|sentence-pair"),
             ("clm", "full-sentences", "--objective clm takes no format"),
             ("mlm", "paragraphs", "unknown format='paragraphs'; choose one of "
                                   "segment-pair|sentence-pair|full-sentences|doc-sentences")]
    for objective, value, message in cases:
        with pytest.raises(ConfigError) as info:
            check_format(objective, value)
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="not an NSP input format"):
        bert(format="full-sentences")


def test_mlm_nsp_takes_every_masked_lm_option():
    params = inspect.signature(MaskedLMAndNSP).parameters
    assert {"mlm_probability", "span_masking", "special_token_ids", "format", "sentence_end_ids"} <= set(params)
    assert "add_cls_sep" not in params and "mlm" not in params
    objective = build_objective("mlm+nsp", vocab_size=100, mask_token_id=MASK, cls_token_id=CLS, sep_token_id=SEP,
                                pad_token_id=PAD, sentence_end_ids=[END], mlm_probability=0.4)
    assert objective.mlm.mlm_probability == 0.4 and objective.format == "segment-pair"
