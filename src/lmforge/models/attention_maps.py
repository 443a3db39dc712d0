"""Attention maps: what each head of each layer attends to on one text, as heatmaps.

The lectures draw the softmax weights A = softmax(Q K^T / sqrt(d)) of single heads (e.g. a head that attends
to the previous token, or to [SEP]). :func:`attention_maps` runs a model once with ``output_attentions=True``
and keeps, per attention kind, one (H, T, S) map per layer with the query and key tokens:

    encoder / decoder-only   "self"                  (T, T)
    encoder-decoder          "encoder", "decoder"    (S, S), (T, T)
                             "cross"                 (T, S): decoder queries over the source

:func:`draw_attention_maps` writes ``KIND/layerLL-headHH.png`` per layer and head and one ``KIND-grid.png``
(layers as rows, heads as columns) per kind. The maps grow as T x S and the images as layers x heads, so
texts longer than ``max_tokens`` are refused rather than filling the disk.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.models.transformer import Transformer
    >>> model = Transformer(ModelConfig(arch="encoder", head="mlm", d_model=16, n_heads=2, d_ff=32, vocab_size=50,
    ...                                 n_layers=2))
    >>> maps = attention_maps(model, [5, 6, 7], tokens=["a", "b", "c"])
    >>> list(maps), len(maps["self"].weights), tuple(maps["self"].weights[0].shape)
    (['self'], 2, (2, 3, 3))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lmforge.errors import UserInputError
from lmforge.utils.figures import figure, png
from lmforge.utils.io import atomic_write_bytes, staged_files

MAX_TOKENS = 128  # default limit on the text's tokens (query and key side)


@dataclass
class AttentionMaps:
    """One attention kind: ``weights`` [layers x (H, T, S)], the query tokens (T) and the key tokens (S)."""

    weights: list[torch.Tensor]
    queries: list[str]
    keys: list[str]


def check_length(n_tokens: int, max_tokens: int, what: str = "the text") -> None:
    """One line when ``n_tokens`` exceeds the limit on drawn maps."""
    if n_tokens > max_tokens:
        raise UserInputError(f"{what} has {n_tokens} tokens, more than the attention-map limit of {max_tokens}; "
                             f"shorten it or raise --max-tokens")


@torch.no_grad()
def attention_maps(model, ids: list[int], tokens: list[str], target_ids: list[int] | None = None,
                   target_tokens: list[str] | None = None) -> dict[str, AttentionMaps]:
    """Attention weights of ``model`` (an lmforge Transformer) on one sequence, by kind (see the module docstring).
    An encoder-decoder reads ``ids`` in its encoder and ``target_ids`` (default: the decoder start token) in its
    decoder."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)  # (1, T)
    try:
        if model.config.arch != "encoder-decoder":
            out = model(x, output_attentions=True)
            return {"self": AttentionMaps([a[0].float().cpu() for a in out.attentions], tokens, tokens)}
        if target_ids is None:
            target_ids, target_tokens = [model._decoder_start_id()], ["<start>"]
        y = torch.tensor([target_ids], device=device)
        out = model(x, decoder_input_ids=y, output_attentions=True)
    finally:
        model.train(was_training)

    def first(maps: list[torch.Tensor]) -> list[torch.Tensor]:
        return [a[0].float().cpu() for a in maps]

    return {"encoder": AttentionMaps(first(out.encoder_attentions), tokens, tokens),
            "decoder": AttentionMaps(first(out.attentions), target_tokens, target_tokens),
            "cross": AttentionMaps(first(out.cross_attentions), target_tokens, tokens)}


def _heatmap(ax, weights: torch.Tensor, queries: list[str], keys: list[str], title: str, labels: bool) -> None:
    ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_title(title, fontsize=8)
    if labels:
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
        ax.set_yticks(range(len(queries)), queries, fontsize=6)
    else:
        ax.set_xticks([]), ax.set_yticks([])


def draw_attention_maps(maps: dict[str, AttentionMaps], out: str | Path, max_tokens: int = MAX_TOKENS) -> list[Path]:
    """Write a heatmap per layer and head and a grid per kind under ``out``; returns the files written."""
    for kind, m in maps.items():
        check_length(max(len(m.queries), len(m.keys)), max_tokens, f"the {kind} sequence")
    out = Path(out)
    with staged_files(out) as staged:
        written = _draw(maps, staged)
    return [out / path.relative_to(staged) for path in written]


def _draw(maps: dict[str, AttentionMaps], out: Path) -> list[Path]:
    written = []
    for kind, m in maps.items():
        side = max(3.0, 0.25 * max(len(m.queries), len(m.keys)) + 1.5)
        for layer, weights in enumerate(m.weights):
            for head, w in enumerate(weights):  # (T, S)
                fig = figure(side, side)
                _heatmap(fig.add_subplot(), w, m.queries, m.keys, f"{kind} layer {layer} head {head}", True)
                fig.tight_layout()
                path = out / kind / f"layer{layer:02d}-head{head:02d}.png"
                atomic_write_bytes(path, png(fig))
                written.append(path)
        n_layers, n_heads = len(m.weights), m.weights[0].shape[0]
        fig = figure(1.6 * n_heads + 1, 1.6 * n_layers + 1)
        axes = fig.subplots(n_layers, n_heads, squeeze=False)
        for layer, weights in enumerate(m.weights):
            for head, w in enumerate(weights):
                _heatmap(axes[layer][head], w, m.queries, m.keys, f"L{layer} H{head}", False)
        fig.suptitle(f"{kind} attention (rows: layers, columns: heads)")
        path = out / f"{kind}-grid.png"
        atomic_write_bytes(path, png(fig))
        written.append(path)
    return written
