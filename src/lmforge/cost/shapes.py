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
    # A GQA base keeps its query heads per key/value head, so the width moves in steps of whole groups.
    group = cfg.n_heads // cfg.n_kv_heads if cfg.n_kv_heads else 1
    step = head * group
    d_model = max(step, round(math.sqrt(n / (12 * layers)) / step) * step)
    shape = {"n_layers": layers, "d_model": d_model, "n_heads": d_model // head,
             "d_ff": max(1, round(cfg.d_ff / cfg.d_model * d_model))}
    if cfg.n_kv_heads:
        shape["n_kv_heads"] = shape["n_heads"] // group
    if cfg.arch == "encoder-decoder":
        shape["n_decoder_layers"] = layers
    scaled = cfg.replace(**shape)
    return {"overrides": shape, "n": non_embedding_parameters(scaled)}


FAMILIES = ("gpt", "llama", "moe", "dense", "any")


def preset_family(name: str, cfg: ModelConfig) -> str:
    """A decoder's family: ``moe`` for a mixture of experts, else its recipe (``gpt``: learned positions and
    LayerNorm, like GPT-2; ``llama``: RoPE, RMSNorm and SwiGLU)."""
    if cfg.moe_experts > 0:
        return "moe"
    return "llama" if cfg.position == "rope" or cfg.norm == "rmsnorm" else "gpt"


def nearest_preset(n: float, family: str = "dense") -> tuple[str, int]:
    """The bundled decoder preset of ``family`` whose non-embedding count is nearest ``n`` on a log scale.

    ``family`` is one of :data:`FAMILIES`: ``dense`` is every decoder but the mixtures of experts, whose
    parameter count says little about their cost per token; ``any`` includes them.

    Example:
        >>> nearest_preset(2e6)[0], nearest_preset(2e6, "llama")[0]
        ('gpt-tiny', 'llama-tiny')
    """
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    best = None
    for name in list_presets():
        cfg = resolve_config(name)
        if cfg.arch != "decoder":
            continue
        kind = preset_family(name, cfg)
        if family == "dense" and kind == "moe" or family not in ("dense", "any") and kind != family:
            continue
        count = non_embedding_parameters(cfg)
        gap = abs(math.log(count / n))
        if best is None or gap < best[0]:
            best = (gap, name, count)
    return best[1], best[2]
