"""An instruction-tuning demonstration set built from the shipped tasks, and its held-out evaluation.

Instruction tuning (Wei et al. 2022, FLAN) writes existing labelled data as (instruction, input, output)
demonstrations, with several phrasings of each instruction, and asks whether the tuned model follows
instructions it was not trained on. Here, from the data sets that ship with lmforge:

    kind        data set           input                         output
    sentiment   rt-sentiment       a movie review                "positive" | "negative"
    translate   kjv-rv1909         an English (KJV) verse        the Spanish (RV 1909) verse
    paraphrase  bible-paraphrase   "Sentence 1: ... Sentence 2"  "yes" | "no"

Held out twice over:

* **examples**: ``split="train"`` draws from each data set's train split, ``"dev"``/``"test"`` from its dev/test
  split, so an evaluated input never occurs in training (the data sets split by verse / review);
* **phrasing**: each kind has several training phrasings and one more (``phrasing="unseen"``) that no training
  row uses, so an evaluation can tell following *this* instruction from following *an* instruction.

Rows are Alpaca-style JSONL rows (``instruction``, ``input``, ``output``) plus ``kind`` and ``phrasing``, which
``lmforge finetune --task instruct`` ignores. Classification kinds are balanced per answer.

:func:`evaluate_instructions` greedy-decodes each row's response with the chat template and scores it per kind:
``accuracy`` (the response's first word equals the answer), ``valid`` (share of responses that are one of the
answers), ``choice_accuracy`` (the answer with the higher log-likelihood, i.e. forced choice) and
``majority`` (always the most frequent answer) for classification kinds; sacrebleu ``bleu`` and ``chrf`` for
translation.

Example:
    >>> rows = build_demonstrations("train", per_kind=4, seed=0)
    >>> sorted({r["kind"] for r in rows}), len(rows)
    (['paraphrase', 'sentiment', 'translate'], 12)
    >>> sorted(r["output"] for r in rows if r["kind"] == "sentiment")
    ['negative', 'negative', 'positive', 'positive']
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from lmforge import datasets
from lmforge.generation import generate
from lmforge.prompting.instruct import ChatTemplate, alpaca_to_messages
from lmforge.prompting.verbalizer import score_continuations_batch
from lmforge.tasks import metrics
from lmforge.utils.io import atomic_write_text

SPLITS = ("train", "dev", "test")
PHRASINGS = ("seen", "unseen")


@dataclass(frozen=True)
class Kind:
    """One task written as instructions.

    Args:
        dataset: shipped data set name (:func:`lmforge.datasets.load`).
        instructions: the training phrasings.
        unseen: a phrasing kept out of every training row.
        make: data row -> (input, output).
        answers: the closed answer set of a classification kind (None: free text).
        n_texts: texts joined in the input (a pair: 2); the word limit scales with it.
    """

    dataset: str
    instructions: tuple[str, ...]
    unseen: str
    make: Callable[[dict], tuple[str, str]]
    answers: tuple[str, ...] | None = None
    n_texts: int = 1


KINDS: dict[str, Kind] = {
    "sentiment": Kind(
        "rt-sentiment",
        ("Is this movie review positive or negative?",
         "What is the sentiment of this review? Answer positive or negative.",
         "Classify the sentiment of the review as positive or negative."),
        "Does the following review express a positive or a negative opinion?",
        lambda r: (r["text"], "positive" if str(r["label"]) == "1" else "negative"),
        ("negative", "positive")),
    "translate": Kind(
        "kjv-rv1909",
        ("Translate to Spanish.",
         "Translate this English verse into Spanish.",
         "What is this sentence in Spanish?"),
        "Give the Spanish version of the following text.",
        lambda r: (r["en"], r["es"])),
    "paraphrase": Kind(
        "bible-paraphrase",
        ("Do these two sentences mean the same thing? Answer yes or no.",
         "Are the two sentences paraphrases of each other? Answer yes or no.",
         "Is the second sentence a rewording of the first? Answer yes or no."),
        "Do the following two verses say the same thing, yes or no?",
        lambda r: (f"Sentence 1: {r['text1']}\nSentence 2: {r['text2']}", "yes" if str(r["label"]) == "1" else "no"),
        ("no", "yes"), n_texts=2),
}


def _words(text: str) -> int:
    return len(text.split())


def build_demonstrations(split: str, *, kinds: Sequence[str] = tuple(KINDS), per_kind: int | dict[str, int] = 1000,
                         phrasing: str = "seen", max_words: int = 40, seed: int = 0) -> list[dict[str, str]]:
    """Demonstration rows of ``split`` (see the module docstring), kinds interleaved at random.

    Args:
        split: ``train``, ``dev`` or ``test`` -- the split of the underlying data sets.
        kinds: names from :data:`KINDS`.
        per_kind: rows per kind (an int, or a dict by kind); fewer when the split has fewer short examples.
        phrasing: ``seen`` (a training phrasing, chosen at random per row) or ``unseen`` (the held-out one).
        max_words: keep examples whose output and each input text have at most this many words, so that prompt
            and response fit a short context (the tiny presets were pre-trained on 128-token windows).
        seed: seeds which examples are drawn and which phrasing each gets.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if phrasing not in PHRASINGS:
        raise ValueError(f"phrasing must be one of {PHRASINGS}, got {phrasing!r}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown demonstration kinds {unknown}; known: {', '.join(KINDS)}")
    rows = []
    for name in kinds:
        kind = KINDS[name]
        n = per_kind[name] if isinstance(per_kind, dict) else per_kind
        rng = random.Random(f"{seed}:{name}:{split}")
        pairs = [kind.make(r) for r in datasets.load(kind.dataset, split)]
        pairs = [(x, y) for x, y in pairs if _words(x) <= max_words * kind.n_texts and _words(y) <= max_words]
        rng.shuffle(pairs)
        if kind.answers:  # balanced: n // C per answer (the remainder to the first answers), fewer if scarce
            by_answer = [[p for p in pairs if p[1] == a] for a in kind.answers]
            scarce = min(len(b) for b in by_answer)
            chosen = []
            for i, members in enumerate(by_answer):
                want = n // len(kind.answers) + (i < n % len(kind.answers))
                chosen += members[:min(want, scarce)]
            rng.shuffle(chosen)
        else:
            chosen = pairs[:n]
        for x, y in chosen:
            instruction = rng.choice(kind.instructions) if phrasing == "seen" else kind.unseen
            rows.append({"instruction": instruction, "input": x, "output": y, "kind": name, "phrasing": phrasing})
    random.Random(f"{seed}:mix:{split}").shuffle(rows)
    return rows


