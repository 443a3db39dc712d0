"""GPT-1's input transformations: structured inputs as one token sequence for a decoder (Radford et al. 2018, §3.3).

A causal decoder reads one sequence, so a task with two texts, or several choices, is written as ordered
sequences with three special tokens, randomly initialised and learned in fine-tuning::

    classification   [start] text [extract]
    entailment       [start] premise [delim] hypothesis [extract]
    similarity       [start] A [delim] B [extract]   and   [start] B [delim] A [extract]
                     (no natural order: both orders run, and their [extract] states are added, h = h_AB + h_BA,
                     before the linear output layer)
    multiple choice  [start] context [delim] answer_k [extract]   for each of the K answers: K sequences, one
                     score each, a softmax across them

The state of the last token, ``[extract]``, has read the whole sequence and feeds the head (pooling ``last``).

In lmforge this is the task option ``input_transform``: ``gpt1`` (classification, entailment, multiple choice)
or ``gpt1-similarity`` (pairs in both orders), for decoders. :func:`add_transform_tokens` adds the three
tokens to the tokenizer (as special tokens, after its vocabulary) and :func:`grow_token_embeddings` gives the
body one new embedding row per token, drawn like its initialisation; both are saved with the task folder.

Example:
    >>> import torch
    >>> from lmforge.models import Transformer
    >>> from lmforge.config import ModelConfig
    >>> body = Transformer(ModelConfig(arch="decoder", head="none", d_model=8, n_heads=2, d_ff=16, vocab_size=20))
    >>> grow_token_embeddings(body, 23).embed_tokens.weight.shape, body.config.vocab_size
    (torch.Size([23, 8]), 23)
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.errors import UserInputError

TOKENS = ("<|start|>", "<|delim|>", "<|extract|>")
INPUT_TRANSFORMS = ("plain", "gpt1", "gpt1-similarity")


def transform_ids(tokenizer) -> tuple[int, int, int]:
    """(start, delim, extract) ids of a tokenizer that has the three tokens (see :func:`add_transform_tokens`)."""
    ids = tuple(tokenizer.token_to_id(t) for t in TOKENS)
    if None in ids:
        raise UserInputError(f"the tokenizer has no GPT-1 transformation tokens {', '.join(TOKENS)}: fine-tune with "
                             "input_transform gpt1, which adds them")
    return ids  # type: ignore[return-value]


def add_transform_tokens(tokenizer) -> tuple[int, int, int]:
    """Add [start], [delim] and [extract] to ``tokenizer`` (in place, once) as special tokens; their ids."""
    missing = [t for t in TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        tokenizer.backend.add_special_tokens(missing)
    return transform_ids(tokenizer)


def grow_token_embeddings(body: nn.Module, vocab_size: int) -> nn.Module:
    """Give ``body``'s token embedding ``vocab_size`` rows (in place): the old rows kept, the new ones drawn from
    N(0, initializer_range) as at initialisation. A body with an LM head is refused: its output layer would need
    the rows too, and the transformations serve head tasks."""
    cfg = body.config
    if getattr(body, "lm_head", None) is not None or getattr(body, "mlm_head", None) is not None:
        raise UserInputError(f"model {cfg.name!r} still has its LM head; the GPT-1 transformations are for head tasks "
                             "(classify, regress, multilabel, multiple-choice), which drop it")
    old = body.embed_tokens
    if vocab_size <= old.num_embeddings:
        return body
    grown = nn.Embedding(vocab_size, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        grown.weight[: old.num_embeddings] = old.weight
        nn.init.normal_(grown.weight[old.num_embeddings:], std=cfg.initializer_range)
    body.embed_tokens = grown
    body.config = cfg.replace(vocab_size=vocab_size)
    return body


def check_transform(transform: str, task: str, arch: str, has_pair: bool) -> None:
    """One line when ``transform`` does not fit the task or the model."""
    if transform not in INPUT_TRANSFORMS:
        raise UserInputError(f"input_transform={transform!r} is not one of {', '.join(INPUT_TRANSFORMS)}")
    if transform == "plain":
        return
    if arch != "decoder":
        raise UserInputError(f"input_transform={transform!r} writes inputs for a decoder; this model has arch={arch!r} "
                             "(encoders and encoder-decoders use their tokenizer's own template)")
    fits = ("classify", "regress", "multilabel") + (() if transform == "gpt1-similarity" else ("multiple-choice",))
    if task not in fits:
        raise UserInputError(f"input_transform={transform!r} does not fit task {task!r}; it fits {', '.join(fits)}")
    if transform == "gpt1-similarity" and not has_pair:
        raise UserInputError("input_transform='gpt1-similarity' runs a text pair in both orders: name the second "
                             "text's column (text_pair_column)")
