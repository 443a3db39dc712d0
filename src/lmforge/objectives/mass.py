"""MASS: masked sequence-to-sequence pre-training (Song et al. 2019, "MASS: Masked Sequence to Sequence
Pre-training for Language Generation", §2.2).

One contiguous fragment x[u:v] of a sentence x (m tokens) is masked in the encoder input, every token of it
replaced by ``[MASK]``. The decoder predicts exactly that fragment, and nothing else::

    x               x1 x2 x3 x4 x5 x6 x7 x8          (u = 2, v = 6: k = v - u = 4 = 50% of m)
    encoder input   x1 x2 _  _  _  _  x7 x8
    decoder input   <s> x3 x4 x5                      (the fragment shifted right)
    labels          x3  x4 x5 x6
    position_ids    2   3  4  5                       (the fragment's positions in x)

The paper's k is about 50% of m, which its ablation finds best: k = 1 would be BERT's masked LM and k = m a
plain decoder-side language model. The start u is uniform over the positions that fit the fragment. A
one-token sentence (the tail of a document, cut into windows) has no context to keep: it is masked whole,
the k = m case. The decoder's tokens keep their positions in the sentence (``position_ids``, read by absolute
position tables), as in the paper, where the decoder sees only the fragment but at its place in x.

Example::

    >>> mass = Mass(mask_token_id=3, pad_token_id=0, seed=0)
    >>> batch = mass([[10, 11, 12, 13, 14, 15, 16, 17]])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[10, 11, 12, 13, 3, 3, 3, 3]], [[14, 15, 16, 17]])
    >>> batch["position_ids"].tolist(), batch["decoder_input_ids"].tolist()
    ([[4, 5, 6, 7]], [[0, 14, 15, 16]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import Seeded, as_ids, seq2seq_batch


class Mass(Seeded):
    """MASS collator: sentences -> encoder ``input_ids``/``attention_mask`` (B, S), decoder ``labels``/
    ``decoder_input_ids``/``decoder_attention_mask`` and the fragment's ``position_ids`` (B, L).

    Args:
        mask_token_id, pad_token_id: ids of ``[MASK]`` and padding.
        decoder_start_token_id: first decoder input; defaults to ``pad_token_id``.
        mask_ratio: k / m, the fragment's share of the sentence (paper: 0.5); at least one token, and one
            token is always left unmasked (but in a one-token sentence).
        seed: seed of the generator that draws the fragments.
    """

    def __init__(self, *, mask_token_id: int, pad_token_id: int, decoder_start_token_id: int | None = None,
                 mask_ratio: float = 0.5, seed: int = 0):
        super().__init__(seed)
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1), got {mask_ratio}")
        self.mask_token_id, self.pad_token_id, self.mask_ratio = mask_token_id, pad_token_id, mask_ratio
        self.decoder_start_token_id = pad_token_id if decoder_start_token_id is None else decoder_start_token_id

    def fragment(self, length: int) -> tuple[int, int]:
        """(u, v): the masked fragment x[u:v] of a sentence of ``length`` >= 1 tokens."""
        k = min(max(round(self.mask_ratio * length), 1), max(length - 1, 1))
        u = int(torch.randint(length - k + 1, (), generator=self.generator))
        return u, u + k

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        sources, targets, starts = [], [], []
        for x in examples:
            tokens = as_ids(x)
            if len(tokens) == 0:
                raise ValueError("MASS got an empty sentence: there is no fragment to mask")
            u, v = self.fragment(len(tokens))
            masked = tokens.clone()
            masked[u:v] = self.mask_token_id
            sources.append(masked)
            targets.append(tokens[u:v])
            starts.append(u)
        batch = seq2seq_batch(sources, targets, self.pad_token_id, self.decoder_start_token_id)
        L = batch["labels"].size(1)
        length = torch.tensor([len(t) for t in targets])[:, None]  # (B, 1)
        # Padding positions repeat the fragment's last position, so they never pass the sentence's end.
        offsets = torch.arange(L)[None, :].minimum(length - 1)  # (B, L)
        batch["position_ids"] = torch.tensor(starts)[:, None] + offsets
        return batch
