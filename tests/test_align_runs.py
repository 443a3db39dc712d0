"""Alignment runs through the Trainer: DPO moves the margin, LoRA's base is the reference, rollouts sample
with the policy and resume exactly, every method writes an ordinary model folder and logs its numbers."""

from __future__ import annotations

import copy
import json
import math

import torch

from align_helpers import config, policy, vowel_share  # noqa: F401
from lmforge import checkpoint
from lmforge.align.config import AlignConfig
from lmforge.align.dpo import DPOLoss, PairCollator, encode_pairs, reference_logps, sequence_logps
from lmforge.align.data import read_pairs, read_prompts
from lmforge.align.grpo import GRPOMethod
from lmforge.align.logprobs import PromptEncoder
from lmforge.align.policy import AlignedPolicy
from lmforge.align.ppo import PPOMethod
from lmforge.align.rollouts import RolloutSource
from lmforge.align.run import run_align
from lmforge.generation.generate import generate_text
from lmforge.peft.config import PeftConfig
from lmforge.peft.model import apply_peft
from lmforge.training.state import from_json, to_json


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_short_dpo_run_raises_the_chosen_rejected_margin(policy, tmp_path):  # noqa: F811
    folder, tok, pairs, _ = policy
    result = run_align(config(tmp_path / "run", steps=12, lr=3e-3), AlignConfig(policy=str(folder), train=str(pairs),
                                                                                beta=0.5))
    logged = records(tmp_path / "run")
    # Step 1 scores the reference itself: no margin, loss log 2.
    assert logged[0]["margin"] == 0 and math.isclose(logged[0]["loss"], math.log(2), rel_tol=1e-6)
    assert logged[-1]["margin"] > 0.5 and logged[-1]["accuracy"] == 1.0 and logged[-1]["loss"] < 0.5
    for key in ("reward_chosen", "reward_rejected", "margin", "accuracy"):
        assert key in logged[-1]
    # OUT/model is an ordinary model folder: it loads and generates, and now prefers the chosen responses.
    model = checkpoint.load(result.model_dir)
    assert isinstance(generate_text(model, tok, ["the film"], max_new_tokens=3)[0], str)
    reference = checkpoint.load(folder)
    encoder = PromptEncoder(model, tok)
    batch = PairCollator(tok.pad_id)(encode_pairs(read_pairs(pairs)[:8], encoder))
    with torch.no_grad():
        pol, ref = sequence_logps(model, batch), sequence_logps(reference, batch)
    assert float(((pol[:8] - ref[:8]) - (pol[8:] - ref[8:])).mean()) > 1.0


def test_with_lora_the_base_is_the_reference(policy):  # noqa: F811
    folder, tok, pairs, _ = policy
    base = checkpoint.load(folder)
    frozen = copy.deepcopy(base)
    peft = apply_peft(base, PeftConfig(method="lora", r=4))
    with torch.no_grad():  # move the adapters away from their zero start
        for name, p in peft.named_parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn_like(p))
    batch = PairCollator(tok.pad_id)(encode_pairs(read_pairs(pairs)[:4], PromptEncoder(base, tok)))
    with torch.no_grad():
        ref = reference_logps(peft, None, batch)
        torch.testing.assert_close(ref, sequence_logps(frozen, batch))
        assert not torch.allclose(sequence_logps(peft, batch), ref)  # the adapters are back on after
    out = DPOLoss()(peft, batch)  # no reference model given: the base serves
    out.loss.backward()
    assert all(p.grad is not None for p in peft.parameters() if p.requires_grad)


def _source(folder, tok, prompts, method, reference="copy", **kw):
    model = AlignedPolicy(checkpoint.load(folder), value_head=method.value_head)
    ref = copy.deepcopy(model.policy) if reference == "copy" else reference
    settings = dict(n_prompts=4, group=2, minibatch=4, ppo_epochs=2, max_new_tokens=5, seed=7)
    settings.update(kw)
    return RolloutSource(model, read_prompts(prompts), PromptEncoder(model.policy, tok), vowel_share, method, ref,
                         **settings)


def test_the_kl_penalty_is_zero_when_the_policy_is_the_reference(policy):  # noqa: F811
    folder, tok, _, prompts = policy
    for reference in ("copy", None):  # a frozen copy, or a LoRA policy's own base (adapters start at zero)
        source = _source(folder, tok, prompts, PPOMethod(kl_coef=0.5), reference)
        if reference is None:
            source.model.policy = apply_peft(source.model.policy, PeftConfig(method="lora", r=4))
        batch = next(source)
        torch.testing.assert_close(batch["old_logps"], batch["ref_logps"])
        assert batch["rollout_metrics"]["kl_ref"] == 0
        assert batch["action_mask"].sum() > 0 and (batch["old_logps"] * batch["action_mask"]).sum() < 0


