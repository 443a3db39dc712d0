"""What every baseline shares: its settings (``--baseline-option``), the reading of a text (+ pair), and the
shape its tensors take in the Trainer's checkpoints.

The classification baselines (:mod:`lmforge.evaluation.baselines`) and those of the other task types
(:mod:`lmforge.evaluation.task_baselines`) both read these; neither imports the other's module for them.

Example:
    >>> BaselineOptions.parse(["C=0.5", "lead=2"]).lead
    2
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lmforge.errors import UserInputError
from lmforge.evaluation.linear_baselines import LINEAR
from lmforge.evaluation.word_vocab import VECTORS
from lmforge.tasks.base import text_of
from lmforge.tasks.data import Table
from lmforge.tasks.spec import TaskSpec

CLASSIFY_BASELINES = (*LINEAR, "bilstm", "cnn")  # static names: see lmforge.evaluation.baselines
PAIR_SEPARATOR = " [SEP] "
# The neural baselines' training defaults (Adam at 1e-3, Kim's batch size), where fine-tuning's differ.
NEURAL_DEFAULTS = {"lr": 1e-3, "batch_size": 50, "schedule": "constant", "weight_decay": 0.0}


@dataclass
class BaselineOptions:
    """The baselines' own settings. ``C``: inverse L2 strength of the linear models. Neural: ``embed_dim``,
    ``hidden`` (BiLSTM units per direction), ``filters`` (CNN filters per width 3, 4, 5), ``dropout``,
    ``vectors`` (random | word2vec, trained on the training texts), ``min_count`` (rarer words are <unk>),
    ``max_words`` read per text. ``alpha``: ridge penalty (tfidf-ridge). ``c1``, ``c2``, ``max_iterations``: the
    CRF's L1/L2 strengths and L-BFGS iterations. ``window``, ``max_answer_words``: qa-window's words on each side
    and longest answer. ``lead``: sentences lead-3 keeps."""

    C: float = 1.0
    embed_dim: int = 100
    hidden: int = 100
    filters: int = 100
    dropout: float = 0.5
    vectors: str = "random"
    min_count: int = 1
    max_words: int = 256
    alpha: float = 1.0
    c1: float = 0.1
    c2: float = 0.1
    max_iterations: int = 100
    window: int = 10
    max_answer_words: int = 4
    lead: int = 3

    def __post_init__(self) -> None:
        if self.vectors not in VECTORS:
            raise UserInputError(f"baseline option vectors={self.vectors!r}: choose one of {', '.join(VECTORS)}")
        for key in ("C", "embed_dim", "hidden", "filters", "min_count", "max_words", "alpha", "max_iterations",
                    "window", "max_answer_words", "lead"):
            if not getattr(self, key) > 0:
                raise UserInputError(f"baseline option {key}={getattr(self, key)!r} must be > 0")
        for key in ("c1", "c2"):
            if not getattr(self, key) >= 0:
                raise UserInputError(f"baseline option {key}={getattr(self, key)!r} must be >= 0")
        if not 0.0 <= self.dropout < 1.0:
            raise UserInputError(f"baseline option dropout={self.dropout!r} must be in [0, 1)")

    @classmethod
    def parse(cls, pairs: list[str] | None) -> "BaselineOptions":
        """``["C=0.5", "vectors=word2vec"]`` -> options, each value converted to its field's type."""
        defaults, given = asdict(cls()), {}
        for pair in pairs or []:
            key, _, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if key not in defaults or not value:
                raise UserInputError(f"--baseline-option {pair!r}: expected KEY=VALUE with KEY one of "
                                     f"{', '.join(defaults)}")
            try:
                given[key] = type(defaults[key])(value)
            except ValueError:
                raise UserInputError(f"--baseline-option {pair!r}: {key} must be a "
                                     f"{type(defaults[key]).__name__}") from None
        return cls(**given)


def texts_of(table: Table, spec: TaskSpec) -> list[str]:
    """Each row's input as one text: the text, or ``text [SEP] pair``."""
    cols = spec.columns()
    table.require(cols["text"], cols.get("text_pair"))
    out = [text_of(table, i, cols["text"]) for i in range(len(table))]
    if cols.get("text_pair"):
        out = [f"{t}{PAIR_SEPARATOR}{text_of(table, i, cols['text_pair'])}" for i, t in enumerate(out)]
    return out


class _Settings(dict):
    """A baseline's settings in the shape checkpoints store a model's config (``to_dict``)."""

    def to_dict(self) -> dict:
        return dict(self)


class Checkpointed:
    """What the Trainer's checkpoints hold of a neural baseline: its tensors, and its settings as the config."""

    def __init__(self, module: torch.nn.Module, name: str, options: BaselineOptions, labels: list) -> None:
        self.module = module
        self.config = _Settings(name=name, options=asdict(options), labels=list(labels))

    def state_dict(self, keep_vars: bool = False) -> dict[str, torch.Tensor]:
        return self.module.state_dict(keep_vars=keep_vars)

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True):
        return self.module.load_state_dict(state, strict=strict)


def planned(config, epochs: float | None, n_train: int, n_eval: int | None):
    """``config`` with ``max_steps`` from ``epochs`` over ``n_train`` examples (when given) and ``eval_batches``
    covering all ``n_eval`` evaluation examples (when there are any): the neural baselines' step plan."""
    if epochs is not None:
        if epochs <= 0:
            raise UserInputError(f"--epochs {epochs} must be > 0")
        config = config.updated({"max_steps": max(1, math.ceil(epochs * n_train / config.batch_size))},
                                source="baseline")
    if n_eval is not None:
        config = config.updated({"eval_batches": math.ceil(n_eval / config.batch_size)}, source="baseline")
    return config
