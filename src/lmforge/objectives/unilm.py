"""UniLM: one shared Transformer encoder trained as four language models through its attention mask
(Dong et al. 2019, "Unified Language Model Pre-training for Natural Language Understanding and Generation",
§2.3 and Fig. 1).

Every row is a cloze task: tokens are chosen and corrupted as in BERT's masked LM (15%, 80/10/10), and the
model predicts them. What a position may see depends on the row's language model, drawn per row:

    bidirectional   every token sees every token                                   (BERT)
    left-to-right   position i sees positions j <= i                                (GPT)
    right-to-left   position i sees positions j >= i
    seq2seq         the source s (the first P tokens) is bidirectional; a target position i sees the
                    whole source and the target up to itself (j < P or j <= i)

The paper's mixture within a batch is 1/3 bidirectional, 1/3 seq2seq, 1/6 left-to-right and 1/6
right-to-left (the ``mixture`` option, in that order). The seq2seq split P is uniform on 1 .. n-1 over the
row's n tokens (the paper packs two text segments; a contiguous text cut at a random point plays that role).
The (B, T, T) ``attention_mask`` is complete (the model adds nothing); padding keys are never seen.

seq2seq mask, P = 2, n = 4 (``1`` = query i may attend key j)::

    key j ->  0 1 2 3
    query 0   1 1 . .
    query 1   1 1 . .
    query 2   1 1 1 .
    query 3   1 1 1 1

Example::

    >>> unilm_mask(torch.tensor([3]), torch.tensor([2]), torch.ones(1, 4, dtype=torch.bool))[0].int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    >>> objective = UniLM(vocab_size=50, mask_token_id=3, pad_token_id=0, seed=0)
    >>> batch = objective([[10, 11, 12, 13], [14, 15]])
    >>> batch["attention_mask"].shape, batch["labels"].shape
    (torch.Size([2, 4, 4]), torch.Size([2, 4]))
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from lmforge.objectives.mlm import MaskedLM

KINDS = ("bidirectional", "left-to-right", "right-to-left", "seq2seq")
PAPER_MIXTURE = (1 / 3, 1 / 6, 1 / 6, 1 / 3)
BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = range(4)


def unilm_mask(kinds: torch.Tensor, prefix: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """UniLM's self-attention masks.

    Args:
        kinds: (B,) indices into :data:`KINDS`.
        prefix: (B,) source lengths P (read for seq2seq rows only).
        real: (B, T) bool, False on padding.
    Returns:
        (B, T, T) bool, True where query i may attend key j.
    """
    T = real.size(1)
    i = torch.arange(T)[:, None]  # (T, 1) queries
    j = torch.arange(T)[None, :]  # (1, T) keys
    k = kinds[:, None, None]  # (B, 1, 1)
    in_source = j < prefix[:, None, None]  # (B, 1, T)
    allowed = ((k == BIDIRECTIONAL)
               | ((k == LEFT_TO_RIGHT) & (j <= i))
               | ((k == RIGHT_TO_LEFT) & (j >= i))
               | ((k == SEQ2SEQ) & ((j <= i) | in_source)))  # (B, T, T)
    return allowed & real[:, None, :]


class UniLM(MaskedLM):
    """UniLM collator: ``MaskedLM``'s ``input_ids``/``labels`` (B, T) with a per-row (B, T, T) ``attention_mask``.

    Args:
        mixture: weights of the bidirectional, left-to-right, right-to-left and seq2seq rows (paper: 1/3, 1/6,
            1/6, 1/3).
        the rest: :class:`~lmforge.objectives.mlm.MaskedLM`'s options.
    """

    # MaskedLM's options and ``mixture``, spelled out for callers that fill options by name (lmforge pretrain).
    __signature__ = inspect.signature(MaskedLM).replace(parameters=[
        *inspect.signature(MaskedLM).parameters.values(),
        inspect.Parameter("mixture", inspect.Parameter.KEYWORD_ONLY, default=PAPER_MIXTURE)])

    def __init__(self, *, mixture: Sequence[float] = PAPER_MIXTURE, **mlm_options):
        super().__init__(**mlm_options)
        weights = torch.as_tensor(list(mixture), dtype=torch.float)
        if weights.shape != (len(KINDS),) or bool((weights < 0).any()) or float(weights.sum()) <= 0:
            raise ValueError(f"mixture must be {len(KINDS)} non-negative weights ({', '.join(KINDS)}), "
                             f"got {list(mixture)}")
        self.mixture = weights / weights.sum()

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        batch = super().__call__(examples)
        real = batch["attention_mask"].bool()  # (B, T)
        B = real.size(0)
        kinds = torch.multinomial(self.mixture, B, replacement=True, generator=self.generator)  # (B,)
        n = real.sum(1)  # (B,)
        prefix = 1 + (torch.rand(B, generator=self.generator) * (n - 1).clamp(min=0)).long()  # (B,) in 1..n-1
        batch["attention_mask"] = unilm_mask(kinds, prefix, real)
        return batch
