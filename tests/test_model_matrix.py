"""Every arch x position x norm x activation builds, runs forward and backward, and every parameter
gets a gradient."""

from __future__ import annotations

import itertools

import pytest
import torch

from lmforge.config import ACTIVATIONS, ARCHS, NORMS, POSITIONS
from lmforge.models import Transformer
from tests.helpers import tiny_config

COMBOS = list(itertools.product(ARCHS, POSITIONS, NORMS, ACTIVATIONS))


@pytest.mark.parametrize("arch,position,norm,activation", COMBOS)
def test_forward_backward_reaches_every_parameter(arch, position, norm, activation, device):
    norm_position = ("pre", "post")[COMBOS.index((arch, position, norm, activation)) % 2]
    cfg = tiny_config(
        arch=arch, position=position, norm=norm, activation=activation, norm_position=norm_position,
        head="mlm" if arch == "encoder" else "lm", relative_values=position == "relative",
        type_vocab_size=2 if arch == "encoder" else 0, n_kv_heads=2 if arch == "decoder" else None,
        embedding_norm=arch != "decoder",
    )
    model = Transformer(cfg).to(device)
    ids = torch.randint(1, cfg.vocab_size, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    kwargs = {"attention_mask": mask.to(device)}
    if arch == "encoder-decoder":
        kwargs["decoder_input_ids"] = torch.randint(1, cfg.vocab_size, (2, 5)).to(device)
    out = model(ids.to(device), **kwargs)
    assert torch.isfinite(out.logits).all()
    out.logits.float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no gradient for {missing}"
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not zero, f"all-zero gradient for {zero}"
