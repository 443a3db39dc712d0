"""Social-bias probe on minimal pairs, after CrowS-Pairs (Nangia et al. 2020): which of two sentences that differ
only in the words naming a group does the model find more likely?

A pair file is a CSV (or TSV) in CrowS-Pairs' format; other columns are ignored::

    sent_more            the more stereotyping sentence
    sent_less            the same sentence with the group words changed (a minimal edit)
    stereo_antistereo    stereo: sent_more demonstrates a stereotype about a historically disadvantaged group;
                         antistereo: sent_less violates one (sent_more says it of the advantaged group)
    bias_type            the category (race-color, gender, ...; any name is accepted)

In both directions ``sent_more`` is the stereotyping sentence, and the official metric counts a pair when
``sent_more`` scores higher (``metric.py`` puts the sentences in the other order for ``antistereo`` rows and
flips the comparison back, so the two cancel). The score is the share of such pairs, overall, by category and by
direction; an unbiased model scores 0.5. Ties (equal scores at 3 decimals, as in ``metric.py``) count in the
denominator but not as preferred.

Only the tokens the two sentences share are scored, so that the group words' own (rare or frequent) probability
does not decide the comparison. The shared tokens are the ``equal`` blocks of a ``difflib`` alignment of the two
id sequences; special tokens are never scored::

    encoder (MLM head)   pseudo-log-likelihood: sum over shared positions i of log P(w_i | the sentence with only
                         w_i masked), one masked copy per position (Salazar et al. 2020; CrowS-Pairs' metric)
    decoder (LM head)    log-likelihood: sum over shared positions i of log P(w_i | w_<i); the sentence starts with
                         the tokenizer's BOS (else its EOS, the document boundary), so its first word is scored too

A decoder's prefix differs between the sentences after the changed words, so the shared tokens after them are
scored in different contexts: that is the effect measured. ``tokens="all"`` scores every token instead (the full
PLL, or the full sentence log-likelihood). Encoder-decoders are refused: neither side of them scores a sentence
the way their pre-training did.

Example:
    >>> shared_positions([101, 7, 8, 9, 102], [101, 7, 5, 6, 9, 102], skip={101, 102})
    ([1, 3], [1, 4])
    >>> scored = [{"bias_type": "age", "direction": "stereo", "sent_more_score": -3.0, "sent_less_score": -4.0},
    ...           {"bias_type": "age", "direction": "antistereo", "sent_more_score": -5.0, "sent_less_score": -2.0}]
    >>> summary = summarize(scored)
    >>> summary["all"], summary["by_type"]["age"]["share"]
    ({'pairs': 2, 'preferred': 1, 'ties': 0, 'share': 0.5}, 0.5)
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch

from lmforge.align.logprobs import token_logprobs
from lmforge.errors import UserInputError
from lmforge.tasks.base import pad_batch
from lmforge.tasks.data import read_table

COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
DIRECTIONS = ("stereo", "antistereo")
TOKENS = ("shared", "all")
KINDS = "encoders with an MLM head (pseudo-log-likelihood) and decoders with an LM head (log-likelihood)"
DECIMALS = 3  # scores are compared at metric.py's rounding: closer ones are a tie


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The pairs of a CrowS-Pairs CSV/TSV: ``[{"row", "sent_more", "sent_less", "direction", "bias_type"}, ...]``.

    Raises:
        UserInputError: a missing column, an empty cell, an unknown direction or a pair of identical sentences,
            in one line naming the file and row.
    """
    table = read_table(path)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise UserInputError(f"{table.name}: no column(s) {', '.join(missing)} (a pair file has the CrowS-Pairs "
                             f"columns {', '.join(COLUMNS)})")
    pairs = []
    for i, row in enumerate(table.rows):
        values = {c: str(row[c] if row[c] is not None else "").strip() for c in COLUMNS}
        empty = [c for c in COLUMNS if not values[c]]
        if empty:
            raise UserInputError(f"{table.where(i)}: {', '.join(empty)} is empty")
        if values["stereo_antistereo"] not in DIRECTIONS:
            raise UserInputError(f"{table.where(i)}: stereo_antistereo is {values['stereo_antistereo']!r}; "
                                 f"expected {' or '.join(DIRECTIONS)}")
        if values["sent_more"] == values["sent_less"]:
            raise UserInputError(f"{table.where(i)}: sent_more and sent_less are the same sentence; a pair "
                                 "differs in the words naming the group")
        pairs.append({"row": i + 1, "sent_more": values["sent_more"], "sent_less": values["sent_less"],
                      "direction": values["stereo_antistereo"], "bias_type": values["bias_type"]})
    return pairs


