"""QLoRA: NF4 base weights (torchao) at <= 0.3x fp32, close to the originals, on the paper's codebook,
with LoRA on top that trains."""

from __future__ import annotations

import torch
from torch import nn

from lmforge.peft import apply_peft
from lmforge.peft.qlora import NF4_CODEBOOK, NF4Linear, base_weight_bytes
from peft_helpers import batch, config, on, tiny_model


def test_nf4_weights_take_under_a_third_of_fp32():
    model = apply_peft(tiny_model("bert-tiny"), config("qlora"))
    layers = [m for m in model.modules() if isinstance(m, NF4Linear)]
    assert len(layers) == 2 * 6  # q, k, v, o, up, down in each of 2 layers
    stored, full = base_weight_bytes(model)
    assert stored <= 0.3 * full
    assert model.base_model.encoder.layers[0].attn.k.weight.quantized_data.dtype == torch.uint8  # 2 codes a byte
    assert model.base_model.encoder.layers[0].attn.k.weight.quantized_scalers.dtype == torch.int8  # double quant


def test_dequantised_weights_are_close_to_the_originals(device):
    torch.manual_seed(0)
    linear = nn.Linear(256, 128).to(device)
    q = NF4Linear(linear, block_size=64)
    w, deq = linear.weight.detach(), q.dense_weight()
    # Each weight lands on the nearest of 16 levels times its block's absmax; the widest gap between
    # levels is 1 - 0.723, so no weight moves by more than half of it, 0.139 absmax, plus the error of the
    # scale's own 8-bit quantisation (the double quantisation).
    absmax = w.reshape(-1, 64).abs().amax(1, keepdim=True)
    assert ((w.reshape(-1, 64) - deq.reshape(-1, 64)).abs() <= 0.16 * absmax).all()
    assert (deq - w).norm() / w.norm() < 0.12
    x = torch.randn(4, 256, device=device)
    torch.testing.assert_close(q(x), x @ deq.T + linear.bias)


def test_torchao_levels_are_the_nf4_codebook():
    q = NF4Linear(nn.Linear(64, 4, bias=False))
    torch.testing.assert_close(q.weight.nf4, torch.tensor(NF4_CODEBOOK), atol=1e-4, rtol=0)
    # Codebook values in a block whose absmax is 1 come back as themselves.
    levels = torch.tensor(NF4_CODEBOOK).repeat(16).reshape(4, 64)
    linear = nn.Linear(64, 4, bias=False)
    with torch.no_grad():
        linear.weight.copy_(levels)
    torch.testing.assert_close(NF4Linear(linear).dense_weight(), levels, atol=1e-4, rtol=0)


def test_lora_on_the_nf4_base_trains(device):
    model = apply_peft(tiny_model("gpt-tiny").to(device), config("qlora", targets=["q", "v", "ffn"]))
    nf4 = {n: m.weight.quantized_data.clone() for n, m in model.named_modules() if isinstance(m, NF4Linear)}
    assert all(t.device.type == device for t in nf4.values())
    b = on(batch("gpt-tiny", B=4, labels=True), device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model(**b).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    for name, module in model.named_modules():
        if isinstance(module, NF4Linear):
            assert torch.equal(module.weight.quantized_data, nf4[name]) and module.weight.grad is None


def test_small_matrices_use_a_smaller_second_level_block():
    q = NF4Linear(nn.Linear(64, 64))  # 64 blocks of 64 weights: fewer than 256 scales
    assert q.scaler_block_size == 64
