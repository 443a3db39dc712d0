"""Batches sampled across languages with a temperature (XLM, Conneau & Lample 2019, §3.1; mBART, Liu et al. 2020).

A multilingual corpus is unbalanced: sampling documents in proportion to their counts would starve the small
languages, and sampling languages uniformly would repeat them endlessly. Each batch's language i is drawn with

    q_i = p_i^alpha / sum_j p_j^alpha,        p_i = n_i / sum_j n_j      (n_i: samples of language i)

alpha = 1 keeps the corpus proportions, alpha = 0 is uniform; mBART uses 0.7. A batch holds one language, as
in fairseq's multilingual denoising, and carries its language code with every example: the raw batch is a
list of ``(language, ids)`` pairs for an objective such as
:class:`lmforge.objectives.multilingual_denoising.MultilingualDenoising`.

The language of batch k depends only on (seed, k), and each language's dataset keeps its own position, so
``state_dict()`` / ``load_state_dict()`` resume exactly. The stream never ends: a language whose data runs
out starts its next epoch.

Example:
    >>> [round(q, 3) for q in temperature_probs([900, 100], alpha=0.7)]
    [0.823, 0.177]
    >>> mix = LanguageMixture({"en": [["a1"], ["a2"]], "es": [["b1"]]}, sizes={"en": 2, "es": 1}, alpha=0.0)
    >>> batches = iter(mix)
    >>> [next(batches) for _ in range(3)]     # "es" has one batch: drawn twice, it starts its next epoch
    [[('es', 'b1')], [('es', 'b1')], [('en', 'a1')]]
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lmforge.errors import UserInputError


def temperature_probs(sizes: Sequence[int], alpha: float) -> list[float]:
    """q_i = p_i^alpha / sum_j p_j^alpha with p_i = n_i / sum n (see the module docstring)."""
    if not 0.0 <= alpha <= 1.0:
        raise UserInputError(f"alpha={alpha}: the language sampling temperature must be in [0, 1] (mBART: 0.7)")
    n = np.asarray(sizes, dtype=np.float64)
    if n.size == 0 or (n <= 0).any():
        raise UserInputError(f"every language needs at least one sample (sizes {list(sizes)})")
    q = (n / n.sum()) ** alpha
    return (q / q.sum()).tolist()


class LanguageMixture:
    """An endless stream of one-language batches, the language drawn per batch with temperature ``alpha``.

    Args:
        datasets: language code -> re-iterable source of raw batches (lists of examples), e.g. a
            :class:`~lmforge.data.DocumentDataset` per language; their ``state_dict()`` are kept.
        sizes: language -> sample count n_i (default: each dataset's ``num_samples()``).
        alpha: the temperature (see :func:`temperature_probs`).
        seed: seed of the language draws.
    """

    def __init__(self, datasets: dict[str, Iterable], *, sizes: dict[str, int] | None = None, alpha: float = 0.7,
                 seed: int = 0) -> None:
        if not datasets:
            raise UserInputError("a language mixture needs at least one language")
        self.datasets = dict(datasets)
        self.languages = list(self.datasets)
        sizes = sizes or {lang: ds.num_samples() for lang, ds in self.datasets.items()}
        self.probs = temperature_probs([sizes[lang] for lang in self.languages], alpha)
        self.alpha, self.seed = alpha, seed
        self.batch = 0  # batches drawn so far: the next one's language is language_of(self.batch)
        self._iters: dict[str, Any] = {}

    def language_of(self, k: int) -> str:
        """The language of batch ``k``: a function of (seed, k) alone."""
        rng = np.random.default_rng([self.seed, k])
        return self.languages[int(rng.choice(len(self.languages), p=self.probs))]

    def _next_of(self, lang: str):
        for _ in range(2):  # at most one epoch boundary per language per batch
            if lang not in self._iters:
                self._iters[lang] = iter(self.datasets[lang])
            try:
                return next(self._iters[lang])
            except StopIteration:
                del self._iters[lang]
        raise UserInputError(f"language {lang!r}: its data set yields no batch")

    def __iter__(self):
        while True:
            lang = self.language_of(self.batch)
            raw = self._next_of(lang)
            self.batch += 1  # before yielding: a state saved now resumes after this batch
            yield [(lang, example) for example in raw]

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "seed": self.seed, "alpha": self.alpha, "languages": list(self.languages),
                "datasets": {lang: copy.deepcopy(ds.state_dict()) for lang, ds in self.datasets.items()
                             if hasattr(ds, "state_dict")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "alpha", "languages"):
            if state.get(key) != getattr(self, key):
                raise UserInputError(f"cannot resume: saved {key}={state.get(key)!r} but this mixture has "
                                     f"{getattr(self, key)!r}")
        self.batch = int(state["batch"])
        for lang, saved in state.get("datasets", {}).items():
            self.datasets[lang].load_state_dict(saved)
        self._iters.clear()  # the next iteration continues from the restored positions