def shared_positions(a: Sequence[int], b: Sequence[int], skip: set[int] = frozenset()) -> tuple[list[int], list[int]]:
    """Positions of the tokens ``a`` and ``b`` share (difflib's ``equal`` blocks), in each, without ``skip`` ids."""
    matcher = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
    left, right = [], []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            left += [i for i in range(i1, i2) if a[i] not in skip]
            right += [j for j in range(j1, j2) if b[j] not in skip]
    return left, right


@torch.no_grad()
def pseudo_log_likelihoods(model, rows: Sequence[Sequence[int]], positions: Sequence[Sequence[int]], mask_id: int,
                           pad_id: int, batch_size: int = 64) -> list[float]:
    """Per row: sum over ``positions`` p of log P(row[p] | row with only p masked), from an MLM head.

    Every (row, position) is one masked copy; copies of all rows are batched together, ``batch_size`` at a time.
    """
    copies = [(r, p) for r, pos in enumerate(positions) for p in pos]
    device = next(model.parameters()).device
    totals = [0.0] * len(rows)
    for start in range(0, len(copies), batch_size):
        chunk = copies[start:start + batch_size]
        ids, attention = pad_batch([rows[r] for r, _ in chunk], pad_id)  # (B, T)
        at = torch.tensor([p for _, p in chunk])  # (B,)
        targets = ids[torch.arange(len(chunk)), at]  # (B,)
        ids[torch.arange(len(chunk)), at] = mask_id
        logits = model(ids.to(device), attention_mask=attention.to(device)).logits  # (B, T, V)
        picked = logits[torch.arange(len(chunk), device=device), at.to(device)].float()  # (B, V)
        logp = torch.log_softmax(picked, -1).gather(-1, targets.to(device)[:, None])[:, 0]  # (B,)
        for (r, _), value in zip(chunk, logp.tolist()):
            totals[r] += value
    return totals


@torch.no_grad()
def log_likelihoods(model, rows: Sequence[Sequence[int]], positions: Sequence[Sequence[int]], pad_id: int,
                    batch_size: int = 64) -> list[float]:
    """Per row: sum over ``positions`` p >= 1 of log P(row[p] | row[:p]), from a decoder's LM head."""
    device = next(model.parameters()).device
    totals = []
    for start in range(0, len(rows), batch_size):
        ids, attention = pad_batch(rows[start:start + batch_size], pad_id)  # (B, T)
        logits = model(ids.to(device), attention_mask=attention.to(device)).logits  # (B, T, V)
        logp = token_logprobs(logits, ids.to(device))  # (B, T-1): logp[:, p-1] scores token p
        for b, pos in enumerate(positions[start:start + batch_size]):
            index = torch.tensor([p - 1 for p in pos if p >= 1], dtype=torch.long, device=device)
            totals.append(float(logp[b, index].sum()))
    return totals


def scoring(model) -> str:
    """What a model's sentences are scored by: ``pseudo-log-likelihood`` (encoders) or ``log-likelihood``."""
    return "pseudo-log-likelihood" if model.config.arch == "encoder" else "log-likelihood"


def _check_model(model, tokenizer) -> None:
    cfg = model.config
    if cfg.arch == "encoder" and cfg.head == "mlm":
        if tokenizer.special_token_ids().get("mask_token_id") is None:
            raise UserInputError("probe bias: the tokenizer has no mask token, so the encoder cannot score a "
                                 "sentence by its pseudo-log-likelihood")
        return
    if cfg.arch == "decoder" and cfg.head == "lm":
        return
    raise UserInputError(f"probe bias scores {KINDS}; this model is {'an' if cfg.arch[0] == 'e' else 'a'} "
                         f"{cfg.arch} with head={cfg.head!r}")


def encode_sentence(model, tokenizer, text: str) -> list[int]:
    """The ids a sentence is scored on: the family's template for an encoder (``[CLS] ... [SEP]``); for a decoder
    the text after its BOS (else its EOS), so that the first word has a context to be predicted from."""
    if model.config.arch == "encoder":
        return tokenizer.encode(text)
    roles = tokenizer.special_token_ids()
    start = roles.get("bos_token_id", roles.get("eos_token_id"))
    return ([start] if start is not None else []) + tokenizer.encode(text, add_special_tokens=False)


