"""The Task class for each task name; :func:`build_task` makes one for a spec."""

from __future__ import annotations

from lmforge.align.reward import RewardTask
from lmforge.tasks.classification import ClassifyTask, MultilabelTask, RegressTask
from lmforge.tasks.multiple_choice import MultipleChoiceTask
from lmforge.tasks.qa import QATask
from lmforge.tasks.seq2seq import Seq2SeqTask
from lmforge.tasks.tagging import TagTask
from lmforge.tasks.text2text import Text2TextTask

TASK_CLASSES = {"classify": ClassifyTask, "regress": RegressTask, "multilabel": MultilabelTask, "tag": TagTask,
                "qa": QATask, "multiple-choice": MultipleChoiceTask, "seq2seq": Seq2SeqTask,
                "text2text": Text2TextTask, "reward": RewardTask}


def build_task(spec, tokenizer, config):
    """The :class:`~lmforge.tasks.base.Task` for ``spec.task`` (encoding, collation, prediction, metrics)."""
    return TASK_CLASSES[spec.task](spec, tokenizer, config)
