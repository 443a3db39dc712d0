"""Length extrapolation: a decoder's next-token loss at each position, evaluated past the length it trained at.

"Relative positions generalise to longer sequences; sinusoidal extrapolation doesn't really work": trained at
length L, a model is read at N > L and its loss is reported per bucket of positions. Position p's loss is the
cross-entropy of predicting token p + 1 from tokens 0..p (as the causal LM objective scores it, on blocks of
N + 1 tokens cut back to back from the text)::

    loss(bucket [a, b)) = sum over blocks and p in [a, b) of -log P(x_{p+1} | x_<=p) / (blocks x (b - a))

Only the positions beyond L are new to the model; how the loss there compares with the loss below L is the
measure (Press et al. 2022, ALiBi, Figure 1). To read a model past its ``max_seq_len`` it is rebuilt with a
longer one and the same weights: sinusoidal tables, RoPE frequencies and ALiBi slopes are functions of the
position, and T5's buckets and Shaw's clipped distances cover any distance. A learned absolute table has no
row beyond ``max_seq_len``, so it is refused, with the reason.

Example:
    >>> blocks(list(range(10)), 3)      # blocks of N + 1 = 4 tokens, back to back; the rest is dropped
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> buckets(4, 2)                   # positions 0..3 in buckets as wide as the training length
    [(0, 2), (2, 4)]
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from lmforge import datasets
from lmforge.data.loader import ShardSet
from lmforge.data.prepare import read_manifest
from lmforge.data.sources import DataError, iter_documents, resolve_inputs
from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer

# Position schemes whose encoding is defined at any position (the rest have a table of max_seq_len rows).
EXTRAPOLATING = ("sinusoidal", "rope", "alibi", "t5-bias", "relative", "none")


def text_ids(data: str, tokenizer, eos_id: int | None = None) -> list[int]:
    """The token ids of ``data`` (a shipped text corpus by name, e.g. ``corpus``, text files, or a prepared data
    folder: its validation split, the text pre-training held out), its documents joined by ``eos_id`` as packing
    joins them."""
    if (Path(data) / "manifest.json").is_file():
        return validation_ids(Path(data), tokenizer, eos_id)
    if data in datasets.names() and datasets.info(data).format == "text":
        docs = [r["text"] for r in datasets.load(data)]
    else:
        docs = list(iter_documents(resolve_inputs(data)))
    ids: list[int] = []
    for doc in docs:
        ids += tokenizer.encode(doc, add_special_tokens=False) + ([eos_id] if eos_id is not None else [])
    return ids


def validation_ids(folder: Path, tokenizer, eos_id: int | None) -> list[int]:
    """The validation split of a folder written by ``lmforge data prepare`` with ``tokenizer``, in file order."""
    manifest = read_manifest(folder)
    if tokenizer.sha256() != manifest["tokenizer"]["sha256"]:
        raise UserInputError(f"{folder} was prepared with another tokenizer than the model's: prepare the text with "
                             "the model's tokenizer, or give the text file instead")
    try:
        split = ShardSet(folder, "val")
    except DataError as exc:
        raise UserInputError(f"{exc}: length extrapolation reads the validation split of a prepared folder "
                             "(prepare with a --val-fraction above 0, or give a text file)") from None
    ids: list[int] = []
    for shard in range(len(split)):
        tokens, offsets = split.arrays(shard)
        for a, b in zip(offsets[:-1], offsets[1:]):
            ids += tokens[a:b].tolist() + ([eos_id] if eos_id is not None else [])
    return ids


def blocks(ids: Sequence[int], seq_len: int) -> list[list[int]]:
    """Back-to-back blocks of ``seq_len + 1`` ids (inputs and shifted targets), the partial last one dropped."""
    n = seq_len + 1
    return [list(ids[i:i + n]) for i in range(0, len(ids) - n + 1, n)]


def buckets(seq_len: int, width: int) -> list[tuple[int, int]]:
    """Position ranges ``[a, b)`` of ``width`` covering ``0..seq_len``."""
    return [(a, min(a + width, seq_len)) for a in range(0, seq_len, width)]


def at_length(model, seq_len: int):
    """``model`` as it reads ``seq_len`` positions: itself, or a copy with a longer ``max_seq_len`` and the same
    weights. A learned position table, or a model that is no decoder, is refused in one line."""
    cfg = model.config
    if cfg.arch != "decoder":
        raise UserInputError(f"length extrapolation scores next-token loss: it needs a decoder, not {cfg.arch!r}")
    if seq_len <= cfg.max_seq_len:
        return model
    if cfg.position not in EXTRAPOLATING:
        raise UserInputError(f"--seq-len {seq_len}: position scheme {cfg.position!r} has a table of max_seq_len="
                             f"{cfg.max_seq_len} trained rows and none beyond; learned absolute positions cannot be "
                             f"read past {cfg.max_seq_len} (sinusoidal, rope, alibi, t5-bias and relative can)")
    longer = Transformer(cfg.replace(max_seq_len=seq_len)).to(next(model.parameters()).device)
    longer.load_state_dict(model.state_dict())  # position buffers are not saved: the new ones are longer
    return longer.eval()


@torch.no_grad()
def position_losses(model, ids: Sequence[int], seq_len: int, batch_size: int = 8,
                    max_blocks: int | None = None) -> tuple[torch.Tensor, int]:
    """((seq_len,) summed next-token NLL at each position over the blocks, number of blocks)."""
    model = at_length(model, seq_len)
    device = next(model.parameters()).device
    cut = blocks(ids, seq_len)[:max_blocks]
    if not cut:
        raise UserInputError(f"the text has {len(ids)} tokens: too few for one block of --seq-len {seq_len} + 1")
    was_training = model.training
    model.eval()
    total = torch.zeros(seq_len, dtype=torch.float64)
    try:
        for start in range(0, len(cut), batch_size):
            x = torch.tensor(cut[start:start + batch_size], device=device)  # (B, N + 1)
            logits = model(x[:, :-1]).logits.float()  # (B, N, V)
            nll = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")  # (B, N)
            total += nll.sum(0).double().cpu()
    finally:
        model.train(was_training)
    return total, len(cut)


def report(model, ids: Sequence[int], seq_len: int, train_len: int | None = None, batch_size: int = 8,
           max_blocks: int | None = None) -> dict:
    """Loss over all positions and per bucket of ``train_len`` positions (default: the model's max_seq_len).

    Returns:
        ``{"seq_len", "train_len", "blocks", "loss", "ppl", "buckets": [{"positions": "a-b", "loss", "ppl",
        "beyond_training"}]}``.
    """
    train_len = train_len or model.config.max_seq_len
    total, n = position_losses(model, ids, seq_len, batch_size, max_blocks)
    loss = float(total.sum()) / (n * seq_len)
    rows = []
    for a, b in buckets(seq_len, train_len):
        value = float(total[a:b].sum()) / (n * (b - a))
        rows.append({"positions": f"{a}-{b - 1}", "loss": value, "ppl": math.exp(min(value, 700)),
                     "beyond_training": a >= train_len})
    return {"seq_len": seq_len, "train_len": train_len, "blocks": n, "loss": loss, "ppl": math.exp(min(loss, 700)),
            "buckets": rows}
