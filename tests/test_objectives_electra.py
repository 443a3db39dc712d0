"""ELECTRA (Clark et al., 2020): the objective's batches, the discriminator's labels, the joint loss against a hand
computation, sampling from the generator's softmax, embedding sharing, and exact gradient accumulation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lmforge.config import ModelConfig
from lmforge.model_folder import canonical_state
from lmforge.models.electra import ElectraPretrainer, generator_config, sample_tokens
from lmforge.objectives import ReplacedTokenDetection, build_objective, check_architecture
from lmforge.training import TrainConfig, Trainer

PAD, CLS, SEP, MASK = 0, 1, 2, 3
V = 40


def objective(**kw) -> ReplacedTokenDetection:
    return ReplacedTokenDetection(**{**dict(vocab_size=V, mask_token_id=MASK, pad_token_id=PAD, cls_token_id=CLS,
                                            sep_token_id=SEP, add_cls_sep=True, seed=0), **kw})


def tiny_config(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(arch="encoder", vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                 max_seq_len=32, type_vocab_size=2, embedding_norm=True, norm_position="post",
                                 final_norm=False, head="mlm", pad_token_id=PAD, mask_token_id=MASK,
                                 cls_token_id=CLS, sep_token_id=SEP), **kw})


def pair(seed: int = 0, **kw) -> ElectraPretrainer:
    torch.manual_seed(seed)
    return ElectraPretrainer.from_config(tiny_config(), **kw)


# ---------------------------------------------------------------------------------------- the objective
def test_batch_layout_by_hand():
    examples = [[10, 11, 12], [14]]
    every = objective(mlm_probability=1.0, mask_prob=1.0)(examples)  # every maskable token becomes [MASK]
    assert every["input_ids"].tolist() == [[CLS, MASK, MASK, MASK, SEP], [CLS, MASK, SEP, PAD, PAD]]
    assert every["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert every["labels"].tolist() == [[-100, 10, 11, 12, -100], [-100, 14, -100, -100, -100]]
    kept = objective(mlm_probability=1.0, mask_prob=0.0)(examples)  # selected but left as they are
    assert kept["input_ids"].tolist() == [[CLS, 10, 11, 12, SEP], [CLS, 14, SEP, PAD, PAD]]
    assert kept["labels"].tolist() == every["labels"].tolist()
    noise = every["sampling_noise"]
    assert noise.shape == (2, 5) and noise.dtype == torch.float32 and bool(((noise >= 0) & (noise < 1)).all())

    # The default draws, redone by hand from the same seed: selection, the 85/15 split, the random pool, the noise.
    batch = objective(seed=5)(examples)
    g = torch.Generator().manual_seed(5)
    ids = torch.tensor([[CLS, 10, 11, 12, SEP], [CLS, 14, SEP, PAD, PAD]])
    maskable = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 0, 0, 0]], dtype=torch.bool)
    selected = (torch.rand(2, 5, generator=g) < 0.15) & maskable
    u = torch.rand(2, 5, generator=g)
    torch.randint(V - 4, (2, 5), generator=g)  # the (unused: random_prob=0) replacement ids
    assert batch["labels"].tolist() == torch.where(selected, ids, -100).tolist()
    assert batch["input_ids"].tolist() == torch.where(selected & (u < 0.85), MASK, ids).tolist()
    assert torch.equal(batch["sampling_noise"], torch.rand(2, 5, generator=g))


def test_electra_masking_shares_and_no_random_tokens():
    g = torch.Generator().manual_seed(0)
    examples = [torch.randint(5, V, (60,), generator=g) for _ in range(40)]
    batch = objective(seed=1)(examples)
    selected = batch["labels"] != -100
    masked = selected & (batch["input_ids"] == MASK)
    kept = selected & (batch["input_ids"] == batch["labels"])
    assert bool((masked | kept)[selected].all())  # never a random token
    assert int(selected.sum()) / (40 * 60) == pytest.approx(0.15, abs=0.02)
    assert int(masked.sum()) / int(selected.sum()) == pytest.approx(0.85, abs=0.04)


def test_options_and_architecture_refusals():
    assert build_objective("electra", vocab_size=V, mask_token_id=MASK, pad_token_id=PAD).pretrainer_options() == {
        "generator_size": 0.25, "rtd_weight": 50.0, "tie_generator_output": True}
    assert objective(tie_generator_output=False).pretrainer_options()["tie_generator_output"] is False
    with pytest.raises(ValueError, match="generator_size must be in"):
        objective(generator_size=1.5)
    check_architecture("electra", "encoder")
    for arch in ("decoder", "encoder-decoder"):
        with pytest.raises(ValueError, match=f"objective 'electra' does not fit arch='{arch}'.*needs arch='encoder'"):
            check_architecture("electra", arch)


# ---------------------------------------------------------------------------------------- the pair
def test_generator_is_a_narrow_copy_sharing_the_embeddings():
    model = pair()
    d, g = model.discriminator, model.generator
    assert (g.config.d_model, g.config.n_heads, g.config.d_ff, g.config.n_layers) == (8, 1, 16, 2)
    assert g.config.embed_dim == d.config.embed_dim == 32 and g.encoder.embed.proj is not None
    assert g.embed_tokens.weight is d.embed_tokens.weight
    for name in ("positions", "token_types", "norm"):
        assert getattr(g.encoder.embed, name) is getattr(d.encoder.embed, name)
    # Shared tensors count once for the optimizer.
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    assert generator_config(tiny_config(), 1.0).d_model == 32
    half = generator_config(tiny_config(d_model=48, n_heads=6, d_ff=96), 0.5)  # 24 wide, head width 8 kept
    assert (half.d_model, half.n_heads, half.d_ff) == (24, 3, 48)


@pytest.mark.parametrize("tied", [True, False])
def test_untied_generator_output_leaves_the_rows_of_absent_tokens_alone(tied):
    # Tied, the generator's softmax gives every row of the shared table a gradient (p_i * h for a non-target);
    # untied, only the rows of tokens in the input move, and the generator owns a (V, E) output matrix.
    model = pair(tie_generator_output=tied)
    g = model.generator
    assert g.config.tie_embeddings is tied and (g.mlm_head.decoder is None) is tied
    assert g.embed_tokens.weight is model.discriminator.embed_tokens.weight  # the input table stays shared
    ids = torch.tensor([[CLS, 10, 11, 12, 13, SEP]])
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 11
    out = model(ids.masked_fill(labels != -100, MASK), labels=labels, sampling_noise=torch.rand(1, 6))
    out.mlm_loss.backward()
    grad = model.discriminator.embed_tokens.weight.grad  # (V, E)
    absent = torch.ones(V, dtype=torch.bool)
    absent[ids.flatten()] = False
    absent[MASK] = False
    assert bool((grad[absent].abs().sum(-1) > 0).all()) is tied
    if not tied:
        assert float(grad[absent].abs().max()) == 0.0 and g.mlm_head.decoder.weight.grad is not None


def test_sampling_follows_the_softmax_not_the_argmax():
    probs = torch.tensor([0.2, 0.5, 0.0, 0.3])
    n = 10_000
    u = (torch.arange(n) + 0.5) / n  # an even grid over [0, 1): frequencies are the probabilities
    drawn = sample_tokens(probs.log().expand(n, 4), u)
    freq = torch.bincount(drawn, minlength=4).float() / n
    torch.testing.assert_close(freq, probs, atol=1e-3, rtol=0)
    # Not the argmax: token 0 holds ~1e-4 of the mass, and the lowest noise values draw it.
    assert sample_tokens(torch.tensor([[0.0, 9.0], [0.0, 9.0]]), torch.tensor([0.0, 0.5])).tolist() == [0, 1]


def test_a_sampled_token_equal_to_the_original_is_labelled_original():
    model = pair()
    with torch.no_grad():  # the generator puts all its mass on token 20
        model.generator.mlm_head.bias.zero_()
        model.generator.mlm_head.bias[20] = 1e4
    ids = torch.tensor([[CLS, MASK, 11, MASK, SEP], [CLS, MASK, SEP, PAD, PAD]])
    labels = torch.tensor([[-100, 20, -100, 21, -100], [-100, 20, -100, -100, -100]])
    out = model(ids, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), labels,
                sampling_noise=torch.rand(2, 5))
    assert out.corrupted_ids.tolist() == [[CLS, 20, 11, 20, SEP], [CLS, 20, SEP, PAD, PAD]]
    # Position 1 was masked but refilled with its own token: original (0). Position 3 got 20 for 21: replaced.
    assert out.rtd_labels.tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, -100, -100]]
    # A kept (selected, unmasked) token that the generator replaces is a replacement too.
    out = model(torch.tensor([[CLS, 11, SEP]]), None, torch.tensor([[-100, 11, -100]]))
    assert out.rtd_labels.tolist() == [[0, 1, 0]]


def rtd_by_hand(model, batch, out):
    """The discriminator's BCE (R,) and replaced/original predictions (R,) at the R real tokens, from its
    logits at every position."""
    real = batch["attention_mask"].bool()
    z = model.discriminator(out.corrupted_ids, batch["attention_mask"]).logits  # (B, T): every position's logit
    y = out.rtd_labels[real].float()
    p = torch.sigmoid(z[real])
    return -(y * p.log() + (1 - y) * (1 - p).log()), (z[real] > 0).long()


def test_joint_loss_is_the_papers_formula_by_hand():
    model = pair(rtd_weight=50.0).eval()
    batch = objective(mlm_probability=0.4, seed=3)([[10, 11, 12, 13, 14, 15], [16, 17, 18]])
    out = model(**batch)
    selected = batch["labels"] != -100
    n, r = int(selected.sum()), int(batch["attention_mask"].sum())
    assert out.n_targets == n > 0 and r == 13

    ce = F.cross_entropy(out.logits, batch["labels"][selected], reduction="none")  # (N,) the generator's MLM
    bce, _ = rtd_by_hand(model, batch, out)  # (R,)
    # L = mean CE over the masked tokens + lambda * mean BCE over the real ones (§2), whatever N / R is.
    torch.testing.assert_close(out.loss, ce.mean() + 50.0 * bce.mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.mlm_loss, ce.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.rtd_loss, bce.mean(), rtol=1e-5, atol=1e-6)
    assert n != round(0.15 * r)  # the masking rate plays no part: far from it here
    tokens, rtd = out.loss_terms
    assert (tokens.name, tokens.labels_key, tokens.mask, tokens.weight) == ("tokens", "labels", False, 1.0)
    assert (rtd.name, rtd.labels_key, rtd.mask, rtd.weight) == ("rtd", "attention_mask", True, 50.0)
    assert rtd.logits.shape == (r,) and int((rtd.labels != -100).sum()) == r


def test_no_gradient_flows_through_the_sample():
    model = pair()
    batch = objective(mlm_probability=0.5, seed=1)([[10, 11, 12, 13, 14, 15, 16, 17]])
    model(**batch).rtd_loss.backward()
    generator_own = [p for n, p in model.generator.named_parameters()
                     if not n.startswith(("embed_tokens", "encoder.embed.positions", "encoder.embed.token_types",
                                          "encoder.embed.norm"))]
    assert generator_own and all(p.grad is None for p in generator_own)
    assert model.discriminator.encoder.layers[0].attn.q.weight.grad is not None


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")
def test_grad_accumulation_2x2_equals_batch_4(tmp_path):
    g = torch.Generator().manual_seed(0)
    examples = [torch.randint(5, V, (n,), generator=g) for n in (20, 7, 14, 25)]
    whole = objective(mlm_probability=0.3, seed=2)(examples)
    halves = [{k: v[i:i + 2] for k, v in whole.items()} for i in (0, 2)]
    counts = [int((h["labels"] != -100).sum()) for h in halves]
    reals = [int(h["attention_mask"].sum()) for h in halves]
    assert counts[0] * reals[1] != counts[1] * reals[0]  # the micro-batches mask different shares
    reference = pair()
    with torch.no_grad():
        paper = reference(**whole)  # the paper's L_MLM + lambda * L_RTD over the one big batch

    def trainer(model, data, accum, out):
        cfg = TrainConfig(max_steps=2, lr=1e-3, weight_decay=0.01, eval_every=0, save_every=0, precision="fp32",
                          progress=False, tensorboard=False, schedule="constant", device="cpu", grad_accum=accum,
                          batch_size=4 // accum)
        return Trainer(model, lambda b: b, data, cfg, out=out)  # batches are collated already

    a, b = pair(), pair()
    stats_a = trainer(a, halves, 2, tmp_path / "a").accumulate(halves)
    stats_b = trainer(b, [whole], 1, tmp_path / "b").accumulate([whole])
    assert stats_a["targets"] == stats_b["targets"] == sum(counts)
    assert stats_a["loss"] == pytest.approx(stats_b["loss"], rel=1e-6)
    assert stats_b["loss"] == pytest.approx(float(paper.mlm_loss + 50.0 * paper.rtd_loss), rel=1e-5)
    gb = {n: p.grad for n, p in b.named_parameters()}
    for name, p in a.named_parameters():
        torch.testing.assert_close(p.grad, gb[name], rtol=1e-5, atol=1e-6, msg=name)

    a, b = pair(), pair()
    trainer(a, halves * 2, 2, tmp_path / "c").fit()
    trainer(b, [whole] * 2, 1, tmp_path / "d").fit()
    start = pair()
    with torch.no_grad():
        for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), start.parameters()):
            assert float((pa - pb).abs().max()) <= 1e-6, name
        assert any(float((pa - p0).abs().max()) > 1e-4 for pa, p0 in zip(a.parameters(), start.parameters()))
    # The run's model folder is the discriminator alone.
    saved = load_file(str(tmp_path / "c" / "model" / "model.safetensors"))
    assert saved.keys() == canonical_state(a.discriminator)[0].keys()
    torch.testing.assert_close(saved["rtd_head.prediction.weight"], a.discriminator.rtd_head.prediction.weight)


def test_evaluation_reports_the_generator_and_the_discriminator_apart(tmp_path):
    model = pair()
    g = torch.Generator().manual_seed(4)
    batches = [objective(mlm_probability=0.3, seed=s)([torch.randint(5, V, (n,), generator=g) for n in lengths])
               for s, lengths in ((1, (12, 5)), (2, (20, 9, 3)))]
    cfg = TrainConfig(max_steps=1, eval_every=0, eval_batches=2, precision="fp32", progress=False,
                      tensorboard=False, device="cpu")
    record = Trainer(model, lambda b: b, batches, cfg, out=tmp_path, eval_data=batches,
                     eval_objective=lambda b: b).evaluate()

    model.eval()
    ce, mlm_right, bce, rtd_right = [], [], [], []
    with torch.no_grad():
        for batch in batches:
            out = model(**batch)
            target = batch["labels"][batch["labels"] != -100]
            ce.append(F.cross_entropy(out.logits, target, reduction="none"))
            mlm_right.append(out.logits.argmax(-1) == target)
            loss, predicted = rtd_by_hand(model, batch, out)
            bce.append(loss)
            rtd_right.append(predicted == out.rtd_labels[batch["attention_mask"].bool()])
    ce, mlm_right, bce, rtd_right = (torch.cat(x) for x in (ce, mlm_right, bce, rtd_right))
    # Means over each term's own targets of both batches, not exp(joint loss).
    assert record.keys() == {"eval_loss", "eval_ppl", "eval_accuracy", "eval_rtd_loss", "eval_rtd_accuracy"}
    assert record["eval_loss"] == pytest.approx(float(ce.mean()), rel=1e-5)
    assert record["eval_ppl"] == pytest.approx(float(ce.mean().exp()), rel=1e-5)
    assert record["eval_accuracy"] == pytest.approx(float(mlm_right.float().mean()))
    assert record["eval_rtd_loss"] == pytest.approx(float(bce.mean()), rel=1e-5)
    assert record["eval_rtd_accuracy"] == pytest.approx(float(rtd_right.float().mean()))
    assert 0 < record["eval_rtd_accuracy"] < 1
