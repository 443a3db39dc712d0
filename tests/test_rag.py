"""Retrieval-augmented generation: the prompt is the template filled with the index's own top-k, and an index is
only read with the encoder that built it."""

from __future__ import annotations

import json

import pytest
import torch
from embedding_helpers import model, model_folder, sentences

import lmforge
from lmforge.cli.main import main
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.index import VectorIndex
from lmforge.errors import UserInputError
from lmforge.tokenization import Tokenizer
from lmforge.prompting.rag import DEFAULT_TEMPLATE, Passage, build_prompt, check_template, open_retriever

DOCS = sentences(30, seed=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rag")
    encoder = model_folder(root)
    tok = Tokenizer.load(encoder)
    other = model(tok)  # the same shapes (so the vectors have the same width) but other weights
    with torch.no_grad():
        next(other.parameters()).add_(0.5)
    other_folder = lmforge.save(other, root / "other-encoder", tokenizer=tok)
    (root / "gpt").mkdir()
    generator = model_folder(root / "gpt", family="gpt")
    (root / "docs.txt").write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    assert main(["index", "build", "--model", str(encoder), "--docs", str(root / "docs.txt"), "--out",
                 str(root / "idx"), "--quiet"]) == 0
    return {"root": root, "encoder": encoder, "other": other_folder, "generator": generator, "index": root / "idx"}


def test_build_prompt_numbers_the_passages_best_first():
    passages = [Passage(4, 0.9, "a {b}"), Passage(1, 0.2, "c")]
    assert build_prompt("q?", passages) == "Passages:\n[1] a {b}\n[2] c\n\nQuestion: q?\nAnswer:"
    assert build_prompt("q?", passages, "{question} => {passages}") == "q? => [1] a {b}\n[2] c"
    with pytest.raises(UserInputError, match="question"):
        check_template("{passages} only")


def test_prompt_holds_the_indexs_own_top_k(setup, capsys):
    question = DOCS[7] + " river"
    retriever = open_retriever(setup["index"])
    prompts, passages = retriever.prompts([question], 3)
    # the index's own search, by the command line and by hand
    assert main(["index", "search", "--index", str(setup["index"]), "--query", question, "-k", "3", "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p.id for p in passages[0]] == [h["id"] for h in hits]
    encoder = SentenceEncoder.load(setup["encoder"])
    index = VectorIndex.load(setup["index"])
    own = index.search(encoder.encode([question], pooling=index.meta["pooling"]), 3)[0]
    assert [p.id for p in passages[0]] == [i for i, _, _ in own]
    assert [p.score for p in passages[0]] == pytest.approx([s for _, _, s in own], abs=1e-5)
    by_hand = "Passages:\n" + "\n".join(f"[{r}] {DOCS[i]}" for r, (i, _, _) in enumerate(own, 1)) \
        + f"\n\nQuestion: {question}\nAnswer:"
    assert prompts == [by_hand]


def test_generate_reports_the_passages_it_used(setup, capsys):
    shortest = min(range(len(DOCS)), key=lambda i: len(DOCS[i]))  # the tiny generator reads 64 positions
    question = DOCS[shortest]
    ids = [p.id for p in open_retriever(setup["index"]).retrieve([question], 2)[0]]
    assert main(["generate", "--model", str(setup["generator"]), "--prompt", question, "--index",
                 str(setup["index"]), "-k", "2", "--rag-template", "{passages}\\n{question}", "--max-new-tokens",
                 "1", "--no-stream"]) == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "passages" in line)
    assert [int(part.split()[0]) for part in line.split("passages ", 1)[1].split(" from ")[0].split(", ")] == ids
    assert ids[0] == shortest  # a document is its own nearest neighbour


def test_another_encoder_is_refused_naming_both(setup, capsys):
    with pytest.raises(UserInputError) as info:
        open_retriever(setup["index"], setup["other"])
    message = str(info.value)
    assert str(setup["encoder"].resolve()) in message and str(setup["other"].resolve()) in message
    assert main(["generate", "--model", str(setup["generator"]), "--prompt", "x", "--index", str(setup["index"]),
                 "--rag-model", str(setup["other"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "other-encoder" in err and "bert-model" in err
    # the same encoder named explicitly is fine
    assert open_retriever(setup["index"], setup["encoder"]).retrieve(["cat"], 1)[0][0].id >= 0


def test_an_index_whose_encoder_folder_was_rewritten_is_refused(setup, tmp_path):
    meta = json.loads((setup["index"] / "index.json").read_text())
    moved = tmp_path / "idx"
    VectorIndex(VectorIndex.load(setup["index"]).vectors, DOCS, {**meta, "weights_sha256": "0" * 64}).save(moved)
    with pytest.raises(UserInputError, match="was built with encoder"):
        open_retriever(moved)


@pytest.mark.parametrize("extra, words", [
    (["--index", "{root}/nope"], "no such folder"),
    (["-k", "2"], "-k needs --index"),
    (["--index", "{index}", "--rag-template", "{passages} only"], "{question}"),
    (["--index", "{index}", "-k", "0"], "at least 1"),
])
def test_bad_retrieval_flags_are_one_line(setup, capsys, extra, words):
    extra = [e.replace("{root}", str(setup["root"])).replace("{index}", str(setup["index"])) for e in extra]
    assert main(["generate", "--model", str(setup["generator"]), "--prompt", "x", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_default_template_has_both_slots():
    assert check_template(DEFAULT_TEMPLATE) == DEFAULT_TEMPLATE


def test_prompt_generate_puts_each_querys_passages_before_its_few_shot_prompt(setup, tmp_path, monkeypatch):
    from lmforge.prompting import generative

    rows = [{"text": DOCS[i], "target": "x"} for i in (1, 5)]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    seen = []
    monkeypatch.setattr(generative, "answers", lambda model, tok, prompts, **_: seen.extend(prompts) or
                        ["x"] * len(prompts))
    result = generative.run_few_shot({"model": [str(setup["generator"])], "data": str(tmp_path / "q.jsonl"),
                                      "pool": str(tmp_path / "q.jsonl"), "template": "Q: {x}\\nA:",
                                      "metric": "exact_match", "shots": [0], "index": str(setup["index"]), "k": 2})
    own = open_retriever(setup["index"]).retrieve([r["text"] for r in rows], 2)
    assert [[i for i, _ in hits] for hits in result["retrieval"]["passages"]] == [[p.id for p in h] for h in own]
    assert seen == ["\n".join(f"[{r}] {DOCS[p.id]}" for r, p in enumerate(hits, 1)) + f"\n\nQ: {row['text']}\nA:"
                    for row, hits in zip(rows, own)]


def test_prompt_generate_refuses_retrieval_flags_without_an_index(setup, capsys):
    assert main(["prompt", "generate", "--model", str(setup["generator"]), "--task", "arithmetic", "-k", "2"]) == 2
    assert "-k needs --index" in capsys.readouterr().err