def test_rollouts_sample_with_the_policy_and_resume_mid_rollout(policy):  # noqa: F811
    folder, tok, _, prompts = policy
    source = _source(folder, tok, prompts, GRPOMethod())
    first = [next(source) for _ in range(3)]  # a rollout of 8 sequences = 4 minibatches (2 epochs x 2)
    assert source.rollouts == 1 and first[0]["input_ids"].shape[0] == 4
    # Each minibatch holds whole groups' advantages: over the rollout they sum to zero per group.
    saved = json.loads(json.dumps(to_json(source.state_dict())))
    later = [next(source) for _ in range(3)]  # ends the rollout and samples the next one
    assert source.rollouts == 2
    resumed = _source(folder, tok, prompts, GRPOMethod(), seed=123)
    resumed.load_state_dict(from_json(saved))
    again = [next(resumed) for _ in range(3)]
    for a, b in zip(later, again):
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key]


def test_ppo_run_logs_its_numbers_and_writes_a_model_folder(policy, tmp_path):  # noqa: F811
    folder, tok, _, prompts = policy
    align = AlignConfig(method="ppo", policy=str(folder), prompts=str(prompts), reward="align_helpers:vowel_share",
                        n_prompts=4, ppo_epochs=2, max_new_tokens=6, kl_target=3.0)
    result = run_align(config(tmp_path / "ppo", steps=8, batch_size=2), align)
    logged = records(tmp_path / "ppo")
    for key in ("reward_mean", "reward_std", "kl_ref", "kl_coef", "entropy", "clip_fraction", "value_loss",
                "policy_loss", "approx_kl"):
        assert all(key in r for r in logged), key
    assert logged[0]["kl_ref"] == 0 and logged[0]["clip_fraction"] == 0  # the first minibatch is on-policy
    assert any(r["value_loss"] > 0 for r in logged)
    assert logged[-1]["kl_coef"] != logged[0]["kl_coef"]  # adaptive
    model = checkpoint.load(result.model_dir)
    assert set(model.state_dict()) == set(checkpoint.load(folder).state_dict())  # the policy alone, no value head
    assert (tmp_path / "ppo" / "align.yaml").is_file()


def test_grpo_on_the_arithmetic_task_runs_with_a_lora_policy(policy, tmp_path):  # noqa: F811
    folder, _, _, _ = policy
    align = AlignConfig(method="grpo", policy=str(folder), prompts="arithmetic", n_prompts=2, group=4,
                        max_new_tokens=3, lora_r=4)
    result = run_align(config(tmp_path / "grpo", steps=4, batch_size=4), align)
    logged = records(tmp_path / "grpo")
    assert all(k in logged[-1] for k in ("reward_mean", "kl", "kl_ref", "entropy", "clip_fraction"))
    merged = checkpoint.load(result.model_dir)  # LoRA merged into an ordinary folder
    assert set(merged.state_dict()) == set(checkpoint.load(folder).state_dict())


def test_a_policy_with_a_chat_template_scores_only_the_assistant_turn(policy, tmp_path):  # noqa: F811
    from lmforge.prompting.instruct import ChatTemplate

    folder, tok, pairs, _ = policy
    chat = tmp_path / "chat"
    model = checkpoint.load(folder)
    checkpoint.save(model, chat, tokenizer=tok)
    ChatTemplate().save(chat)
    encoder = PromptEncoder.for_folder(model, tok, chat)
    assert encoder.template is not None
    example = encode_pairs(read_pairs(pairs)[:1], encoder)[0]
    # The rows are exactly what instruction tuning trains on: the response tokens are the assistant's reply
    # and its end of turn, and the prompt ends with the assistant header.
    messages = [{"role": "user", "content": read_pairs(pairs)[0]["prompt"]},
                {"role": "assistant", "content": read_pairs(pairs)[0]["chosen"]}]
    ids, response = ChatTemplate().encode(tok, messages)
    assert example["chosen"] == ids and example["chosen_mask"] == [int(r) for r in response]
    # and an aligned run keeps the template in OUT/model, for chat and serve
    result = run_align(config(tmp_path / "run", steps=1), AlignConfig(policy=str(chat), train=str(pairs)))
    assert (result.model_dir / "chat_template.json").is_file()


def test_the_trainer_logs_a_loss_outputs_metrics_weighted_by_its_targets(tmp_path):
    import lmforge
    from lmforge.training import Trainer
    from lmforge.training.trainer import LossOutput

    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)

    def loss(m, batch):  # a mean over n targets, reporting n as a metric: the step's value is sum(n^2) / sum(n)
        n = int(batch["n"])
        out = m(input_ids=batch["input_ids"])
        return LossOutput(out.logits.float().mean() * 0 + 1.0, n, {"n_seen": float(n)})

    loss.count_targets = lambda batch: int(batch["n"])
    data = [{"input_ids": torch.randint(0, 50, (2, 5)), "n": torch.tensor(n)} for n in (1, 3)]
    cfg = config(tmp_path / "t", steps=1, grad_accum=2)
    record = Trainer(model, lambda b: b, data, cfg, out=tmp_path / "t", loss=loss).fit().metrics
    assert record["n_seen"] == (1 * 1 + 3 * 3) / 4 and record["loss"] == 1.0
