"""Prompting frozen language models, and instruction tuning (Liu et al. 2021, "Pre-train, Prompt, and Predict").

    template.py     Template: [x] slots and the [z] answer slot; cloze and prefix prompts
    verbalizer.py   Verbalizer: answers -> labels; answer log-likelihood scoring (decoder / seq2seq / MLM)
    icl.py          FewShot: k demonstrations (random / balanced / knn); ChainOfThought
    calibration.py  contextual calibration (Zhao et al. 2021)
    classify.py     classify(): template + verbalizer + demonstrations + calibration -> predictions
    generative.py   generative few-shot (translation, QA-style answers, chain of thought): score against k
    instruct.py     chat templates, response-only SFT collator, packing (Ouyang et al. 2022; Wei et al. 2022)

Example:
    >>> from lmforge.prompting import Template, Verbalizer
    >>> Template("Review: {x} Overall, it was a {z} movie.").split("Loved it.").prefix
    'Review: Loved it. Overall, it was a'
"""

from lmforge.prompting.calibration import CONTENT_FREE, calibrate, content_free_prediction
from lmforge.prompting.classify import classify
from lmforge.prompting.icl import ChainOfThought, FewShot, embed_texts, select_balanced, select_knn, select_random
from lmforge.prompting.instruct import ChatTemplate, SFTCollator, build_instruct_dataset, finetune_instruct
from lmforge.prompting.template import Prompt, Template
from lmforge.prompting.verbalizer import (
    Verbalizer,
    score_answers,
    score_cloze,
    score_continuations,
    score_continuations_batch,
    score_seq2seq,
)

__all__ = [
    "CONTENT_FREE", "ChainOfThought", "ChatTemplate", "FewShot", "Prompt", "SFTCollator", "Template", "Verbalizer",
    "build_instruct_dataset", "calibrate", "classify", "content_free_prediction", "embed_texts", "finetune_instruct",
    "score_answers", "score_cloze", "score_continuations", "score_continuations_batch", "score_seq2seq",
    "select_balanced", "select_knn", "select_random",
]
