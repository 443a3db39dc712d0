"""Few-shot in-context learning: choose k demonstrations, write them before the query, and chain-of-thought.

Brown et al. 2020 ("Language Models are Few-Shot Learners") condition a frozen LM on k solved examples:

    demo_1 <sep> demo_2 <sep> ... demo_k <sep> query-prompt [z]

Each demonstration is the template filled with a pool example and its label's first verbalizer answer.
Demonstrations are chosen per query by ``selection``:

    random     k pool examples uniformly (Brown et al. 2020)
    balanced   k // C per class, the remainder from randomly chosen classes, then shuffled
    knn        the k pool examples most cosine-similar to the query, by mean-pooled hidden states of the model
               itself (Liu et al. 2022, "What Makes Good In-Context Examples for GPT-3?")

and put in ``order``: "given" (as selected), "random" (shuffled) or "nearest-last" (knn: the most similar example
next to the query, Liu et al. 2022's best order). Every random choice comes from ``random.Random(f"{seed}:{i}")``
for query i, so a prompt depends only on the seed and the query's position, not on the other queries.

Chain-of-thought (Wei et al. 2022, "Chain-of-Thought Prompting Elicits Reasoning in Large Language Models"):
demonstrations carry a rationale before their answer; the model's generated continuation is searched with a
regular expression for the answer (:class:`ChainOfThought`).

Example:
    >>> from lmforge.prompting import FewShot, Template, Verbalizer
    >>> pool = [{"text": "Loved it.", "label": "pos"}, {"text": "Awful.", "label": "neg"}]
    >>> fs = FewShot(Template("{x} It was {z}."), Verbalizer({"pos": "great", "neg": "bad"}), k=2,
    ...              selection="balanced", seed=0)
    >>> print(fs.prompts(pool, [{"text": "Fine acting."}])[0].prefix)
    Loved it. It was great.
    <BLANKLINE>
    Awful. It was bad.
    <BLANKLINE>
    Fine acting. It was
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from lmforge.generation import generate_text
from lmforge.prompting.template import Prompt, Template
from lmforge.prompting.verbalizer import Verbalizer
from lmforge.errors import UserInputError

SELECTIONS = ("random", "balanced", "knn")
ORDERS = ("given", "random", "nearest-last")


def row_texts(row: dict[str, Any]) -> tuple[str, ...]:
    """The input texts of a data row: ``text`` (and ``text2`` for sentence pairs)."""
    if "text" not in row:
        raise UserInputError(f"a data row needs a 'text' column, got {sorted(row)}")
    return (row["text"],) + ((row["text2"],) if row.get("text2") not in (None, "") else ())


def select_random(n_pool: int, k: int, rng: random.Random) -> list[int]:
    """k distinct pool indices, uniformly."""
    if k > n_pool:
        raise UserInputError(f"cannot choose {k} demonstrations from a pool of {n_pool}")
    return rng.sample(range(n_pool), k)


def select_balanced(labels: Sequence[str], k: int, rng: random.Random) -> list[int]:
    """k pool indices with per-class counts differing by at most one, shuffled (classes in sorted order)."""
    by_class: dict[str, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(str(y), []).append(i)
    classes = sorted(by_class)
    counts = {c: k // len(classes) for c in classes}
    for c in rng.sample(classes, k % len(classes)):
        counts[c] += 1
    short = [c for c in classes if counts[c] > len(by_class[c])]
    if short:
        raise UserInputError(f"the pool has too few examples of classes {short} for {k} balanced demonstrations")
    chosen = [i for c in classes for i in rng.sample(by_class[c], counts[c])]
    rng.shuffle(chosen)  # grouped by class, the last class would dominate by recency (Zhao et al. 2021)
    return chosen


def select_knn(query: torch.Tensor, pool: torch.Tensor, k: int) -> list[int]:
    """query (D,), pool (N, D) embeddings -> the k most cosine-similar pool indices, most similar first."""
    if k > pool.shape[0]:
        raise UserInputError(f"cannot choose {k} demonstrations from a pool of {pool.shape[0]}")
    sims = F.cosine_similarity(pool, query[None], dim=-1)  # (N,)
    return sims.topk(k).indices.tolist()


@torch.no_grad()
def embed_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 32) -> torch.Tensor:
    """Mean-pooled last hidden states over real tokens: (N, D). Encoder-decoder models pool their encoder."""
    device = next(model.parameters()).device
    limit, rows = model.config.max_seq_len, []
    for start in range(0, len(texts), batch_size):
        ids = [tokenizer.encode(t)[:limit] or [tokenizer.pad_id] for t in texts[start:start + batch_size]]
        width = max(len(i) for i in ids)
        x = torch.tensor([i + [tokenizer.pad_id] * (width - len(i)) for i in ids], device=device)  # (B, T)
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=device)  # (B, T)
        if model.config.arch == "encoder-decoder":
            h = model.encode(x, attention_mask=mask)[0]
        else:
            h = model(x, attention_mask=mask).last_hidden_state  # (B, T, D)
        m = mask.unsqueeze(-1).to(h.dtype)
        rows.append(((h * m).sum(1) / m.sum(1)).float().cpu())
    return torch.cat(rows) if rows else torch.empty(0, 0)


@dataclass
class FewShot:
    """Builds k-shot prompts; see the module docstring.

    Args:
        template: the prompt template (answers of demonstrations fill its ``{z}``).
        verbalizer: gives each demonstration's answer (the first word of its label).
        k: demonstrations per prompt (0: zero-shot).
        selection: "random", "balanced" or "knn" (knn needs ``model`` and ``tokenizer`` in :meth:`select`).
        order: "given", "random" or "nearest-last"; default: "nearest-last" for knn, else "given".
        separator: written between demonstrations and before the query.
        seed: seeds every random choice.
    """

    template: Template
    verbalizer: Verbalizer
    k: int = 4
    selection: str = "random"
    order: str | None = None
    separator: str = "\n\n"
    seed: int = 0
    _pool_embeddings: tuple | None = field(default=None, repr=False)  # (pool, its (N, D) embeddings)

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        self.order = self.order or ("nearest-last" if self.selection == "knn" else "given")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.order == "nearest-last" and self.selection != "knn":
            raise ValueError("order='nearest-last' needs selection='knn'")
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")

    def select(self, pool: Sequence[dict], queries: Sequence[dict], model=None, tokenizer=None) -> list[list[int]]:
        """Pool indices of the demonstrations of each query, in prompt order."""
        if self.k == 0:
            return [[] for _ in queries]
        if self.selection == "knn":
            if model is None or tokenizer is None:
                raise ValueError("knn selection embeds examples with the model: pass model and tokenizer")
            # the pool is embedded once, however many query batches follow
            if self._pool_embeddings is None or self._pool_embeddings[0] is not pool:
                texts = [" ".join(row_texts(r)) for r in pool]
                self._pool_embeddings = (pool, embed_texts(model, tokenizer, texts))
            pool_emb = self._pool_embeddings[1]
            query_emb = embed_texts(model, tokenizer, [" ".join(row_texts(q)) for q in queries])
        chosen = []
        for i in range(len(queries)):
            rng = random.Random(f"{self.seed}:{i}")
            if self.selection == "random":
                idx = select_random(len(pool), self.k, rng)
            elif self.selection == "balanced":
                idx = select_balanced([r["label"] for r in pool], self.k, rng)
            else:
                idx = select_knn(query_emb[i], pool_emb, self.k)
            if self.order == "random":
                rng.shuffle(idx)
            elif self.order == "nearest-last":
                idx = idx[::-1]
            chosen.append(idx)
        return chosen

    def context(self, pool: Sequence[dict], indices: Sequence[int]) -> str:
        """The demonstrations, each followed by the separator."""
        return "".join(
            self.template.fill(*row_texts(pool[i]), z=self.verbalizer.answer(pool[i]["label"])) + self.separator
            for i in indices
        )

    def prompt(self, context: str, query: dict | Sequence[str]) -> Prompt:
        """The query's prompt behind ``context``; ``query`` is a data row or its input texts."""
        texts = row_texts(query) if isinstance(query, dict) else tuple(query)
        parts = self.template.split(*texts)
        return Prompt(context + parts.prefix, parts.space, parts.suffix)

    def prompts(self, pool: Sequence[dict], queries: Sequence[dict], model=None, tokenizer=None) -> list[Prompt]:
        """One k-shot prompt per query."""
        chosen = self.select(pool, queries, model, tokenizer)
        return [self.prompt(self.context(pool, idx), q) for idx, q in zip(chosen, queries)]