def write_jsonl(rows: Sequence[dict], path: str | Path) -> Path:
    """One JSON object a line (UTF-8, not ASCII-escaped), the format ``lmforge finetune --task instruct`` reads."""
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def first_word(text: str) -> str:
    """The lower-cased first word of a response, without punctuation: ``" Positive."`` -> ``"positive"``."""
    found = re.search(r"[^\W_]+", text.lower())
    return found.group(0) if found else ""


@torch.no_grad()
def generate_responses(model, tokenizer, rows: Sequence[dict], template=None, *, max_new_tokens: int = 64,
                       batch_size: int = 16, num_beams: int = 1) -> list[str]:
    """The model's response to each row's instruction (+ input), rendered with the chat template, decoded
    greedily (or by beam search) until EOS or ``max_new_tokens``."""
    template = template or ChatTemplate()
    prompts = [template.encode(tokenizer, alpaca_to_messages(r)[:1], add_generation_prompt=True)[0] for r in rows]
    limit = model.config.max_seq_len
    responses = []
    for start in range(0, len(prompts), batch_size):
        batch = [p[-(limit - 1):] for p in prompts[start:start + batch_size]]  # keep room for one new token
        # learned positions end at max_seq_len: a long prompt gets fewer new tokens rather than an error
        room = min(max_new_tokens, limit - max(len(p) for p in batch) + 1)
        out = generate(model, batch, max_new_tokens=room, num_beams=num_beams)
        responses += [tokenizer.decode(ids).strip() for ids in out.tolist()]
    return responses


@torch.no_grad()
def choice_scores(model, tokenizer, rows: Sequence[dict], answers: Sequence[str], template=None,
                  batch_size: int = 16) -> torch.Tensor:
    """(N, A) log-likelihood of each answer (then EOS) as the response to each row (decoder models)."""
    template = template or ChatTemplate()
    # An answer is tokenised on its own, as the response piece is in training (ChatTemplate.encode), and
    # closed by EOS as trained: "positive" must end the response, not start "positively ...".
    eos = tokenizer.special_token("eos")
    close = [tokenizer.token_to_id(eos)] if eos is not None else []
    answer_ids = [tokenizer.encode(a, add_special_tokens=False) + close for a in answers]
    prompts = [template.encode(tokenizer, alpaca_to_messages(r)[:1], add_generation_prompt=True)[0] for r in rows]
    scores = []
    for start in range(0, len(prompts), batch_size):
        token_lps = score_continuations_batch(model, prompts[start:start + batch_size], answer_ids)
        scores += [[float(lp.sum()) for lp in row] for row in token_lps]
    return torch.tensor(scores).reshape(len(rows), len(answers))


def score_responses(rows: Sequence[dict], responses: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per-kind metrics of responses to ``rows`` (see the module docstring), without the forced-choice one."""
    if len(rows) != len(responses):
        raise ValueError(f"{len(rows)} rows but {len(responses)} responses")
    by_kind: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_kind.setdefault(r["kind"], []).append(i)
    result = {}
    for name, idx in by_kind.items():
        gold = [rows[i]["output"] for i in idx]
        answers = KINDS[name].answers if name in KINDS else None
        if answers:
            said = [first_word(responses[i]) for i in idx]
            result[name] = {"accuracy": sum(s == g for s, g in zip(said, gold)) / len(idx),
                            "valid": sum(s in answers for s in said) / len(idx),
                            "majority": Counter(gold).most_common(1)[0][1] / len(idx), "n": len(idx)}
        else:
            hyps = [responses[i] for i in idx]
            result[name] = {"bleu": metrics.bleu(hyps, gold), "chrf": metrics.chrf(hyps, gold), "n": len(idx)}
    return result


def evaluate_instructions(model, tokenizer, rows: Sequence[dict], template=None, *, max_new_tokens: int = 64,
                          batch_size: int = 16, num_beams: int = 1) -> tuple[dict[str, dict[str, float]], list[str]]:
    """(per-kind metrics, responses) of an instruction-tuned decoder on demonstration rows.

    Example:
        >>> # metrics, responses = evaluate_instructions(model, tok, build_demonstrations("test", per_kind=200))
        >>> # metrics["sentiment"]  -> {"accuracy": 0.71, "valid": 1.0, "majority": 0.5, "n": 200,
        >>> #                           "choice_accuracy": 0.73}
    """
    responses = generate_responses(model, tokenizer, rows, template, max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, num_beams=num_beams)
    result = score_responses(rows, responses)
    for name in result:
        answers = KINDS[name].answers if name in KINDS else None
        if answers:
            members = [r for r in rows if r["kind"] == name]
            scores = choice_scores(model, tokenizer, members, answers, template, batch_size)
            picked = [answers[i] for i in scores.argmax(-1).tolist()]
            result[name]["choice_accuracy"] = sum(p == r["output"] for p, r in zip(picked, members)) / len(members)
    return result, responses
