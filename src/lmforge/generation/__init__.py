"""Text generation: greedy, beam search and sampling for decoders and encoder-decoders.

    config.py     GenerationConfig: every setting, validated
    stepper.py    the model fed one token at a time (left padding, positions, KV cache)
    compiled.py   compile=True: the token step as one torch.compile graph over a static KV cache
    sampling.py   logits processors: repetition penalty, no-repeat-n-gram, temperature, top-k/p, min-p
    stopping.py   EOS and stop strings
    search.py     the greedy/sampling loop and beam search
    generate.py   generate / generate_text / stream
    slots.py      SlotBatch: rows of a static KV cache that sequences join and leave (continuous batching)

Example:
    >>> import torch, lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, num_beams=2).sequences.shape
    torch.Size([1, 5])
"""

from lmforge.generation.config import GenerationConfig
from lmforge.generation.generate import (
    GenerationOutput,
    TextStream,
    decode_outputs,
    encode_prompt,
    generate,
    generate_text,
    stream,
)
from lmforge.generation.sampling import (
    LogitsPipeline,
    min_p_filter,
    no_repeat_ngram_mask,
    repetition_penalty,
    top_k_filter,
    top_p_filter,
)
from lmforge.generation.stopping import EosCriterion, StopStrings, cut_at_stop

__all__ = [
    "EosCriterion",
    "GenerationConfig",
    "GenerationOutput",
    "LogitsPipeline",
    "StopStrings",
    "TextStream",
    "cut_at_stop",
    "decode_outputs",
    "encode_prompt",
    "generate",
    "generate_text",
    "min_p_filter",
    "no_repeat_ngram_mask",
    "repetition_penalty",
    "stream",
    "top_k_filter",
    "top_p_filter",
]
