"""The unigram entropy of a prepared folder's training tokens: the loss of a model that ignores context.

The best prediction of a token that looks at nothing before it is the token's frequency, and its average
cross-entropy on the tokens it was counted on is the entropy of those frequencies,
``H = -sum_v p_v ln p_v`` (nats per token, the unit of ``eval_loss``). A causal LM whose held-out loss is
still near ``H`` has learnt word frequencies and little else: greedy decoding then repeats the most frequent
tokens. ``lmforge data prepare`` stores ``H`` in ``manifest.json`` (``unigram_entropy``) so that
``lmforge generate`` can say so (:mod:`lmforge.training.held_out`).

Counted: the training split's stored tokens, plus one boundary token (eos) per document, which the loaders
insert between documents and a causal LM learns to predict like any other token. The counts come from one
pass over the finished shards (``np.bincount``), so a preparation resumed after a crash counts every chunk.

Example (two tokens, each half the time: one bit, ln 2 nats)::

    >>> round(entropy([5, 5]), 6), entropy([7]), entropy([3, 0, 3]) == entropy([3, 3])
    (0.693147, 0.0, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def entropy(counts) -> float:
    """``-sum p ln p`` (nats) of the distribution proportional to ``counts`` (zeros are ignored)."""
    counts = np.asarray(counts, dtype=np.float64)
    counts = counts[counts > 0]
    if counts.size == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum()) + 0.0  # + 0.0: one symbol's entropy is 0.0, not -0.0


def unigram_entropy(folder: str | Path, manifest: dict[str, Any]) -> float | None:
    """The unigram entropy (nats per token) of the training split of the prepared ``folder`` described by
    ``manifest`` (see the module docstring); None when the split has no tokens."""
    folder = Path(folder)
    totals = np.zeros(0, dtype=np.int64)
    documents = 0
    for chunk in manifest.get("chunks", []):
        shard = chunk.get("train")
        if not shard or not shard["tokens"]:
            continue
        tokens = np.memmap(folder / shard["bin"], dtype=manifest["dtype"], mode="r")
        counts = np.bincount(tokens)
        if counts.size > totals.size:
            totals = np.pad(totals, (0, counts.size - totals.size))
        totals[:counts.size] += counts
        documents += shard["documents"]
    if not totals.any():
        return None
    boundary = manifest.get("tokenizer", {}).get("boundary_token_id")
    if boundary is not None:
        # The stored tokens never hold special tokens, so the boundary is a symbol of its own.
        totals = np.append(totals, documents)
    return round(entropy(totals), 6)
