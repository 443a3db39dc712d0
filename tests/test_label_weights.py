"""label_weights: a Transformer's loss as a weighted sum over its labels (example-averaged fine-tuning)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.peft import PeftConfig, apply_peft
from lmforge.tasks.model import example_weights
from peft_helpers import batch, tiny_model


def _weighted_reference(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum of weight * CE over the labelled positions, from (N, V) logits in row-major label order."""
    selected = labels != -100
    return (F.cross_entropy(logits.double(), labels[selected], reduction="none") * weights[selected]).sum()


@pytest.mark.parametrize("arch", ["gpt-tiny", "t5-tiny"])
def test_label_weights_weigh_each_label(arch):
    model = tiny_model(arch).double()
    b = batch(arch, B=3, T=9, labels=True)
    labels = b["labels"]
    labels[0, :3] = -100  # rows with different target counts
    weights = torch.rand(labels.shape, dtype=torch.float64)
    out = model(**b, label_weights=weights)
    torch.testing.assert_close(out.loss, _weighted_reference(out.logits, labels, weights), rtol=1e-10, atol=1e-12)
    # Weights of 1 / N everywhere are the ordinary mean.
    plain = model(**b)
    n = int((labels != -100).sum())
    torch.testing.assert_close(model(**b, label_weights=torch.full(labels.shape, 1.0 / n, dtype=torch.float64)).loss,
                               plain.loss, rtol=1e-10, atol=1e-12)


def test_example_weights_average_each_example_then_the_examples():
    labels = torch.tensor([[5, 6, -100, -100], [-100, -100, -100, -100], [1, 2, 3, 4]])
    weights, n = example_weights(labels)
    assert n == 2  # the empty row does not count
    torch.testing.assert_close(weights, torch.tensor([[0.25, 0.25, 0, 0], [0, 0, 0, 0], [0.125] * 4]))


def test_label_weights_shape_is_checked():
    model = tiny_model("gpt-tiny")
    b = batch("gpt-tiny", labels=True)
    with pytest.raises(ValueError, match=r"label_weights has shape \(2, 3\); labels have \(2, 7\)"):
        model(**b, label_weights=torch.ones(2, 3))


def test_prompt_tuning_extends_the_weights_with_its_prompt():
    """Prompt tuning prepends P positions to the labels (as -100); the weights must stay aligned."""
    model = apply_peft(tiny_model("gpt-tiny"), PeftConfig(method="prompt", num_virtual_tokens=3))
    b = batch("gpt-tiny", B=2, T=7, labels=True)
    weights, _ = example_weights(b["labels"])
    out = model(**b, label_weights=weights)
    selected = b["labels"] != -100
    per_token = F.cross_entropy(out.logits.float(), b["labels"][selected], reduction="none")
    torch.testing.assert_close(out.loss, (per_token * weights[selected]).sum(), rtol=1e-5, atol=1e-6)
