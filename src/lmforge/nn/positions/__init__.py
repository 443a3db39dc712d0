"""Positional encodings, one per file.

Absolute encodings are added to the embeddings (``sinusoidal``, ``learned``); relative ones act inside
attention: ``relative`` (Shaw et al. 2018) adds learned vectors to keys (and values), ``t5-bias`` and
``alibi`` add a per-head bias to the attention logits, ``rope`` rotates queries and keys, and ``deberta``
(He et al. 2021) adds content->position and position->content logit terms read from a shared table of
log-bucketed relative distances.
"""

from lmforge.nn.positions.alibi import ALiBi
from lmforge.nn.positions.deberta import DisentangledBias, RelativeEmbeddings
from lmforge.nn.positions.learned import LearnedPositions
from lmforge.nn.positions.rope import RotaryEmbedding, apply_rotary
from lmforge.nn.positions.shaw_relative import ShawRelativePositions
from lmforge.nn.positions.sinusoidal import SinusoidalPositions, sinusoidal_table
from lmforge.nn.positions.t5_bias import T5RelativeBias

__all__ = [
    "ALiBi",
    "DisentangledBias",
    "RelativeEmbeddings",
    "LearnedPositions",
    "RotaryEmbedding",
    "apply_rotary",
    "ShawRelativePositions",
    "SinusoidalPositions",
    "sinusoidal_table",
    "T5RelativeBias",
]
