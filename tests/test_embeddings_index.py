"""Retrieval index: exact top-k against brute force, disk round trip, FAISS recall, and the CLI end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

import embedding_helpers as h
from lmforge.cli.main import main
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.index import VectorIndex, build_index


def _random_index(n=400, d=16, seed=0, **kwargs):
    rng = np.random.default_rng(seed)
    return VectorIndex(rng.standard_normal((n, d)), [f"doc {i} ✓" for i in range(n)], **kwargs), rng


def test_exact_search_is_the_brute_force_top_k():
    index, rng = _random_index()
    queries = rng.standard_normal((25, 16))
    ids, scores = index.search_ids(queries, k=7)
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    vectors = index.vectors
    for q in range(25):
        cos = vectors @ unit[q]
        want = np.argsort(-cos)[:7]
        assert ids[q].tolist() == want.tolist()
        np.testing.assert_allclose(scores[q], cos[want], rtol=1e-5)
    assert index.search_ids(queries[:1], k=10_000)[0].shape == (1, 400)  # k larger than the index


def test_index_round_trips_on_disk(tmp_path):
    index, rng = _random_index(meta={"pooling": "mean", "layer": -1})
    index.save(tmp_path / "idx")
    again = VectorIndex.load(tmp_path / "idx")
    assert again.texts == index.texts and again.meta == {"pooling": "mean", "layer": -1}
    np.testing.assert_array_equal(again.vectors, index.vectors)
    q = rng.standard_normal((3, 16))
    assert again.search(q, 5) == index.search(q, 5)
    with pytest.raises(FileNotFoundError, match="not an index"):
        VectorIndex.load(tmp_path)


def test_faiss_hnsw_agrees_with_exact_search(tmp_path):
    exact, rng = _random_index(n=2000, d=32)
    ann = VectorIndex(exact.vectors, exact.texts, backend="faiss")
    queries = rng.standard_normal((50, 32)).astype(np.float32)
    want, _ = exact.search_ids(queries, 10)
    got, _ = ann.search_ids(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want)])
    assert recall >= 0.95
    ann.save(tmp_path / "ann")
    assert VectorIndex.load(tmp_path / "ann").search_ids(queries, 10)[0].tolist() == got.tolist()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return h.model_folder(tmp_path_factory.mktemp("emb"), "bert")


def test_cli_help_for_every_representation_command(capsys):
    for argv in (["embed"], ["index"], ["index", "build"], ["index", "search"], ["probe"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv + ["--help"])
        assert exit_.value.code == 0
        assert "usage: lmforge " + argv[0] in capsys.readouterr().out


def test_cli_embed_writes_the_encoders_vectors(folder, tmp_path, capsys):
    texts = h.sentences(7, seed=3)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n\n", encoding="utf-8")
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "v.npy"), "--quiet", "--pooling", "max", "--layer", "1"]) == 0
    got = np.load(tmp_path / "v.npy")
    want = SentenceEncoder.load(folder).encode(texts, pooling="max", layer=1)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "v.txt")]) == 2
    assert "use a .npy" in capsys.readouterr().err
    assert main(["embed", "--model", str(tmp_path / "nope"), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "v.npy")]) == 2


def test_cli_index_build_and_search_find_a_document_by_its_own_text(folder, tmp_path, capsys):
    docs = list(dict.fromkeys(h.sentences(40, seed=5)))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    assert main(["index", "build", "--model", str(folder), "--docs", str(tmp_path / "docs.jsonl"),
                 "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["index", "search", "--index", str(tmp_path / "idx"), "--query", docs[11], "-k", "3", "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [hit["rank"] for hit in hits] == [1, 2, 3]
    assert hits[0]["text"] == docs[11] and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
    # the CLI's ranking is the library's
    enc = SentenceEncoder.load(folder)
    want = build_index(enc, docs).search(enc.encode([docs[11]]), 3)[0]
    assert [hit["id"] for hit in hits] == [i for i, _, _ in want]
