"""The analytic FLOPs of a training step match torch.utils.flop_counter (forward + backward) within 5%, for a
decoder, an encoder and an encoder-decoder, on padded batches with each objective's own target counts."""

from __future__ import annotations

import random

import pytest
import torch

import lmforge
from lmforge.objectives import build_objective
from lmforge.training.price_tag import batch_flops, counted_flops

V = 200
SHAPE = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "vocab_size": V, "max_seq_len": 128}
CASES = {
    "decoder-clm": ("gpt-tiny", {}, "clm", {"pad_token_id": 0}),
    "encoder-mlm": ("bert-tiny", {}, "mlm", {"vocab_size": V, "mask_token_id": 4, "pad_token_id": 0,
                                             "special_token_ids": [0, 1, 2, 3, 4]}),
    "encoder-decoder-span": ("t5-tiny", {"n_decoder_layers": 2, "head_dim": 16}, "span-corruption",
                             {"sentinel_ids": list(range(V - 10, V)), "eos_token_id": 1, "pad_token_id": 0}),
    # ALBERT's shared layers: stored once, run at every depth, so they cost what unshared layers cost
    "decoder-clm-shared-layers": ("gpt-tiny", {"n_layers": 3, "share_layers": True}, "clm", {"pad_token_id": 0}),
    "encoder-decoder-shared-layers": ("t5-tiny", {"n_decoder_layers": 3, "head_dim": 16, "share_layers": True},
                                      "span-corruption", {"sentinel_ids": list(range(V - 10, V)),
                                                          "eos_token_id": 1, "pad_token_id": 0}),
}


def documents(n: int = 6) -> list[list[int]]:
    rng = random.Random(0)  # ragged lengths: the batch is padded to the longest
    return [[rng.randrange(5, V - 10) for _ in range(rng.randrange(20, 64))] for _ in range(n)]


@pytest.mark.parametrize("case", list(CASES))
def test_analytic_flops_match_the_flop_counter(case):
    preset, extra, objective, options = CASES[case]
    torch.manual_seed(0)
    model = lmforge.build_model(preset, **{**SHAPE, **extra})
    batch = build_objective(objective, **options)(documents())
    assert bool((batch.get("attention_mask", torch.ones(1)) == 0).any())  # really padded
    n_targets = int((batch["labels"] != -100).sum())
    with counted_flops() as counter:
        out = model(**batch)
        out.loss.backward()
    counted = counter.get_total_flops()
    analytic = batch_flops(model, batch, n_targets)
    assert analytic == pytest.approx(counted, rel=0.05), (analytic, counted)
    if objective == "mlm":  # only the masked rows reach the vocabulary: charging every row would be far off
        every = batch_flops(model, {k: v for k, v in batch.items() if k != "labels"}, n_targets)
        assert every > 1.1 * counted


def test_models_without_a_formula_have_none():
    model = lmforge.build_model("gpt-tiny", **SHAPE)
    ids = torch.zeros(2, 8, dtype=torch.long)
    assert batch_flops(torch.nn.Linear(2, 2), {"input_ids": ids}, 16) is None
    assert batch_flops(model, {"inputs_embeds": torch.zeros(2, 8, 64)}, 16) is None


def test_padding_free_credit_follows_the_layout_the_forward_used():
    """A training forward skips most padding rows (lmforge.nn.unpadding) and is charged for what it ran; an
    eval-mode forward (and a compiled one, ``packed=False``) runs them all and is charged for them."""
    preset, extra, objective, options = CASES["decoder-clm"]
    model = lmforge.build_model(preset, **SHAPE)
    batch = build_objective(objective, **options)(documents())
    n_targets = int((batch["labels"] != -100).sum())
    charged = {}
    for mode in ("train", "eval"):
        model.train(mode == "train")
        with counted_flops() as counter:
            model(**batch).loss.backward()
        charged[mode] = (batch_flops(model, batch, n_targets), counter.get_total_flops())
        assert charged[mode][0] == pytest.approx(charged[mode][1], rel=0.05), (mode, charged[mode])
    assert charged["train"][1] < 0.9 * charged["eval"][1]  # the padding was really skipped
    model.train()
    assert batch_flops(model, batch, n_targets, packed=False) == charged["eval"][0]
