"""Sentence-BERT losses against their formulas; evaluation metrics; a short training run that must learn."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import embedding_helpers as h
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.losses import (SoftmaxClassifier, cosine_similarity_loss, multiple_negatives_ranking_loss,
                                       softmax_loss, triplet_loss)
from lmforge.embeddings.sbert import (evaluate_retrieval, evaluate_sts, loss_columns, retrieval_metrics,
                                      train_embedding)


def test_triplet_loss_matches_its_formula():
    a, p, n = torch.randn(6, 5), torch.randn(6, 5), torch.randn(6, 5)
    for eps in (1.0, 0.1, 5.0):
        want = sum(max(float(torch.dist(a[i], p[i]) - torch.dist(a[i], n[i])) + eps, 0.0) for i in range(6)) / 6
        assert float(triplet_loss(a, p, n, margin=eps)) == pytest.approx(want, rel=1e-5)
    assert float(triplet_loss(a, a, a + 10.0)) == 0.0  # satisfied margin: no loss, no gradient


def test_mnrl_is_cross_entropy_over_the_similarity_matrix_with_diagonal_targets():
    a, p, n = torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, 8)
    sims = torch.tensor([[F.cosine_similarity(a[i], p[j], dim=0) for j in range(5)] for i in range(5)])
    want = -sum(torch.log_softmax(20 * sims[i], 0)[i] for i in range(5)) / 5
    assert float(multiple_negatives_ranking_loss(a, p)) == pytest.approx(float(want), rel=1e-5)
    # hard negatives are extra columns
    hard = torch.cat([sims, torch.tensor([[F.cosine_similarity(a[i], n[j], dim=0) for j in range(5)]
                                          for i in range(5)])], 1)
    want = F.cross_entropy(20 * hard, torch.arange(5))
    assert float(multiple_negatives_ranking_loss(a, p, n)) == pytest.approx(float(want), rel=1e-5)
    assert float(multiple_negatives_ranking_loss(a, p, scale=1.0)) != pytest.approx(float(want))


def test_cosine_loss_is_mse_of_cosines():
    u, v, y = torch.randn(7, 4), torch.randn(7, 4), torch.rand(7)
    cos = torch.stack([u[i] @ v[i] / (u[i].norm() * v[i].norm()) for i in range(7)])
    assert float(cosine_similarity_loss(u, v, y)) == pytest.approx(float(((cos - y) ** 2).mean()), rel=1e-5)


def test_softmax_loss_is_cross_entropy_of_a_classifier_on_u_v_and_their_distance():
    torch.manual_seed(0)
    u, v, y = torch.randn(5, 4), torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    clf = SoftmaxClassifier(4, 3)
    W, b = clf.linear.weight, clf.linear.bias  # (3, 12), (3,)
    want = 0.0
    for i in range(5):
        features = torch.tensor([*u[i].tolist(), *v[i].tolist(), *(abs(a - c) for a, c in zip(u[i].tolist(),
                                                                                               v[i].tolist()))])
        logits = W @ features + b
        want -= float(torch.log_softmax(logits, 0)[y[i]]) / 5
    assert float(softmax_loss(u, v, y, clf)) == pytest.approx(want, rel=1e-5)
    # |u - v| is symmetric, [u; v] is not: swapping the pair changes the logits
    assert not torch.allclose(clf(u, v), clf(v, u))
    with pytest.raises(Exception, match="num_labels >= 2"):
        SoftmaxClassifier(4, 1)


def test_softmax_loss_matches_sentence_transformers():
    from sentence_transformers.losses import SoftmaxLoss

    class Fixed(torch.nn.Module):  # stands for the SentenceTransformer: the features are the embeddings
        device = torch.device("cpu")

        def forward(self, features):
            return {"sentence_embedding": features["embedding"]}

    torch.manual_seed(1)
    u, v, y = torch.randn(6, 8), torch.randn(6, 8), torch.tensor([0, 1, 2, 2, 1, 0])
    theirs = SoftmaxLoss(Fixed(), embedding_dimension=8, num_labels=3)
    ours = SoftmaxClassifier(8, 3)
    ours.linear.load_state_dict(theirs.classifier.state_dict())
    want = theirs([{"embedding": u}, {"embedding": v}], y)
    torch.testing.assert_close(softmax_loss(u, v, y, ours), want)


def test_retrieval_metrics_against_hand_ranks_and_ties():
    scores = np.array([[0.9, 0.5, 0.1], [0.9, 0.5, 0.1], [0.9, 0.5, 0.1], [0.3, 0.3, 0.3]])
    m = retrieval_metrics(scores, np.array([0, 1, 2, 1]), ks=(1, 2))
    # ranks 1, 2, 3 and (all tied) 3
    assert m["recall@1"] == 0.25 and m["recall@2"] == 0.5
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 3) / 4)


class _Lookup:
    """A fake encoder: fixed unit vectors per text, to test the evaluation on its own."""

    pooling = "mean"

    def __init__(self, table):
        self.table = table

    def encode(self, texts, **_):
        v = np.array([self.table[t] for t in texts], dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_evaluate_sts_and_retrieval_on_a_known_geometry():
    table = {"a": [1, 0], "a'": [1, 0.1], "b": [0, 1], "b'": [0.2, 1], "c": [1, 1]}
    # cosines: a-a' 0.995 > b-b' 0.981 > b-c 0.707 > a-b' 0.196; labels in the same order -> Spearman 1
    pairs = [{"text1": "a", "text2": "a'", "label": 1}, {"text1": "b", "text2": "b'", "label": 0.9},
             {"text1": "a", "text2": "b'", "label": 0}, {"text1": "b", "text2": "c", "label": 0.5}]
    enc = _Lookup(table)
    assert evaluate_sts(enc, pairs)["spearman"] == pytest.approx(1.0)
    swapped = [dict(p, label=l) for p, l in zip(pairs, [1, 0.9, 0.5, 0])]  # last two ranks swapped
    assert evaluate_sts(enc, swapped)["spearman"] == pytest.approx(0.8)
    r = evaluate_retrieval(enc, pairs, ks=(1,), positive_label=0.9)  # queries a and b; corpus a', b', c
    assert r == {"recall@1": 1.0, "mrr": 1.0, "queries": 2}


def test_loss_columns_reads_the_shipped_sets_and_names_missing_columns():
    triplets = [{"anchor": "a", "positive": "p", "negative": "n", "ref": "x", "neg_ref": "y"}]
    assert loss_columns(triplets, "triplet") == [("a", "p", "n")]
    assert loss_columns(triplets, "mnrl") == [("a", "p", "n")]
    pairs = [{"text1": "a", "text2": "b", "label": 1}, {"text1": "a", "text2": "c", "label": 0}]
    assert loss_columns(pairs, "mnrl") == [("a", "b")]
    assert loss_columns(pairs, "cosine") == [("a", "b", 1.0), ("a", "c", 0.0)]
    with pytest.raises(ValueError, match="missing anchor"):
        loss_columns(pairs, "triplet")


def _toy_pairs(n: int, seed: int) -> list[dict]:
    """A paraphrase swaps every word for its fixed 'synonym' (a derangement of the vocabulary), so the two sides
    share no token: an untrained model retrieves near chance, and only training can tie the pairs together."""
    rng = random.Random(seed)
    content = h.WORDS[1:]
    synonym = dict(zip(content, content[7:] + content[:7]))
    rows = []
    for _ in range(n):
        words = rng.sample(content, 3)
        rows.append({"text1": " ".join(words), "text2": " ".join(synonym[w] for w in reversed(words)), "label": 1})
    return rows


@pytest.mark.parametrize("loss", ["mnrl", "triplet", "cosine", "softmax"])
def test_training_lowers_the_loss_and_saves_a_reloadable_model(tmp_path, loss):
    tok = h.tokenizer(tmp_path, "bert")
    enc = SentenceEncoder(h.model(tok, "bert"), tok)
    pairs = _toy_pairs(96, seed=1)
    if loss == "triplet":
        rows = [{"anchor": p["text1"], "positive": p["text2"], "negative": q["text2"]}
                for p, q in zip(pairs, pairs[1:] + pairs[:1])]
    elif loss in ("cosine", "softmax"):
        rows = pairs + [{"text1": p["text1"], "text2": q["text2"], "label": 0} for p, q in zip(pairs, pairs[1:])]
    else:
        rows = pairs
    heldout = _toy_pairs(24, seed=2)
    before = evaluate_retrieval(enc, heldout)["mrr"]
    first = train_embedding(enc, rows, loss=loss, max_steps=1, batch_size=16, lr=1e-3, warmup=0.0)["loss"]
    result = train_embedding(enc, rows, loss=loss, epochs=8, batch_size=16, lr=1e-3, out=tmp_path / "sbert",
                             eval_pairs=heldout)
    assert result["loss"] < first
    if loss == "mnrl":  # the in-batch objective is the retrieval objective: it must improve it
        assert result["mrr"] > before + 0.3  # measured: 0.18 -> 0.68
    saved = SentenceEncoder.load(tmp_path / "sbert")
    assert json.loads((tmp_path / "sbert" / "embedding.json").read_text())["loss"] == loss
    texts = [p["text1"] for p in heldout[:4]]
    np.testing.assert_allclose(saved.encode(texts), enc.encode(texts), atol=1e-5)


def test_finetune_embedding_recipe_from_a_model_folder(tmp_path):
    folder = h.model_folder(tmp_path, "bert")
    from lmforge.embeddings.sbert import finetune_embedding

    rows = _toy_pairs(64, seed=1)
    result = finetune_embedding(str(folder), rows, out=tmp_path / "run", eval=_toy_pairs(16, seed=2), loss="mnrl",
                                epochs=8, batch_size=16, lr=1e-3, progress=False)
    assert result["after"]["mrr"] > result["before"]["mrr"] + 0.2
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["after"]["steps"] == result["after"]["steps"] == 32
    assert SentenceEncoder.load(tmp_path / "run" / "model").pooling == "mean"


def test_finetune_task_embedding_entry_point_reads_finetune_flags(tmp_path, capsys):
    import argparse

    from lmforge.embeddings.sbert import run_embedding_finetune
    from lmforge.cli.main import UserError

    folder = h.model_folder(tmp_path, "bert")
    train = tmp_path / "pairs.tsv"
    train.write_text("text1\ttext2\tlabel\n" + "".join(f"{r['text1']}\t{r['text2']}\t1\n" for r in _toy_pairs(32, 1)))
    args = argparse.Namespace(task="embedding", model=str(folder), train=str(train), out=str(tmp_path / "run"),
                              eval=None, loss="cosine", max_steps=3, batch_size=8, lr=1e-3, progress=False)
    assert run_embedding_finetune(args) == 0
    assert "done: 3 steps" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "model" / "embedding.json").read_text())["loss"] == "cosine"
    with pytest.raises(UserError, match="--loss"):
        run_embedding_finetune(argparse.Namespace(**{**vars(args), "loss": "hinge"}))
    with pytest.raises(UserError, match="--train"):
        run_embedding_finetune(argparse.Namespace(model=str(folder), out=str(tmp_path / "r2")))


def test_cli_finetune_task_embedding_on_the_shipped_triplets(tmp_path, capsys):
    from lmforge.cli.main import main

    folder = h.model_folder(tmp_path, "bert")
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(folder), "--task", "embedding", "--loss", "triplet",
                 "--train", "bible-triplets:train", "--max-steps", "2", "--batch-size", "4", "--max-length", "32",
                 "--no-progress", "--out", str(out)]) == 0
    assert "done: 2 steps" in capsys.readouterr().out
    assert SentenceEncoder.load(out / "model").encode(["In the beginning"]).shape == (1, 32)
