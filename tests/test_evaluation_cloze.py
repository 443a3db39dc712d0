"""Cloze probes: the shipped facts are stated in the shipped corpora; P@1 and P@10 equal a hand count on a model
whose MLM head is rigged to rank chosen tokens first; decoders rank by the next token; the CLI reports them."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from lmforge import checkpoint, datasets
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.evaluation.cloze_probe import answer_id, check_facts, cloze_text, probe, shipped_facts
from lmforge.evaluation.fill_mask import fill_mask
from lmforge.tokenization import train_tokenizer
from tests import task_helpers as th

TITLES = ("Mr.", "Sir", "General", "Lady", "Miss")


def test_every_shipped_fact_is_stated_in_the_shipped_corpora():
    facts = shipped_facts()
    check_facts(facts)
    assert len(facts) == datasets.info("cloze-facts").rows["test"] == 66
    verses = [r["en"] for s in ("train", "dev", "test") for r in datasets.load("kjv-rv1909", s)]
    chapters = [r["text"] for r in datasets.load("corpus")]
    for fact in facts:
        words = fact["subject"].split()
        name = words[-1] if words[0] in TITLES else words[0]
        docs = verses if fact["source"] == "kjv" else chapters
        assert any(re.search(rf"\b{name}\b", d) and re.search(rf"\b{fact['object']}\b", d) for d in docs), fact
        assert fact["template"].rstrip(".").endswith("[Y]")  # the object is last: a decoder can fill it


@pytest.fixture(scope="module")
def fact_tokenizers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("facts")
    filled = [f["template"].replace("[X]", f["subject"]).replace("[Y]", f["object"]) for f in shipped_facts()]
    (folder / "facts.txt").write_text("\n\n".join(filled * 5) + "\n", encoding="utf-8")
    return {family: train_tokenizer([folder / "facts.txt"], kind=kind, vocab_size=size, family=family,
                                    min_frequency=1, show_progress=False)
            for family, kind, size in (("bert", "wordpiece", 600), ("gpt", "byte-bpe", 900))}


def test_precision_at_k_equals_a_hand_count(fact_tokenizers):
    tok = fact_tokenizers["bert"]
    model = th.body("bert", tok).eval()
    facts = shipped_facts()
    ids = {f["object"]: answer_id(model, tok, cloze_text(f), f["object"]) for f in facts}
    assert None not in ids.values()
    wives = [f["object"] for f in facts if f["relation"] == "bible/wife"]
    with torch.no_grad():  # the bias swamps the logits (|logit| ~ 1): Abraham first, then the seven wives
        model.mlm_head.bias[ids["Abraham"]] += 200.0
        for j, wife in enumerate(wives):
            model.mlm_head.bias[ids[wife]] += 100.0 + j
    result = probe(model, tok, facts)
    count = Counter(f["relation"] for f in facts)
    abraham = Counter(f["relation"] for f in facts if f["object"] == "Abraham")
    for relation, n in count.items():
        s = result["relations"][relation]
        assert s["facts"] == n and s["skipped"] == 0
        assert s["p@1"] == pytest.approx(abraham[relation] / n)
        assert s["p@10"] == pytest.approx(1.0 if relation == "bible/wife" else abraham[relation] / n)
    assert result["all"]["p@1"] == pytest.approx(2 / 66) and result["all"]["p@10"] == pytest.approx(9 / 66)
    assert result["mean"]["p@1"] == pytest.approx(sum(abraham[r] / n for r, n in count.items()) / len(count))
    isaac = next(r for r in result["rows"] if r["text"] == "The father of Isaac was [MASK].")
    assert isaac["rank"] == 1 and isaac["top"][0].lower() == "abraham"


def test_decoder_ranks_the_next_token(fact_tokenizers):
    tok = fact_tokenizers["gpt"]
    torch.manual_seed(0)
    model = th.body("gpt", tok).eval()
    facts = shipped_facts()[:12]
    result = probe(model, tok, facts)
    for fact, row in zip(facts, result["rows"]):
        target = answer_id(model, tok, cloze_text(fact), fact["object"])
        assert target == tok.encode("The father of " + fact["subject"] + " was " + fact["object"])[-1]
        ranked = [t["id"] for t in fill_mask(model, tok, cloze_text(fact), 10)]
        assert row["rank"] == (ranked.index(target) + 1 if target in ranked else None)


def test_multi_token_objects_are_skipped_not_scored(fact_tokenizers):
    tok = fact_tokenizers["bert"]
    model = th.body("bert", tok)
    facts = [{"relation": "r", "template": "[X] lives in [Y].", "subject": "Ruth", "object": "Zzyzxqvw"},
             {"relation": "r", "template": "The father of [X] was [Y].", "subject": "Isaac", "object": "Abraham"}]
    result = probe(model, tok, facts)
    assert result["relations"]["r"]["facts"] == 1 and result["relations"]["r"]["skipped"] == 1
    with pytest.raises(UserInputError, match=r"facts: row 1: the template needs one \[X\] and one \[Y\]"):
        probe(model, tok, [{"relation": "r", "template": "[X] is here.", "subject": "a", "object": "b"}])


def test_probe_cloze_cli(fact_tokenizers, tmp_path, capsys):
    tok = fact_tokenizers["bert"]
    folder = checkpoint.save(th.body("bert", tok), tmp_path / "bert", tokenizer=tok)
    assert main(["probe", "cloze", "--model", str(folder), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "bible/father" in out and "mean of relations" in out
    saved = json.loads((tmp_path / "p" / "cloze.json").read_text())
    assert saved["all"]["facts"] == 66 and len(saved["rows"]) == 66
    assert main(["probe", "cloze", "--model", str(folder), "--random-init"]) == 0
    bad = tmp_path / "bad.tsv"
    bad.write_text("relation\ttemplate\tsubject\tobject\nr\t[X] is [Y].\t\tb\n", encoding="utf-8")
    assert main(["probe", "cloze", "--model", str(folder), "--facts", str(bad)]) == 2
    assert f"{bad}: row 1: no subject" in capsys.readouterr().err
    assert main(["probe", "--model", str(folder)]) == 2
    assert "probe layers needs --train and --eval" in capsys.readouterr().err