@dataclass
class ChainOfThought:
    """Chain-of-thought prompts (Wei et al. 2022): demonstrations show a rationale, then the answer.

    Args:
        question: template of the question; its slots are the input texts.
        answer: template of a solved answer with ``{rationale}`` and ``{z}``.
        pattern: regular expression whose first group is the answer in generated text.
        separator: between demonstrations and before the query.

    Example:
        >>> cot = ChainOfThought()
        >>> p = cot.prompt([(("2 + 3?",), "2 plus 3 is 5.", "5")], "4 + 1?")
        >>> print(p)
        Q: 2 + 3?
        A: 2 plus 3 is 5. The answer is 5.
        <BLANKLINE>
        Q: 4 + 1?
        A:
        >>> cot.extract(" 4 plus 1 is 5. The answer is 5.")
        '5'
    """

    question: str = "Q: {x}\nA:"
    answer: str = " {rationale} The answer is {z}."
    pattern: str = r"[Tt]he answer is\s*(.+?)\s*(?:\.\s|\.$|\n|$)"
    separator: str = "\n\n"

    def demonstration(self, texts: Sequence[str], rationale: str, answer: str) -> str:
        return Template(self.question).fill(*texts, z="") + self.answer.format(rationale=rationale, z=answer)

    def prompt(self, demonstrations: Sequence[tuple[Sequence[str], str, str]], *query: str) -> str:
        """``demonstrations``: (input texts, rationale, answer) triples; ``query``: the input texts."""
        demos = "".join(self.demonstration(t, r, a) + self.separator for t, r, a in demonstrations)
        return demos + Template(self.question).fill(*query, z="")

    def extract(self, generated: str) -> str | None:
        """The answer in a generated continuation (the first match of ``pattern``), or None."""
        found = re.search(self.pattern, generated)
        return found.group(1).strip() if found else None

    def predict(self, model, tokenizer, demonstrations, queries: Sequence[Sequence[str]], *,
                max_new_tokens: int = 64) -> list[str | None]:
        """Greedy-decode each query's rationale with the model and extract its answer (None if absent)."""
        prompts = [self.prompt(demonstrations, *q) for q in queries]
        outputs = generate_text(model, tokenizer, prompts, max_new_tokens=max_new_tokens, stop_strings=[self.separator])
        return [self.extract(o) for o in outputs]
