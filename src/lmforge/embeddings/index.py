"""A dense retrieval index: unit-norm document embeddings on disk, cosine top-k search.

On disk (``lmforge index build``)::

    DIR/embeddings.npy   (N, D) float32, L2-normalised rows (so cosine = dot product)
    DIR/docs.jsonl       one {"id": i, "text": ...} per row, in the order of the embeddings
    DIR/index.json       model folder, pooling, layer, N, D, backend
    DIR/hnsw.faiss       only with backend "faiss": a FAISS HNSW graph over the same vectors

Search is exact by default: one (N, D) x (D,) product and a partial sort, O(N D) per query, about 0.1 s for
a million 384-d vectors on one core, and exactly right. Beyond a few million documents (or when memory
for the float32 matrix runs out) use ``backend="faiss"``: an HNSW graph (Malkov & Yashunin 2018) answers in
roughly logarithmic time at the price of recall slightly below 1. FAISS is an optional dependency
(``pip install faiss-cpu``).

Example:
    >>> import numpy as np, tempfile
    >>> vecs = np.eye(3, dtype=np.float32)
    >>> idx = VectorIndex(vecs, ["a", "b", "c"])
    >>> [(i, t, round(s, 3)) for i, t, s in idx.search(np.array([[0.1, 0.9, 0.0]]), k=2)[0]]
    [(1, 'b', 0.994), (0, 'a', 0.11)]
    >>> VectorIndex.load(idx.save(tempfile.mkdtemp())).texts
    ['a', 'b', 'c']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_dir, atomic_save_npy, read_text_file, refuse_foreign_folder

EMBEDDINGS, DOCS, META, FAISS_FILE = "embeddings.npy", "docs.jsonl", "index.json", "hnsw.faiss"
BACKENDS = ("exact", "faiss")


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.allclose(norms, 1.0, atol=1e-6):
        return x  # already unit rows: dividing again would flip low bits, and a loaded index must equal the saved one
    return x / np.maximum(norms, 1e-12)


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


class VectorIndex:
    """Normalised vectors + their texts; exact (or FAISS HNSW) cosine top-k.

    Args:
        vectors: (N, D) document embeddings (normalised here if they are not).
        texts: the N documents.
        meta: settings to store (model, pooling, layer...).
        backend: ``"exact"`` or ``"faiss"`` (HNSW, inner product, M=32).
    """

    def __init__(self, vectors: np.ndarray, texts: Sequence[str], meta: dict[str, Any] | None = None,
                 backend: str = "exact", _graph=None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: use one of {', '.join(BACKENDS)}")
        vectors = _normalize(vectors)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"{len(texts)} texts but vectors of shape {vectors.shape}")
        self.vectors, self.texts, self.backend = vectors, list(texts), backend
        self.meta = dict(meta or {})
        self._graph = _graph
        if backend == "faiss" and self._graph is None:
            self._graph = self._build_graph()

    def _build_graph(self):
        try:
            import faiss
        except ImportError as exc:
            raise UserInputError("backend 'faiss' needs faiss (pip install faiss-cpu); use backend 'exact'") from exc
        graph = faiss.IndexHNSWFlat(self.vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = 200
        graph.add(self.vectors)
        return graph

    def __len__(self) -> int:
        return len(self.texts)

    def search_ids(self, queries: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of (Q, D) queries -> (ids (Q, k'), cosines (Q, k')), best first; k' = min(k, N)."""
        q = _normalize(np.atleast_2d(queries))
        k = min(k, len(self))
        if k <= 0:
            return np.zeros((len(q), 0), dtype=np.int64), np.zeros((len(q), 0), dtype=np.float32)
        if self.backend == "faiss":
            self._graph.hnsw.efSearch = max(64, 2 * k)  # the candidate list must exceed k for good recall
            scores, ids = self._graph.search(q, k)
            return ids.astype(np.int64), scores
        scores = q @ self.vectors.T  # (Q, N) cosines
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # unordered top k, O(N)
        top_scores = np.take_along_axis(scores, top, 1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        return np.take_along_axis(top, order, 1), np.take_along_axis(top_scores, order, 1)

    def search(self, queries: np.ndarray, k: int = 5) -> list[list[tuple[int, str, float]]]:
        """Per query: ``[(doc id, text, cosine), ...]`` best first."""
        ids, scores = self.search_ids(queries, k)
        return [[(int(i), self.texts[i], float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]

    def save(self, folder: str | Path) -> Path:
        """Write the index folder atomically (a temporary sibling renamed into place) and return its path."""
        folder = Path(folder)
        refuse_foreign_folder(folder, lambda f: (f / META).is_file(), "an index folder")
        meta = {**self.meta, "count": len(self), "dim": int(self.vectors.shape[1]), "backend": self.backend}
        with atomic_dir(folder) as tmp:
            # np.save onto a path writes with C's fwrite, whose short write on a full disk has no errno.
            atomic_save_npy(tmp / EMBEDDINGS, self.vectors)
            with open(tmp / DOCS, "w", encoding="utf-8") as f:
                for i, text in enumerate(self.texts):
                    f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
            (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            if self.backend == "faiss":
                import faiss
                with environment_errors(tmp / FAISS_FILE, "write"):  # faiss names the errno only in words
                    faiss.write_index(self._graph, str(tmp / FAISS_FILE))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "VectorIndex":
        folder = Path(folder)
        if not (folder / META).is_file():
            raise InputFileNotFound(f"{folder}: not an index folder (no {META}); build one with `lmforge index build`")
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        vectors = np.load(folder / EMBEDDINGS)
        with open(folder / DOCS, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        backend = meta.pop("backend", "exact")
        graph = None
        if backend == "faiss":
            import faiss
            graph = faiss.read_index(str(folder / FAISS_FILE))
        for key in ("count", "dim"):
            meta.pop(key, None)
        return cls(vectors, texts, meta, backend=backend, _graph=graph)


def read_docs(file: str | Path) -> list[str]:
    """Documents from a file: ``.jsonl`` (field ``text``) or plain text, one document per non-empty line."""
    file = Path(file)
    lines = [line for line in read_text_file(file).splitlines() if line.strip()]
    if file.suffix == ".jsonl":
        docs = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserInputError(f"{file}: line {number}: not valid JSON ({exc})") from None
            if not isinstance(row, dict) or "text" not in row:
                raise UserInputError(f"{file}: line {number}: no 'text' field")
            docs.append(row["text"])
        return docs
    return lines


def build_index(encoder, docs: Sequence[str], *, pooling: str | None = None, layer: int | str = -1,
                batch_size: int = 32, backend: str = "exact", progress: bool = False,
                meta: dict[str, Any] | None = None) -> VectorIndex:
    """Embed ``docs`` with a :class:`~lmforge.embeddings.SentenceEncoder` into a :class:`VectorIndex`."""
    pooling = pooling or encoder.pooling
    vectors = encoder.encode(docs, pooling=pooling, layer=layer, normalize=True, batch_size=batch_size,
                             progress=progress)
    return VectorIndex(vectors, docs, {**(meta or {}), "pooling": pooling, "layer": layer}, backend=backend)
