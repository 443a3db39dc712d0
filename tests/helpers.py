"""Tiny configs for fast model tests."""

from __future__ import annotations

from lmforge.config import ModelConfig


def tiny_config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=97, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64, dropout=0.0,
        relative_k=3, t5_num_buckets=8, t5_max_distance=16, pad_token_id=0, decoder_start_token_id=0,
    )
    base.update(overrides)
    return ModelConfig(**base)
