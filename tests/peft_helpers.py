"""Tiny models, batches and adapter configs shared by the tests/test_peft_*.py files."""

from __future__ import annotations

import torch

import lmforge
from lmforge.config import ModelConfig
from lmforge.peft import PeftConfig

ARCHS = ("bert-tiny", "gpt-tiny", "t5-tiny", "bart-tiny")  # encoder, decoder, two encoder-decoders
VOCAB = 128

# Small but complete settings per method (every method at its tiniest useful size).
SMALL = {
    "lora": dict(r=4, targets=["q", "v", "o", "ffn"]),
    "qlora": dict(r=4),
    "adapter": dict(adapter_dim=8),
    "prefix": dict(num_virtual_tokens=3, prefix_hidden=16),
    "prompt": dict(num_virtual_tokens=3),
    "ia3": dict(),
    "bitfit": dict(),
    "mam": dict(num_virtual_tokens=3, prefix_hidden=16, adapter_dim=8),
}
METHODS = tuple(SMALL)
IDENTITY_AT_INIT = ("lora", "adapter", "ia3", "bitfit")  # start as the base model exactly
CHANGES_OUTPUT = ("prefix", "prompt", "mam")  # virtual tokens change the output from the start


def config(method: str, **overrides) -> PeftConfig:
    return PeftConfig(method=method, **{**SMALL[method], **overrides})


def tiny_model(arch: str, seed: int = 0, **overrides):
    """A 2-layer, 64-wide version of a preset, dropout off, in eval mode."""
    kw = dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=VOCAB, dropout=0.0, attn_dropout=0.0)
    if arch == "t5-tiny":
        kw["head_dim"] = 16
    if arch in ("t5-tiny", "bart-tiny"):
        kw["n_decoder_layers"] = 2
    kw.update(overrides)
    torch.manual_seed(seed)
    return lmforge.build_model(ModelConfig.from_preset(arch).replace(**kw)).eval()


def batch(arch: str, B: int = 2, T: int = 7, seed: int = 1, labels: bool = False) -> dict:
    """Model inputs; the last row is right-padded, so masks are exercised."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[-1, T - 2:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if arch in ("t5-tiny", "bart-tiny"):
        out["decoder_input_ids"] = torch.randint(3, VOCAB, (B, 5), generator=g)
        if labels:
            out["labels"] = torch.randint(3, VOCAB, (B, 5), generator=g)
    elif labels:
        out["labels"] = ids.masked_fill(mask == 0, -100)
    return out


def on(b: dict, device: str) -> dict:
    """A batch moved to ``device`` (the `device` fixture's)."""
    return {k: v.to(device) for k, v in b.items()}


def rows(b: dict, i: int) -> dict:
    """Row i of a batch, as a batch of one."""
    return {k: v[i:i + 1] for k, v in b.items()}


def perturb(model, name: str | None = None, scale: float = 0.1, seed: int = 2) -> None:
    """Move adapter ``name``'s parameters off their (often identity) initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.adapter_parameters(name or model.active_adapter).values():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) * scale)

