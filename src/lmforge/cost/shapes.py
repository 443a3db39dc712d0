"""Model shapes for a parameter count: a base preset scaled up or down, and the bundled preset nearest to it.

A Transformer block holds about 12·d² weights (4d² attention, 8d² a 4d-wide FFN), so N ≈ 12·L·d². Scaling a
base preset keeps its aspect ratio d/L, its head width and its FFN ratio, and solves for L; the exact
non-embedding count is then read off the model built on the meta device (nothing is allocated).

Example:
    >>> shape = scaled_shape("gpt-tiny", 2e6)
    >>> sorted(shape["overrides"]), 1e6 < shape["n"] < 4e6
    (['d_ff', 'd_model', 'n_heads', 'n_layers'], True)
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

import torch

from lmforge.config import ModelConfig, list_presets, resolve_config
from lmforge.models.transformer import Transformer


@lru_cache(maxsize=256)
def _non_embedding(cfg_json: str) -> int:
    with torch.device("meta"):
        return Transformer(ModelConfig.from_dict(json.loads(cfg_json))).num_parameters(True)


def non_embedding_parameters(cfg: ModelConfig) -> int:
    """N as Chinchilla counts it: the parameters without the token and position tables."""
    return _non_embedding(json.dumps(cfg.to_dict(), sort_keys=True))


def scaled_shape(base: str, n: float, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Overrides of ``base`` giving about ``n`` non-embedding parameters, and the exact count."""
    cfg = resolve_config(base).replace(**(overrides or {}))
    head = cfg.dim_per_head
    ratio = cfg.d_model / max(cfg.n_layers, 1)
    layers = max(1, round((n / (12 * ratio * ratio)) ** (1 / 3)))
    d_model = max(head, round(math.sqrt(n / (12 * layers)) / head) * head)
    shape = {"n_layers": layers, "d_model": d_model, "n_heads": d_model // head,
             "d_ff": max(1, round(cfg.d_ff / cfg.d_model * d_model))}
    if cfg.arch == "encoder-decoder":
        shape["n_decoder_layers"] = layers
    scaled = cfg.replace(**shape)
    return {"overrides": shape, "n": non_embedding_parameters(scaled)}


def nearest_preset(n: float) -> tuple[str, int]:
    """The bundled decoder preset whose non-embedding count is nearest ``n`` on a log scale."""
    best = None
    for name in list_presets():
        cfg = resolve_config(name)
        if cfg.arch != "decoder":
            continue
        count = non_embedding_parameters(cfg)
        gap = abs(math.log(count / n))
        if best is None or gap < best[0]:
            best = (gap, name, count)
    return best[1], best[2]
