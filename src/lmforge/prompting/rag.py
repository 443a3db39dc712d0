"""Retrieval-augmented prompts: the top-k passages of a dense index, put into the prompt through a template.

Retrieve-then-read (Lewis et al. 2020; Izacard & Grave 2021 read the passages as concatenated text, as here): the
question is embedded by the index's own encoder, :meth:`VectorIndex.search <lmforge.embeddings.index.VectorIndex.
search>` returns the k most similar documents, and the prompt the generator continues is the template with the
passages and the question filled in::

    Passages:
    [1] In the beginning God created the heaven and the earth.
    [2] ...
    <blank line>
    Question: {question}
    Answer:

A query vector is only comparable with document vectors of the same encoder, so :func:`open_retriever` refuses an
index whose recorded encoder is not the one the query would be encoded with (the recorded folder, by its weights'
sha256, or ``model`` when given), naming both.

Example:
    >>> p = [Passage(7, 0.91, "Gen.1.1 In the beginning"), Passage(2, 0.5, "Gen.1.2 And the earth")]
    >>> print(build_prompt("Who created?", p))
    Passages:
    [1] Gen.1.1 In the beginning
    [2] Gen.1.2 And the earth
    <BLANKLINE>
    Question: Who created?
    Answer:
    >>> build_prompt("q", p, "{passages} | {question}")
    '[1] Gen.1.1 In the beginning\\n[2] Gen.1.2 And the earth | q'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lmforge.errors import InputFileNotFound, UserInputError

# The index, encoder and checkpoint modules (numpy, torch) are imported where they are used, so that a command's
# --help can show DEFAULT_TEMPLATE without loading torch.

# \n is spelled out so that --help shows the template as it would be typed on a command line.
DEFAULT_TEMPLATE = "Passages:\n{passages}\n\nQuestion: {question}\nAnswer:"
PASSAGE_LINE = "[{rank}] {text}"
# `lmforge prompt generate`: the question is a whole few-shot prompt (demonstrations, then the query's template),
# which already says what to answer
FEW_SHOT_TEMPLATE = "{passages}\n\n{question}"


@dataclass(frozen=True)
class Passage:
    """One retrieved document: its row in the index, its cosine similarity to the question, its text."""

    id: int
    score: float
    text: str

    def as_dict(self) -> dict:
        return {"id": self.id, "score": round(self.score, 6), "text": self.text}


def check_template(template: str, flag: str = "--rag-template") -> str:
    """``template`` if it holds ``{passages}`` and ``{question}`` once each (other braces are kept as typed)."""
    for slot in ("{passages}", "{question}"):
        if template.count(slot) != 1:
            raise UserInputError(f"{flag} {template!r}: needs {slot} exactly once (and {{passages}}, {{question}})")
    return template


def build_prompt(question: str, passages: Sequence[Passage], template: str = DEFAULT_TEMPLATE) -> str:
    """The template with the numbered passages (one per line, best first) and the question filled in."""
    check_template(template, "template")
    block = "\n".join(PASSAGE_LINE.format(rank=rank, text=p.text) for rank, p in enumerate(passages, 1))
    # replace, not str.format: a question or a passage may hold braces of its own
    return template.replace("{passages}", block).replace("{question}", question)


def encoder_identity(model: str | Path) -> dict:
    """What an index records of its encoder: the folder (a packaged model's name resolved) and the sha256 of its
    weights, which tells two encoders apart wherever their folders lie."""
    from lmforge.checkpoint import model_source, packaged_model
    from lmforge.utils.manifest import sha256_file

    folder = Path(model_source(model)).resolve()
    weights = sorted(folder.glob("*.safetensors"))
    identity = {"model": str(folder)}
    if packaged_model(str(model)):
        identity["model_name"] = packaged_model(str(model))
    if weights:
        identity["weights_sha256"] = sha256_file(weights[0]) if len(weights) == 1 else \
            "+".join(sha256_file(w)[:16] for w in weights)
    return identity


def _describe(meta: dict) -> str:
    sha = meta.get("weights_sha256")
    return f"{meta.get('model_name') or meta.get('model')}" + (f" (weights {sha[:12]})" if sha else "")


class Retriever:
    """An index and the encoder of its queries: :meth:`retrieve` gives each question its top-k passages."""

    def __init__(self, index: VectorIndex, encoder, folder: str | Path = "index"):
        self.index, self.encoder, self.folder = index, encoder, str(folder)

    def retrieve(self, questions: Sequence[str], k: int) -> list[list[Passage]]:
        if k < 1:
            raise UserInputError(f"-k {k}: retrieve at least 1 passage")
        queries = self.encoder.encode(list(questions), pooling=self.index.meta.get("pooling"),
                                      layer=self.index.meta.get("layer", -1))
        if queries.shape[1] != self.index.vectors.shape[1]:
            raise UserInputError(f"--index {self.folder}: the encoder gives {queries.shape[1]}-d vectors but the "
                                 f"index holds {self.index.vectors.shape[1]}-d ones")
        return [[Passage(i, s, t) for i, t, s in hits] for hits in self.index.search(queries, k)]

    def prompts(self, questions: Sequence[str], k: int, template: str = DEFAULT_TEMPLATE
                ) -> tuple[list[str], list[list[Passage]]]:
        """(the prompts, the passages each one holds)."""
        passages = self.retrieve(questions, k)
        return [build_prompt(q, p, template) for q, p in zip(questions, passages)], passages


def open_retriever(folder: str | Path, model: str | Path | None = None, device: str = "cpu",
                   flag: str = "--index") -> Retriever:
    """The index in ``folder`` with its encoder: the recorded one, or ``model`` if it is the same encoder.

    Raises:
        InputFileNotFound: no index folder there.
        UserInputError: ``model`` (or the recorded folder, rewritten since) is another encoder than the index's,
            or the recorded folder is gone and no ``model`` was given.
    """
    from lmforge.embeddings.encoder import load_encoder
    from lmforge.embeddings.index import META, VectorIndex

    folder = Path(folder)
    if not folder.is_dir():
        raise InputFileNotFound(f"{flag} {folder}: no such folder; build one with `lmforge index build`")
    if not (folder / META).is_file():
        raise InputFileNotFound(f"{flag} {folder}: not an index folder (no {META}); build one with "
                                "`lmforge index build`")
    index = VectorIndex.load(folder)
    recorded = index.meta.get("model")
    target = model if model is not None else recorded
    if not target:
        raise UserInputError(f"{flag} {folder}: {META} records no encoder; pass --rag-model DIR (the model "
                             "the index was built with)")
    if model is None and not Path(recorded).is_dir():
        raise UserInputError(f"{flag} {folder}: its encoder folder {recorded} is gone; pass --rag-model DIR "
                             "(the same model)")
    query = encoder_identity(target)
    if "weights_sha256" in index.meta and "weights_sha256" in query:
        same = index.meta["weights_sha256"] == query["weights_sha256"]
    else:  # an index built before weights were recorded: the folder is all there is to compare
        same = recorded is None or Path(recorded).resolve() == Path(query["model"])
    if not same:
        raise UserInputError(f"{flag} {folder} was built with encoder {_describe(index.meta)}, but the question "
                             f"would be encoded with {_describe(query)}: query vectors of another encoder are not "
                             "comparable; use the index's encoder or rebuild the index with this one")
    return Retriever(index, load_encoder(target, device=device, max_length=index.meta.get("max_length")), folder)
