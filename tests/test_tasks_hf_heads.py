"""Hugging Face sequence classifiers keep their heads: converted folders evaluate with HF's exact logits."""

from __future__ import annotations

import importlib

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

from lmforge.interop.hf import convert_from_hf  # noqa: E402
from lmforge.tasks import inference  # noqa: E402
from lmforge.tasks.model import load_task_model  # noqa: E402
from tests import task_helpers as th  # noqa: E402

V = 200
SHAPE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             id2label={0: "0", 1: "1"}, label2id={"0": 0, "1": 1})


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_converted_classifier_matches_transformers(kind, tmp_path):
    torch.manual_seed(0)
    if kind == "bert":
        hf = tf.BertForSequenceClassification(tf.BertConfig(**SHAPE)).eval()
    else:
        hf = tf.RobertaForSequenceClassification(tf.RobertaConfig(**SHAPE, max_position_embeddings=66,
                                                                  pad_token_id=1)).eval()
    folder = tmp_path / "clf"
    convert_from_hf(hf, folder)
    model = load_task_model(folder)
    assert model.spec.task == "classify" and model.spec.labels == ["0", "1"]
    ids = torch.randint(3, V, (3, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 4 + [0] * 5])
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits
        ours = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)

    # With a tokenizer beside it, the folder is usable by `lmforge evaluate` as it is.
    if kind == "bert":
        th.tokenizer(tmp_path, "bert").save(folder)
        scores = inference.evaluate(folder, th.write_sentiment(tmp_path / "dev.tsv", 8))
        assert scores["examples"] == 8 and 0.0 <= scores["accuracy"] <= 1.0
