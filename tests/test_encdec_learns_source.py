"""An encoder-decoder must learn to read its source.

Regression test: T5 (unscaled attention logits) used to get the GPT-2 initialisation, N(0, 0.02) everywhere;
its encoder output then hardly depended on the input and the decoder learned to ignore the source. On a copy
task (target = source, random ids) the loss with the matching source must fall well below the loss with
another example's source.
"""

import torch

import lmforge

V, L, B = 64, 12, 32


def _copy_gap(preset: str, steps: int, **extra) -> tuple[float, float]:
    torch.manual_seed(0)
    model = lmforge.build_model(preset, n_layers=2, n_decoder_layers=2, d_model=64, n_heads=4, d_ff=128,
                                vocab_size=V, dropout=0.0, **extra)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        src = torch.randint(5, V, (B, L), generator=g)
        loss = model(src, torch.ones_like(src), labels=src).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src = torch.randint(5, V, (64, L), generator=g)
    with torch.no_grad():
        matched = model(src, torch.ones_like(src), labels=src).loss.item()
        shuffled = model(src.roll(1, 0), torch.ones_like(src), labels=src).loss.item()
    return matched, shuffled


def test_t5_learns_to_copy_its_source():
    matched, shuffled = _copy_gap("t5-tiny", 150, head_dim=16)
    assert matched < shuffled - 1.0, (matched, shuffled)


def test_bart_learns_to_copy_its_source():
    matched, shuffled = _copy_gap("bart-tiny", 150)
    assert matched < shuffled - 1.0, (matched, shuffled)