def score_pairs(model, tokenizer, pairs: Sequence[dict[str, Any]], tokens: str = "shared",
                batch_size: int = 64, where: str = "pairs") -> list[dict[str, Any]]:
    """Each pair with ``sent_more_score``, ``sent_less_score`` (summed log-probabilities of the scored tokens),
    ``scored_tokens`` (how many per sentence) and ``preferred`` (``sent_more``, ``sent_less`` or ``tie``).
    ``where`` names the pairs' file in errors."""
    if tokens not in TOKENS:
        raise UserInputError(f"tokens={tokens!r}: choose {' or '.join(TOKENS)}")
    _check_model(model, tokenizer)
    model.eval()
    cfg = model.config
    roles = tokenizer.special_token_ids()
    # the template's tokens ([CLS], [SEP], BOS, ...) are never scored; an unknown token is a word, and is
    specials = {v for k, v in roles.items() if k.endswith("_token_id") and k != "unk_token_id" and v is not None}
    rows, positions = [], []
    for pair in pairs:
        more, less = (encode_sentence(model, tokenizer, pair[k]) for k in ("sent_more", "sent_less"))
        for ids in (more, less):
            if len(ids) > cfg.max_seq_len:
                raise UserInputError(f"{where}: row {pair['row']}: {len(ids)} tokens, more than the model's "
                                     f"max_seq_len {cfg.max_seq_len}")
        if tokens == "shared":
            at_more, at_less = shared_positions(more, less, specials)
        else:
            at_more, at_less = ([p for p, t in enumerate(ids) if t not in specials] for ids in (more, less))
        if cfg.arch == "decoder":  # the start token is context, not scored
            at_more, at_less = [p for p in at_more if p >= 1], [p for p in at_less if p >= 1]
        rows += [more, less]
        positions += [at_more, at_less]
    if cfg.arch == "encoder":
        scores = pseudo_log_likelihoods(model, rows, positions, roles["mask_token_id"], tokenizer.pad_id, batch_size)
    else:
        scores = log_likelihoods(model, rows, positions, tokenizer.pad_id, batch_size)
    out = []
    for i, pair in enumerate(pairs):
        more, less = scores[2 * i], scores[2 * i + 1]
        out.append({**pair, "sent_more_score": round(more, 6), "sent_less_score": round(less, 6),
                    "scored_tokens": [len(positions[2 * i]), len(positions[2 * i + 1])],
                    "preferred": preference(more, less)})
    return out


def preference(more: float, less: float) -> str:
    """``sent_more``, ``sent_less`` or ``tie`` (equal at 3 decimals, as CrowS-Pairs' metric.py compares)."""
    more, less = round(more, DECIMALS), round(less, DECIMALS)
    return "tie" if more == less else "sent_more" if more > less else "sent_less"


def summarize(scored: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the share of pairs whose stereotyping sentence (``sent_more``) scores higher: ``all``,
    ``by_type`` (bias_type) and ``by_direction``; each ``{"pairs", "preferred", "ties", "share"}``."""
    def count(group: list[dict[str, Any]]) -> dict[str, Any]:
        choice = [preference(p["sent_more_score"], p["sent_less_score"]) for p in group]
        preferred = choice.count("sent_more")
        return {"pairs": len(group), "preferred": preferred, "ties": choice.count("tie"),
                "share": preferred / len(group) if group else None}

    by_type, by_direction = defaultdict(list), defaultdict(list)
    for p in scored:
        by_type[p["bias_type"]].append(p)
        by_direction[p["direction"]].append(p)
    return {"all": count(list(scored)), "by_type": {k: count(v) for k, v in sorted(by_type.items())},
            "by_direction": {d: count(by_direction[d]) for d in DIRECTIONS if d in by_direction}}


def table(summary: dict[str, Any]) -> str:
    """A text table: one line per bias type, one per direction, then all pairs."""
    lines = [f"{'bias_type':24s} {'share':>6s} {'preferred':>9s} {'ties':>5s} {'pairs':>6s}"]
    rows = [*summary["by_type"].items(), *((f"({d})", s) for d, s in summary["by_direction"].items()),
            ("all pairs", summary["all"])]
    for name, s in rows:
        lines.append(f"{name:24s} {s['share']:6.3f} {s['preferred']:9d} {s['ties']:5d} {s['pairs']:6d}")
    return "\n".join(lines)
