"""Whole-word and SpanBERT masking from the command line: ``--objective-option whole_word=true`` and
``span_masking=true`` group the pieces of real tokenizer output into words, in every vocabulary kind.

A word here is what the tokenizer's own pre-tokenizer calls one (``Encoding.word_ids``): masking may group
more than that (byte-level BPE keeps ``world.`` together) but must never split it.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as Backend

from lmforge import datasets
from lmforge.config import ConfigError
from lmforge.objectives import MaskedLM
from lmforge.tokenization import Tokenizer, train_tokenizer
from lmforge.training.pretrain import build_pretraining, objective_kwargs
from test_training_pretrain import data_root, prepared  # noqa: F401
from test_training_resume import assert_same_weights, config, curve, weights

# kind -> family; small vocabularies, so that many words are cut into several pieces.
KINDS = {"wordpiece": "bert", "byte-bpe": "roberta", "bpe": "roberta", "unigram": "bart"}  # families with [MASK]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ww") / "austen.txt"
    path.write_text(gzip.decompress(datasets.path("corpus").read_bytes()).decode("utf-8")[:60_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizers(text) -> dict[str, Tokenizer]:
    return {kind: train_tokenizer([text], kind=kind, family=family, vocab_size=400, show_progress=False)
            for kind, family in KINDS.items()}


def encoded(tok: Tokenizer, text: Path, n: int = 60) -> list[tuple[list[int], list[int]]]:
    """(ids, word index per id) of ``n`` lines of real text; tokens with no word (none here) get -1."""
    lines = [line for line in text.read_text().splitlines() if len(line.split()) >= 8][:n]
    out = []
    for line in lines:
        enc = tok.backend.encode(line, add_special_tokens=False)
        out.append((enc.ids, [-1 if w is None else w for w in enc.word_ids]))
    return out


def mlm_from_cli_options(tok: Tokenizer, **options) -> MaskedLM:
    """The objective `lmforge pretrain --objective mlm --objective-option ...` builds for this tokenizer."""
    return MaskedLM(**objective_kwargs("mlm", tok, 0, options))


def split_words(mlm: MaskedLM, examples) -> tuple[int, int, int]:
    """(words partly selected, words selected, words of two or more pieces) over the examples."""
    batch = mlm([ids for ids, _ in examples])
    offset = 1 if mlm.add_cls_sep else 0
    partial = selected = multi = 0
    for (ids, word_of), labels in zip(examples, batch["labels"]):
        chosen = (labels[offset:offset + len(ids)] != -100).tolist()
        for w in set(word_of):
            flags = [c for c, v in zip(chosen, word_of) if v == w]
            multi += len(flags) > 1
            partial += 0 < sum(flags) < len(flags)
            selected += all(flags)
    return partial, selected, multi


@pytest.mark.parametrize("kind", list(KINDS))
def test_continuation_ids_follow_the_vocabularys_word_marks(kind, tokenizers):
    tok = tokenizers[kind]
    cont = set(tok.continuation_ids())
    assert tok.continuation_ids() is tok.continuation_ids()  # computed once
    specials = {v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")}
    specials |= set(tok.special_token_ids().get("sentinel_token_ids", []))
    assert not cont & specials
    for idx in range(tok.vocab_size):
        piece = tok.id_to_token(idx)
        if idx in specials:
            continue
        starts = {"wordpiece": not piece.startswith("##"), "bpe": piece.startswith("▁"),
                  "unigram": piece.startswith("▁"), "byte-bpe": piece[0] in "ĠĊĉčċČ"}[kind]
        assert (idx not in cont) == starts, piece


@pytest.mark.parametrize("kind", list(KINDS))
def test_whole_word_masking_never_splits_a_word(kind, tokenizers, text):
    tok = tokenizers[kind]
    examples = encoded(tok, text)
    partial, selected, multi = split_words(mlm_from_cli_options(tok, whole_word=True, mlm_probability=0.3), examples)
    assert multi > 50 and selected > 50  # many multi-piece words, many selected: the check has teeth
    assert partial == 0
    # Without whole_word (the default, even though the tokenizer's boundaries are passed) words do get split.
    assert split_words(mlm_from_cli_options(tok, mlm_probability=0.3), examples)[0] > 0


@pytest.mark.parametrize("kind", ["wordpiece", "byte-bpe"])
def test_span_masking_spans_cover_whole_words(kind, tokenizers, text):
    tok = tokenizers[kind]
    examples = encoded(tok, text)
    mlm = mlm_from_cli_options(tok, span_masking=True)
    partial, selected, _ = split_words(mlm, examples)
    assert partial == 0 and selected > 20
    # The budget is counted in words: each example selects round(15% of its words), in the objective's grouping.
    batch = mlm([ids for ids, _ in examples])
    cont = set(tok.continuation_ids())
    for (ids, _), labels in zip(examples, batch["labels"]):
        chosen = (labels[1:1 + len(ids)] != -100).tolist()
        starts = [i == 0 or t not in cont for i, t in enumerate(ids)]  # [CLS] / <s> precedes position 0
        n_words = sum(starts)
        assert sum(c for c, s in zip(chosen, starts) if s) == round(0.15 * n_words)
    # Sub-word spans without boundaries (the old CLI behaviour) would split words.
    no_words = MaskedLM(**{**objective_kwargs("mlm", tok, 0, {"span_masking": True}),
                           "continuation_token_ids": None})
    assert split_words(no_words, examples)[0] > 0


def test_word_after_a_special_token_starts_a_word():
    # Byte-level BPE spells a text's first word without its space mark: it must not join [CLS]'s "word".
    mlm = MaskedLM(vocab_size=50, mask_token_id=3, pad_token_id=0, cls_token_id=1, sep_token_id=2,
                   continuation_token_ids=[20, 21], whole_word=True, mlm_probability=1.0, mask_prob=1.0,
                   random_prob=0.0, add_cls_sep=True)
    batch = mlm([[20, 21, 10, 21]])  # words: (20 21) (10 21)
    assert batch["labels"].tolist() == [[-100, 20, 21, 10, 21, -100]]
    word_id, _ = mlm._words(torch.tensor([[1, 20, 21, 10, 21, 2]]),
                                     torch.tensor([[False, True, True, True, True, False]]))
    assert word_id.tolist() == [[0, 1, 1, 2, 2, 3]]


def test_whole_word_without_word_boundaries_is_refused(tokenizers):
    tok = tokenizers["wordpiece"]
    foreign = Tokenizer(Backend.from_str(tok.backend.to_str()), family="bert", kind=None,
                        roles={"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"})
    assert foreign.continuation_ids() is None
    with pytest.raises(ConfigError, match="whole_word=true needs word boundaries"):
        mlm_from_cli_options(foreign, whole_word=True)
    mlm_from_cli_options(foreign, span_masking=True)  # token spans: still possible


@pytest.mark.parametrize("options", [{"whole_word": True}, {"span_masking": True}])
def test_stop_and_resume_with_word_masking_is_exact(options, data_root, tmp_path):
    data = prepared(data_root, "bert")

    def run(name: str, **settings):
        return build_pretraining(config("mlm", data, tmp_path / name, objective_options=options, **settings)).trainer

    reference = run("ref")
    assert reference.objective.continuation_token_ids is not None  # the CLI path passed word boundaries
    reference.fit()
    assert run("run").fit(steps=3).step == 3
    assert run("run", resume=True).fit().step == 6
    assert curve(tmp_path / "run") == curve(tmp_path / "ref")
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))
