"""Cloze knowledge probes in LAMA's style: does the model fill "The father of Isaac was [MASK]." with Abraham?

Petroni et al. (2019, "Language Models as Knowledge Bases?") turn facts (subject, relation, object) into cloze
sentences by a template per relation and rank the whole vocabulary at the blank; a fact counts at k when its
object is among the k most probable tokens::

    P@k(relation) = |{facts of the relation whose object is in the top k}| / |facts scored|

Like LAMA, only facts whose object is one token of the model's vocabulary *in that position* are scored (a
multi-token object cannot be ranked against single tokens); the others are counted as ``skipped``. The blank
is read as :func:`lmforge.evaluation.fill_mask.fill_mask` reads it for each family (an encoder's mask token, a
decoder's next token, T5's sentinel, BART's next decoder token), so the probe works for every model with an
LM head. The shipped facts (``cloze-facts``, :mod:`lmforge.datasets`) are stated in the shipped corpora (KJV,
Austen), so a model pre-trained on them can know the answers.

Example:
    >>> facts = shipped_facts()
    >>> len(facts), facts[0]["relation"], cloze_text(facts[0])
    (66, 'bible/father', 'The father of Isaac was [MASK].')
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import torch

from lmforge import datasets
from lmforge.errors import UserInputError
from lmforge.evaluation.fill_mask import MASK, _strip_eos, fill_mask

COLUMNS = ("relation", "template", "subject", "object")


def shipped_facts() -> list[dict[str, str]]:
    """The shipped probe set: one dict per fact (relation, template, subject, object, source)."""
    return datasets.load("cloze-facts", "test")


def check_facts(facts: Sequence[dict[str, Any]], where: str = "facts") -> None:
    """Each fact has the columns, and its template one ``[X]`` and one ``[Y]``; else one line naming the row."""
    for i, fact in enumerate(facts, 1):
        missing = [c for c in COLUMNS if not str(fact.get(c) or "").strip()]
        if missing:
            raise UserInputError(f"{where}: row {i}: no {', '.join(missing)} (columns: {', '.join(COLUMNS)})")
        if fact["template"].count("[X]") != 1 or fact["template"].count("[Y]") != 1:
            raise UserInputError(f"{where}: row {i}: the template needs one [X] and one [Y]: {fact['template']!r}")


def cloze_text(fact: dict[str, str]) -> str:
    """The fact's sentence with the subject in and the object blanked: ``[Y]`` -> ``[MASK]``."""
    return fact["template"].replace("[X]", fact["subject"]).replace("[Y]", MASK)


def answer_id(model, tokenizer, text: str, answer: str) -> int | None:
    """The one token id ``answer`` is at the blank of ``text`` as the model reads it, or None when it is more,
    when it is the unknown token, or when filling it in changes the tokens around the blank."""
    found = _answer_id(model, tokenizer, text, answer)
    return None if found is not None and found == tokenizer.special_token_ids().get("unk_token_id") else found


def _answer_id(model, tokenizer, text: str, answer: str) -> int | None:
    cfg = model.config
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.special_token_ids().get("eos_token_id")
    if cfg.arch == "encoder":
        masked = tokenizer.encode(text.replace(MASK, tokenizer.special_token("mask")))
        filled = tokenizer.encode(text.replace(MASK, answer))
        differ = [p for p, (a, b) in enumerate(zip(masked, filled)) if a != b]
        return filled[differ[0]] if len(masked) == len(filled) and len(differ) == 1 else None
    if cfg.arch == "encoder-decoder" and tokenizer.sentinels:  # T5: the target is "<extra_id_0> answer"
        ids = _strip_eos(tokenizer.encode(answer), eos)
        return ids[0] if len(ids) == 1 else None
    prefix = text.split(MASK, 1)[0].rstrip()  # decoders and BART read the text before the blank, then go on
    before = _strip_eos(tokenizer.encode(prefix), eos)
    after = _strip_eos(tokenizer.encode(f"{prefix} {answer}"), eos)
    return after[-1] if len(after) == len(before) + 1 and after[:-1] == before else None


@torch.no_grad()
def probe(model, tokenizer, facts: Sequence[dict[str, str]] | None = None, ks: Sequence[int] = (1, 10)) -> dict:
    """P@k per relation and over all scored facts; ``rows``: each fact's rank of its object (None: not in the
    top max(ks)) and top fillers.

    Returns:
        ``{"relations": {name: {"p@1", "p@10", "facts", "skipped"}}, "all": {...}, "mean": {p@k averaged over
        relations}, "rows": [...]}``.
    """
    facts = list(facts) if facts is not None else shipped_facts()
    check_facts(facts)
    depth = max(ks)
    rows, by_relation = [], defaultdict(list)
    for fact in facts:
        text = cloze_text(fact)
        target = answer_id(model, tokenizer, text, fact["object"])
        row = {"relation": fact["relation"], "text": text, "object": fact["object"], "rank": None, "top": []}
        if target is None:
            row["skipped"] = True
        else:
            top = fill_mask(model, tokenizer, text, depth)
            ids = [t["id"] for t in top]
            row["rank"] = ids.index(target) + 1 if target in ids else None
            row["top"] = [t["token"] for t in top[:5]]
        rows.append(row)
        by_relation[fact["relation"]].append(row)

    def summary(group: list[dict]) -> dict[str, Any]:
        scored = [r for r in group if not r.get("skipped")]
        out = {f"p@{k}": (sum(r["rank"] is not None and r["rank"] <= k for r in scored) / len(scored)
                          if scored else None) for k in ks}
        return {**out, "facts": len(scored), "skipped": len(group) - len(scored)}

    relations = {name: summary(group) for name, group in by_relation.items()}
    scored = [s for s in relations.values() if s["facts"]]
    mean = {f"p@{k}": (sum(s[f"p@{k}"] for s in scored) / len(scored) if scored else None) for k in ks}
    return {"relations": relations, "all": summary(rows), "mean": mean, "rows": rows}


def table(result: dict) -> str:
    """A text table: one line per relation, then all facts and the mean over relations."""
    lines = [f"{'relation':18s} {'P@1':>6s} {'P@10':>6s} {'facts':>6s} {'skipped':>8s}"]

    def fmt(v):
        return f"{v:6.3f}" if v is not None else f"{'-':>6s}"

    for name, s in [*result["relations"].items(), ("all facts", result["all"])]:
        lines.append(f"{name:18s} {fmt(s['p@1'])} {fmt(s['p@10'])} {s['facts']:6d} {s['skipped']:8d}")
    lines.append(f"{'mean of relations':18s} {fmt(result['mean']['p@1'])} {fmt(result['mean']['p@10'])}")
    return "\n".join(lines)
