"""DPO against TRL's ``DPOTrainer`` (the reference implementation): the same tiny GPT-2, the same batch (TRL's own
collated prompt/chosen/rejected rows), the same loss and implicit rewards, at fp32 tolerance.

TRL is in the test extra; without it this file is skipped.
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

import lmforge  # noqa: E402
from lmforge.align.dpo import DPOLoss  # noqa: E402


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_equals_trl_dpotrainer(beta, gpt2_dir, tmp_path):
    from trl import DPOConfig, DPOTrainer

    tok = transformers.GPT2TokenizerFast(vocab=str(gpt2_dir / "encoder.json"), merges=str(gpt2_dir / "vocab.bpe"))
    tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=len(tok),
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    policy, reference = transformers.GPT2LMHeadModel(cfg), transformers.GPT2LMHeadModel(cfg)
    rows = {"prompt": ["The film was", "A plot that", "It"],
            "chosen": [" great fun", " works", " shines bright today"],
            "rejected": [" dull", " falls flat on its face", " bores"]}
    args = DPOConfig(output_dir=str(tmp_path), beta=beta, per_device_train_batch_size=3, report_to=[], use_cpu=True,
                     bf16=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=policy, ref_model=reference, args=args,
                             train_dataset=datasets.Dataset.from_dict(rows), processing_class=tok)
        batch = next(iter(trainer.get_train_dataloader()))  # (2B, T): the B chosen rows, then the B rejected
        theirs = trainer.compute_loss(trainer.model, batch)
        ours_policy, ours_reference = lmforge.from_hf(policy), lmforge.from_hf(reference)
    assert batch["input_ids"].shape[0] == 6 and batch["completion_mask"].sum() > 0
    ours = DPOLoss(ours_reference, beta=beta)(ours_policy, {"input_ids": batch["input_ids"],
                                                            "attention_mask": batch["attention_mask"],
                                                            "response_mask": batch["completion_mask"]})
    torch.testing.assert_close(ours.loss, theirs.detach().float(), atol=1e-5, rtol=1e-5)
    # The same gradient, in the (tied) token embedding
    ours.loss.backward()
    theirs.backward()
    torch.testing.assert_close(ours_policy.embed_tokens.weight.grad, policy.transformer.wte.weight.grad, atol=1e-5,
                               rtol=1e-4)
    assert ours_policy.embed_tokens.weight.grad.abs().sum() > 0
