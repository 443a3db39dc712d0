"""Causal LM (GPT): labels are the inputs shifted by one; ragged batches pad with -100 labels."""

import pytest
import torch

from lmforge.objectives.clm import CausalLM


def test_packed_blocks_shift_by_one_without_padding():
    x = torch.randint(5, 100, (4, 17), generator=torch.Generator().manual_seed(0))  # blocks of T + 1 tokens
    batch = CausalLM(pad_token_id=0)(list(x))
    assert torch.equal(batch["input_ids"], x[:, :-1])
    assert torch.equal(batch["labels"], x[:, 1:])
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])  # label t is input t + 1
    assert batch["attention_mask"].eq(1).all()


def test_ragged_sequences_pad_inputs_and_ignore_padded_labels():
    batch = CausalLM(pad_token_id=0)([[5, 6, 7, 8], [9, 10], torch.tensor([11, 12, 13])])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [9, 0, 0], [11, 12, 0]]
    assert batch["labels"].tolist() == [[6, 7, 8], [10, -100, -100], [12, 13, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    # Every real input position predicts the next token of its own sequence, and only those positions do.
    assert torch.equal(batch["labels"] != -100, batch["attention_mask"].bool())


def test_too_short_sequences_and_state():
    clm = CausalLM(pad_token_id=0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        clm([[5]])
    assert clm.state_dict() == {}
    with pytest.raises(ValueError, match="stateless"):
        clm.load_state_dict({"generator": torch.zeros(1)})
