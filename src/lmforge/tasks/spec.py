"""`TaskSpec`: what a fine-tuned model does, as plain data saved in its folder as ``task.json``.

    task        input columns                         target                          head
    classify    text (+ text_pair)                    label (one class)               pooled -> C logits, CE
    regress     text (+ text_pair)                    label (a number)                pooled -> 1, MSE
    multilabel  text (+ text_pair)                    label (a set: list or "a,b")    pooled -> C logits, BCE
    tag         tokens (words)                        tags (one per word)             per token -> C, CE
    qa          question + context                    answers (text, char start)      per token -> start/end
    multiple-choice  context + each choice            label (the right choice's index)  pooled -> 1 per choice, CE
    seq2seq     source (+ task_prefix)                target text                     the model's LM head
    text2text   prefix + text (+ pair)                target text, or label_map[lbl]  the model's LM head
    reward      prompt + chosen, prompt + rejected    chosen beats rejected           pooled -> 1, Bradley-Terry

Column names default by task (``text``/``label``; ``tokens``/``tags``; ``question``/``context``/``answers``; ``context``/``choice``/``label``;
``source``/``target``) and are overridden by the ``*_column`` fields. ``labels`` is filled from the
training data (sorted; numbers numerically) and fixes the class ids.

A text-to-text spec with ``mixture`` trains several tasks at once, as T5 does: each entry is a dict of the
per-task fields (``name``, ``train``/``eval`` files, columns, ``task_prefix``, ``label_map``), and batches
mix the tasks in proportion to their sizes (capped by ``mixing_cap``, flattened by ``mixing_temperature``).

Example:
    >>> spec = TaskSpec(task="classify", text_column="sentence")
    >>> spec.columns()
    {'text': 'sentence', 'label': 'label'}
    >>> TaskSpec.from_dict(spec.to_dict()) == spec
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmforge.config import ConfigBase, ConfigError
from lmforge.tasks.gpt1_transforms import INPUT_TRANSFORMS

TASKS = ("classify", "regress", "multilabel", "tag", "qa", "multiple-choice", "seq2seq", "text2text",
         "reward")
HEAD_TASKS = ("classify", "regress", "multilabel", "tag", "qa", "multiple-choice", "reward")
GENERATIVE_TASKS = ("seq2seq", "text2text")
POOLINGS = ("cls", "mean", "last", "max")
LOSS_AVERAGES = ("token", "example")

# Which input/target columns each task reads, and their default names.
DEFAULT_COLUMNS = {
    "classify": {"text": "text", "label": "label"},
    "regress": {"text": "text", "label": "label"},
    "multilabel": {"text": "text", "label": "labels"},
    "tag": {"text": "tokens", "label": "tags"},
    "qa": {"text": "question", "text_pair": "context", "target": "answers"},
    # choices: a list in column ``choice``, or columns ``choice0``, ``choice1``, ... (SWAG: ``ending0``...)
    "multiple-choice": {"text": "context", "target": "choice", "label": "label"},
    "seq2seq": {"text": "source", "target": "target"},
    "text2text": {"text": "text", "target": "target"},
    "reward": {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"},
}


def column_defaults(role: str) -> str:
    """The default column of ``role`` per task, for ``--help``: the most common name first, then the exceptions.

    Example:
        >>> column_defaults("label")
        'label; multilabel: labels; tag: tags'
    """
    names = {task: cols[role] for task, cols in DEFAULT_COLUMNS.items() if role in cols}
    common = max(set(names.values()), key=list(names.values()).count)
    return "; ".join([common] + [f"{task}: {name}" for task, name in names.items() if name != common])


MIXTURE_KEYS = ("name", "train", "eval", "text_column", "text_pair_column", "label_column", "target_column",
                "task_prefix", "label_map")


@dataclass
class TaskSpec(ConfigBase):
    """Every setting of a task: see the module docstring.

    Field groups:
        what: ``task``, ``labels`` (class names, in id order).
        columns: ``text_column``, ``text_pair_column``, ``label_column``, ``target_column`` (None = the task's
            default, see :data:`DEFAULT_COLUMNS`); ``label_separator`` splits a multi-label string.
        formats: ``task_prefix`` (prepended to the input text: seq2seq, text2text), ``pair_prefix`` (put before
            the second text in text2text inputs, e.g. ``"sentence2: "``), ``label_map`` (text2text: label ->
            target word, e.g. ``{"0": "negative", "1": "positive"}``), ``input_transform`` (decoders: ``gpt1``
            writes GPT-1's ``[start] A [delim] B [extract]`` with learned tokens; ``gpt1-similarity`` also runs
            the pair in both orders and adds the two states; see :mod:`lmforge.tasks.gpt1_transforms`).
        head: ``pooling`` (cls | mean | last | max; None = by family: cls for encoders, last for decoders
            and encoder-decoders, i.e. the extract / eos token), ``head_hidden`` (a tanh dense layer before
            the classifier as in BART/RoBERTa; None = by family), ``classifier_dropout``, ``head_bilstm`` (a
            randomly initialised BiLSTM of this many layers under the head, encoders only: BERT's feature-based
            Table 7; 0 = none) and ``head_bilstm_hidden`` (its units per direction; None = d_model / 2), see
            :mod:`lmforge.tasks.bilstm_head`.
        lengths: ``max_length`` input tokens, ``max_target_length`` target tokens (generation stops there too),
            ``max_answer_length`` (QA span decoding, in tokens).
        no answer: ``null_threshold`` (qa, SQuAD 2.0): answer "no answer" when the [CLS] span's score beats the
            best span's by more than this (BERT's tau, tuned on dev); None = always answer (SQuAD 1.1).
        mixture: text2text multi-task entries; ``mixing_cap``, ``mixing_temperature`` (T5 section 3.5.2).
        loss: ``loss_average`` (seq2seq, text2text): ``token`` averages the loss over every target token of a
            batch; ``example`` averages each example's mean token loss, so a one-word label counts as much as
            a 40-token verse (fairseq's sentence averaging) - without it a mixture's short-target task gets a
            few percent of the gradient however often it is sampled.
    """

    task: str = "classify"
    labels: list[str] = field(default_factory=list)
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    target_column: str | None = None
    label_separator: str = ","
    task_prefix: str = ""
    pair_prefix: str = ""
    label_map: dict[str, str] = field(default_factory=dict)
    pooling: str | None = None
    head_hidden: bool | None = None
    classifier_dropout: float = 0.1
    head_bilstm: int = 0
    head_bilstm_hidden: int | None = None
    max_length: int = 256
    max_target_length: int = 128
    max_answer_length: int = 30
    null_threshold: float | None = None
    mixture: list[dict[str, Any]] = field(default_factory=list)
    mixing_cap: int | None = None
    mixing_temperature: float = 1.0
    loss_average: str = "token"
    input_transform: str = "plain"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def generative(self) -> bool:
        return self.task in GENERATIVE_TASKS

    def columns(self) -> dict[str, str]:
        """Role -> column name for the roles this task reads (``text``, ``text_pair``, ``label``, ``target``)."""
        out = dict(DEFAULT_COLUMNS[self.task])
        given = {"text": self.text_column, "text_pair": self.text_pair_column, "label": self.label_column,
                 "target": self.target_column}
        for role, name in given.items():
            if name is not None:
                out[role] = name
        if self.task == "text2text" and self.label_map:
            out.pop("target", None)  # a label map turns a label column into the target
            out["label"] = self.label_column or "label"
        return out

    def validate(self) -> "TaskSpec":
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"TaskSpec.{key}={getattr(self, key)!r} {why}")

        self.check_kinds()
        for key, kind in (("labels", list), ("label_map", dict), ("mixture", list)):
            if not isinstance(getattr(self, key), kind):
                raise bad(key, f"must be a {'mapping' if kind is dict else 'list'}")
        if self.task not in TASKS:
            raise bad("task", f"is not one of {', '.join(TASKS)}")
        if self.loss_average not in LOSS_AVERAGES:
            raise bad("loss_average", f"is not one of {', '.join(LOSS_AVERAGES)}")
        if self.loss_average != "token" and not self.generative:
            raise bad("loss_average", "is only used by the generative tasks (seq2seq, text2text)")
        if self.input_transform not in INPUT_TRANSFORMS:
            raise bad("input_transform", f"is not one of {', '.join(INPUT_TRANSFORMS)}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise bad("pooling", f"is not one of {', '.join(POOLINGS)}")
        for key in ("max_length", "max_target_length", "max_answer_length"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise bad("classifier_dropout", "must be in [0, 1)")
        if self.head_bilstm < 0:
            raise bad("head_bilstm", "must be >= 0 (BiLSTM layers under the head; 0 = none)")
        if self.head_bilstm and self.task not in HEAD_TASKS:
            raise bad("head_bilstm", f"needs a task with a head ({', '.join(HEAD_TASKS)})")
        if self.head_bilstm_hidden is not None and (self.head_bilstm_hidden < 1 or not self.head_bilstm):
            raise bad("head_bilstm_hidden", "must be >= 1 and needs head_bilstm >= 1")
        if self.mixing_temperature <= 0:
            raise bad("mixing_temperature", "must be > 0")
        if self.mixing_cap is not None and self.mixing_cap < 1:
            raise bad("mixing_cap", "must be >= 1")
        if len(set(self.labels)) != len(self.labels):
            raise bad("labels", "has duplicates")
        if self.label_map and self.task != "text2text":
            raise bad("label_map", "is only used by task='text2text'")
        words = list(self.label_map.values())
        if len(set(words)) != len(words):
            raise bad("label_map", "maps two labels to the same word; predictions could not be mapped back")
        if self.null_threshold is not None and self.task != "qa":
            raise bad("null_threshold", "is only used by task='qa'")
        if self.mixture and self.task != "text2text":
            raise bad("mixture", "is only used by task='text2text'")
        names = []
        for i, entry in enumerate(self.mixture):
            if not isinstance(entry, dict) or not entry.get("name"):
                raise ConfigError(f"TaskSpec.mixture[{i}] needs a 'name' (and its own columns, prefix, files)")
            unknown = sorted(set(entry) - set(MIXTURE_KEYS))
            if unknown:
                raise ConfigError(f"TaskSpec.mixture[{i}] ({entry['name']}): unknown key(s) {', '.join(unknown)}; "
                                  f"allowed: {', '.join(MIXTURE_KEYS)}")
            names.append(entry["name"])
        if len(set(names)) != len(names):
            raise bad("mixture", "has two entries with the same name")
        return self

    def sub_specs(self) -> dict[str, "TaskSpec"]:
        """The mixture's tasks as single text2text specs (name -> spec); ``{"": self}`` without a mixture."""
        if not self.mixture:
            return {"": self}
        shared = {k: v for k, v in self.to_dict().items() if k not in ("mixture",) + MIXTURE_KEYS}
        return {e["name"]: TaskSpec(**shared, **{k: v for k, v in e.items() if k not in ("name", "train", "eval")})
                for e in self.mixture}

    config_noun = "task setting"
    quote_keys = True

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "task spec") -> "TaskSpec":
        return super().from_dict(data, source)
