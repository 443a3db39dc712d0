"""Mixture of experts (lmforge.nn.moe): routing, capacity, auxiliary losses, equivalence with the dense FFN,
gradients, the grouped computation against a padded bmm, config refusals, active-parameter FLOPs."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.config import ConfigError, ModelConfig
from lmforge.models import Transformer
from lmforge.nn.ffn import FeedForward
from lmforge.nn.moe import MoEFeedForward, block_groups, expert_capacity, load_balancing_loss, route
from tests.helpers import tiny_config


def _moe(**kw) -> MoEFeedForward:
    torch.manual_seed(0)
    args = dict(d_model=16, d_ff=24, activation="swiglu", n_experts=4, top_k=2, bias=False) | kw
    moe = MoEFeedForward(**args)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
    return moe


@pytest.mark.parametrize("top_k, renormalize", [(1, False), (2, True), (3, True), (2, False)])
def test_each_token_goes_to_exactly_top_k_experts_with_hf_gates(top_k, renormalize):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    logits = torch.randn(3, 7, 5)
    probs, gates, experts, kept = route(logits, top_k, renormalize)
    assert experts.shape == (3, 7, top_k) and bool(kept.all())
    for b in range(3):  # k distinct experts, the k most probable
        for t in range(7):
            assert len(set(experts[b, t].tolist())) == top_k
            assert set(experts[b, t].tolist()) == set(probs[b, t].argsort(descending=True)[:top_k].tolist())
    torch.testing.assert_close(probs, torch.softmax(logits, -1))
    if renormalize:  # HF Mixtral: softmax over all experts, top-k, renormalise
        hf = MixtralTopKRouter(MixtralConfig(hidden_size=5, num_local_experts=5, num_experts_per_tok=top_k))
        with torch.no_grad():
            hf.weight.copy_(torch.eye(5))  # its logits are then the input itself
        _, hf_gates, hf_experts = hf(logits)
        torch.testing.assert_close(gates.view(-1, top_k), hf_gates)
        assert torch.equal(experts.view(-1, top_k), hf_experts)
        torch.testing.assert_close(gates.sum(-1), torch.ones(3, 7))
    else:  # Switch keeps the raw probabilities
        torch.testing.assert_close(gates, probs.topk(top_k, -1).values)


def test_config_default_renormalises_exactly_for_top_k_above_one():
    assert not tiny_config(moe_experts=4, moe_top_k=1).moe_renormalizes
    assert tiny_config(moe_experts=4, moe_top_k=2).moe_renormalizes
    assert tiny_config(moe_experts=4, moe_top_k=1, moe_renormalize=True).moe_renormalizes


@pytest.mark.parametrize("factor", [None, math.inf, 100.0])
def test_unlimited_capacity_drops_nothing(factor):
    moe = _moe(capacity_factor=factor)
    moe(torch.randn(2, 9, 16))
    assert int(moe.last_dropped) == 0 and moe.last_load.sum() == 2 * 9 * 2


def test_capacity_drops_exactly_the_overflow_computed_by_hand():
    # 8 tokens, 2 experts, top-1: choices 0 0 1 0 0 0 1 0 -> expert 0 gets 6, expert 1 gets 2.
    choice = torch.tensor([0, 0, 1, 0, 0, 0, 1, 0])
    logits = torch.nn.functional.one_hot(choice, 2).float()[None] * 3.0  # (1, 8, 2)
    C = expert_capacity(8, 1, 2, 0.5)
    assert C == 2  # ceil(0.5 * 8 * 1 / 2)
    _, _, experts, kept = route(logits, 1, False, C)
    # First come, first served: expert 0 keeps tokens 0 and 1 and drops 3, 4, 5, 7; expert 1 keeps both.
    assert kept[0, :, 0].tolist() == [True, True, True, False, False, False, True, False]

    # Top-2, capacity 3: all first choices (in order) are served before any second choice.
    first = torch.tensor([0, 0, 1, 0, 2, 0])
    second = torch.tensor([1, 2, 0, 1, 0, 2])
    logits = (torch.nn.functional.one_hot(first, 3) * 4.0 + torch.nn.functional.one_hot(second, 3) * 2.0)[None]
    _, _, experts, kept = route(logits, 2, True, 3)
    assert experts[0, :, 0].tolist() == first.tolist() and experts[0, :, 1].tolist() == second.tolist()
    # expert 0: first choices of tokens 0, 1, 3 fill it; token 5's first choice and tokens 2, 4's second drop.
    # expert 1: token 2 (first), then second choices of tokens 0, 3 -> 3, full. expert 2: token 4, then 1, 5.
    assert kept[0, :, 0].tolist() == [True, True, True, True, True, False]
    assert kept[0, :, 1].tolist() == [True, True, False, True, False, True]


def test_dropped_tokens_pass_through_as_zero_and_are_counted():
    moe = _moe(top_k=1, n_experts=2, capacity_factor=0.25)
    x = torch.randn(3, 8, 16)
    y = moe(x)
    choice = torch.nn.functional.linear(x, moe.router.weight).argmax(-1)  # (3, 8)
    C = expert_capacity(8, 1, 2, 0.25)  # = 1 per sequence and expert
    by_hand = sum(max(0, int((choice[b] == e).sum()) - C) for b in range(3) for e in range(2))
    assert int(moe.last_dropped) == by_hand > 0
    served = torch.zeros(3, 8, dtype=torch.bool)
    for b in range(3):
        for e in range(2):
            served[b, (choice[b] == e).nonzero()[:C, 0]] = True
    assert torch.equal(y.abs().sum(-1) == 0, ~served)  # a dropped token gets nothing from the layer


def test_fixed_expert_capacity_overrides_the_sequence_length():
    assert expert_capacity(1000, 1, 8, None, fixed=5) == 5
    moe = _moe(top_k=1, expert_capacity=1)
    moe(torch.randn(1, 12, 16))
    assert int(moe.last_dropped) == 12 - int((moe.last_load > 0).sum())


def test_aux_loss_is_one_times_the_coefficient_for_a_uniform_router():
    model = Transformer(tiny_config(moe_experts=4, moe_top_k=2, moe_aux_loss=0.25, moe_z_loss=0.0))
    for layer in model.modules():
        if isinstance(layer, MoEFeedForward):
            torch.nn.init.zeros_(layer.router.weight)  # every expert equally likely
    ids = torch.randint(1, 97, (2, 8))
    out = model(ids, labels=ids)
    torch.testing.assert_close(out.aux_loss, torch.tensor(0.25))
    plain = model.eval()(ids, labels=ids)  # evaluation: cross-entropy alone
    assert plain.aux_loss is None
    torch.testing.assert_close(out.loss, plain.loss + 0.25)
    # ... and routing that favours one expert is penalised: f and P both peaked on expert 0.
    peaked = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]]).expand(1, 6, 4)
    assert load_balancing_loss(peaked, torch.zeros(1, 6, 1, dtype=torch.long)) > 1


def test_z_loss_is_the_mean_squared_logsumexp():
    model = Transformer(tiny_config(moe_experts=4, moe_aux_loss=0.0, moe_z_loss=0.5, n_layers=1))
    layer = next(m for m in model.modules() if isinstance(m, MoEFeedForward))
    torch.nn.init.zeros_(layer.router.weight)  # logits 0: logsumexp = log 4
    ids = torch.randint(1, 97, (2, 5))
    torch.testing.assert_close(model(ids, labels=ids).aux_loss, torch.tensor(0.5 * math.log(4) ** 2))


@pytest.mark.parametrize("activation, bias", [("gelu", True), ("swiglu", False)])
def test_equal_experts_with_one_expert_per_token_equal_the_dense_ffn(activation, bias):
    torch.manual_seed(0)
    dense = FeedForward(16, 24, activation, bias)
    moe = MoEFeedForward(16, 24, activation, n_experts=4, top_k=1, renormalize=True, bias=bias)  # gate 1
    with torch.no_grad():
        for ours, theirs in (("up", "up"), ("gate", "gate"), ("down", "down")):
            if getattr(moe.experts, ours) is not None:
                getattr(moe.experts, ours).copy_(getattr(dense, theirs).weight.expand(4, -1, -1))
                if bias:
                    getattr(moe.experts, f"{ours}_bias").copy_(getattr(dense, theirs).bias.expand(4, -1))
        moe.router.weight.normal_()
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(moe(x), dense(x), atol=1e-6, rtol=1e-5)
    assert int((moe.last_load > 0).sum()) > 1  # the tokens really went to several experts


@pytest.mark.parametrize("bias", [False, True])
def test_gradients_reach_every_expert_that_received_tokens(bias):
    moe = _moe(n_experts=6, top_k=1, capacity_factor=2.0, bias=bias)
    x = torch.randn(1, 5, 16, requires_grad=True)
    moe(x).pow(2).sum().backward()
    received = moe.last_load > 0
    assert 0 < int(received.sum()) < 6  # some experts got tokens, some none
    names = ("up", "gate", "down") + (("up_bias", "gate_bias", "down_bias") if bias else ())
    for e in range(6):
        for name in names:
            assert bool(getattr(moe.experts, name).grad[e].abs().sum() > 0) == bool(received[e]), (name, e)
    assert moe.router.weight.grad.abs().sum() > 0 and x.grad.abs().sum() > 0


@pytest.mark.parametrize("bias, capacity", [(False, None), (True, 1.0)])
def test_grouped_mm_and_padded_bmm_paths_agree(bias, capacity):
    a = _moe(bias=bias, capacity_factor=capacity)
    b = _moe(bias=bias, capacity_factor=capacity)
    b.experts.force_bmm = True
    x = torch.randn(2, 9, 16)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    ya.sum().backward(), yb.sum().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_row_blocks_are_whole_and_keep_each_group_in_order():
    counts = torch.tensor([5, 0, 33, 1, 25])
    padded, rows, total = block_groups(counts, 64, 8)
    assert total == 96  # 64 + 5 groups x 7 spare rows at most, down to whole blocks
    assert padded.tolist() == [8, 0, 40, 8, 40] and int(padded.sum()) == total
    starts = padded.cumsum(0) - padded  # where each group now begins
    assert rows.tolist() == [int(starts[e]) + i for e, c in enumerate(counts.tolist()) for i in range(c)]


@pytest.mark.parametrize("force_bmm", [False, True])
@pytest.mark.parametrize("bias, capacity", [(False, None), (True, 1.0)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_groups_rounded_up_to_row_blocks_give_the_same_outputs_and_gradients(monkeypatch, precision, force_bmm,
                                                                             bias, capacity):
    # fp32: blocks of 4 rows forced; bf16 autocast on the CPU: the default blocks. Reference: no blocks.
    import lmforge.nn.moe as moe_module

    calls = []
    block_groups = moe_module.block_groups
    monkeypatch.setattr(moe_module, "block_groups", lambda *a: calls.append(a[2]) or block_groups(*a))
    blocked, plain = _moe(bias=bias, capacity_factor=capacity), _moe(bias=bias, capacity_factor=capacity)
    blocked.experts.force_bmm = plain.experts.force_bmm = force_bmm
    blocked.experts.row_block = 4 if precision == "fp32" else None
    plain.experts.row_block = 1
    x = torch.randn(2, 9, 16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        ya, yb = blocked(xa), plain(xb)
    assert calls == [4 if precision == "fp32" else moe_module.ROW_BLOCK]  # the blocked model only
    tol = dict(atol=1e-5, rtol=1e-5) if precision == "fp32" else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ya, yb, **tol)
    ya.pow(2).sum().backward(), yb.pow(2).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, **tol)
    for (name, pa), pb in zip(blocked.named_parameters(), plain.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, **tol, msg=name)


def test_float64_takes_the_bmm_path():
    moe = _moe().double()
    assert moe(torch.randn(1, 4, 16, dtype=torch.float64)).dtype == torch.float64


def test_shared_experts_add_an_always_on_ffn():
    moe = _moe(shared_experts=2)
    assert moe.shared.up.out_features == 48  # two experts' width
    x = torch.randn(1, 3, 16)
    routed = moe(x) - moe.shared(x)
    moe.shared = None
    torch.testing.assert_close(routed, moe(x))


@pytest.mark.parametrize("fields, named", [
    (dict(moe_experts=2, moe_top_k=3), "ModelConfig.moe_top_k=3"),
    (dict(moe_experts=4, moe_capacity_factor=0.0), "ModelConfig.moe_capacity_factor=0.0"),
    (dict(moe_experts=4, moe_capacity_factor=-1.0), "ModelConfig.moe_capacity_factor=-1.0"),
    (dict(moe_experts=4, moe_capacity_factor=float("nan")), "ModelConfig.moe_capacity_factor=nan"),
    (dict(moe_experts=4, moe_every=3), "ModelConfig.moe_every=3 puts no MoE FFN in any layer"),
    (dict(moe_experts=4, moe_every=2, share_layers=True), "ModelConfig.moe_every=2 must be 1 with share_layers"),
    (dict(moe_experts=4, moe_capacity_factor=1.0, moe_expert_capacity=4), "ModelConfig.moe_expert_capacity=4"),
    (dict(moe_experts=-1), "ModelConfig.moe_experts=-1"),
    (dict(moe_experts=4, moe_jitter=1.5), "ModelConfig.moe_jitter=1.5"),
])
def test_bad_moe_settings_name_the_field(fields, named):
    with pytest.raises(ConfigError) as err:
        tiny_config(**fields)
    assert str(err.value).startswith(named) and "\n" not in str(err.value)


def test_moe_every_picks_the_layers():
    model = Transformer(tiny_config(arch="encoder-decoder", n_layers=4, moe_experts=4, moe_every=2))
    for stack in (model.encoder, model.decoder):
        kinds = [type(layer.ffn).__name__ for layer in stack.layers]
        assert kinds == ["FeedForward", "MoEFeedForward"] * 2


def test_flops_count_active_parameters():
    dense = Transformer(tiny_config(n_layers=2))
    moe = Transformer(tiny_config(n_layers=2, moe_experts=8, moe_top_k=1, moe_every=2))
    router = 8 * 32
    expert = 2 * 32 * 64 + 64 + 32  # up, down and their biases
    assert moe.num_parameters() == dense.num_parameters() + router + 7 * expert
    assert moe.active_parameters() == dense.num_parameters() + router
    assert moe.flops_per_token(16) == dense.flops_per_token(16) + 6 * router
    seq2seq = Transformer(tiny_config(arch="encoder-decoder", moe_experts=4, moe_top_k=2))
    plain = Transformer(tiny_config(arch="encoder-decoder"))
    # Two experts per token: twice the dense FFN's weights, plus the router, in each of the four layers.
    ffn = 2 * 32 * 64 + 64 + 32
    assert seq2seq.train_flops(8, 5) - plain.train_flops(8, 5) == 6 * (8 + 5) * 2 * (ffn + 4 * 32)


def test_moe_stats_report_the_training_forwards_and_reset():
    model = Transformer(tiny_config(moe_experts=4, moe_capacity_factor=0.5))
    ids = torch.randint(1, 97, (2, 8))
    model(ids)
    model(ids)
    stats = model.training_metrics()
    assert set(stats) == {"moe_aux_loss", "moe_z_loss", "moe_dropped", "moe_load", "moe_load_max"}
    assert len(stats["moe_load"]) == 4 and sum(stats["moe_load"]) == pytest.approx(1.0)
    assert 0 < stats["moe_dropped"] < 1 and 1 <= stats["moe_load_max"] <= 4
    assert model.training_metrics() == {}  # reset
    model.eval()(ids)
    assert model.training_metrics() == {}  # evaluation forwards are not training statistics
    assert Transformer(tiny_config()).training_metrics() == {}


def test_tiny_moe_presets_build_and_run():
    for name in ("gpt-tiny-moe", "switch-tiny", "mixtral-tiny"):
        cfg = ModelConfig.from_preset(name, n_layers=2, d_model=32, n_heads=4, d_ff=16, vocab_size=50,
                                      **({"head_dim": 8, "n_decoder_layers": 2} if name == "switch-tiny" else {}),
                                      **({"n_kv_heads": 2} if name == "mixtral-tiny" else {}))
        assert cfg.moe_experts == 8
        model = Transformer(cfg)
        ids = torch.randint(1, 50, (1, 6))
        kwargs = {"decoder_input_ids": ids} if cfg.arch == "encoder-decoder" else {}
        assert model(ids, labels=ids, **kwargs).loss.isfinite()


@pytest.mark.slow  # compiling takes most of a minute on a CPU
def test_compiled_moe_model_equals_eager():
    # fp32 experts leave the graph (grouped_mm traces in bf16 only) and run eagerly inside the compiled model
    torch.manual_seed(0)
    model = Transformer(tiny_config(n_layers=1, moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0))
    ids = torch.randint(1, 97, (2, 16))
    eager = model(ids, labels=ids)
    compiled = torch.compile(model)(ids, labels=ids)
    torch.testing.assert_close(compiled.loss, eager.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled.aux_loss, eager.aux_loss)


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder-decoder"])
@pytest.mark.parametrize("activation, norm_position", [("gelu", "post"), ("swiglu", "pre")])
def test_every_family_with_experts_trains_every_parameter(arch, activation, norm_position):
    cfg = tiny_config(arch=arch, activation=activation, norm_position=norm_position, moe_experts=4, moe_top_k=2,
                      moe_capacity_factor=1.0, moe_shared_experts=1, head="mlm" if arch == "encoder" else "lm")
    model = Transformer(cfg)
    ids = torch.randint(1, 97, (2, 7))
    kwargs = {"decoder_input_ids": torch.randint(1, 97, (2, 5))} if arch == "encoder-decoder" else {}
    out = model(ids, labels=torch.randint(1, 97, (2, 5 if kwargs else 7)), **kwargs)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not missing, missing


def test_bf16_autocast_keeps_the_router_in_fp32(monkeypatch):
    moe = _moe(capacity_factor=1.0)
    seen, linear = [], torch.nn.functional.linear

    def spy(*args, **kwargs):
        out = linear(*args, **kwargs)
        seen.append(out.dtype)
        return out

    x = torch.randn(2, 6, 16)
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = moe(x)
    assert seen[0] == torch.float32  # the router's logits (Switch's selective precision)
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    torch.testing.assert_close(y, moe(x), atol=0.1, rtol=0.1)  # bf16 experts, same routing
