"""A linear-chain CRF tagger on standard word features (sklearn-crfsuite), the pre-neural tagging baseline.

Before BiLSTM-CRFs and pre-trained encoders, a CRF (Lafferty et al. 2001) on hand-made word features was the
named-entity tagger to beat (e.g. the WNUT shared tasks' baseline). Each word is described by the features of
sklearn-crfsuite's CoNLL tutorial, less the part-of-speech tags our CoNLL files do not have::

    bias; word.lower; suffixes word[-3:], word[-2:]; word.isupper, .istitle, .isdigit
    the previous and next word: -1:/+1: word.lower, .istitle, .isupper; BOS / EOS at the sentence's ends

trained with L-BFGS, L1 ``c1`` and L2 ``c2`` (0.1 each, the tutorial's), ``max_iterations``, every transition
allowed. The fitted model is crfsuite's own binary model file (weights and feature names, no code: not a
pickle), which :func:`load` opens again with the same library.

Example:
    >>> features(["Paris", "rocks"])[0]["word.istitle()"], features(["Paris", "rocks"])[1]["-1:word.lower()"]
    (True, 'paris')
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

MODEL_FILE = "crf.crfsuite"


def word_features(sentence: Sequence[str], i: int) -> dict:
    word = sentence[i]
    out = {"bias": 1.0, "word.lower()": word.lower(), "word[-3:]": word[-3:], "word[-2:]": word[-2:],
           "word.isupper()": word.isupper(), "word.istitle()": word.istitle(), "word.isdigit()": word.isdigit()}
    for offset, key in ((-1, "-1"), (1, "+1")):
        j = i + offset
        if 0 <= j < len(sentence):
            other = sentence[j]
            out.update({f"{key}:word.lower()": other.lower(), f"{key}:word.istitle()": other.istitle(),
                        f"{key}:word.isupper()": other.isupper()})
        else:
            out["BOS" if offset < 0 else "EOS"] = True
    return out


def features(sentence: Sequence[str]) -> list[dict]:
    """One feature dict per word of ``sentence``."""
    return [word_features(sentence, i) for i in range(len(sentence))]


def crf(c1: float = 0.1, c2: float = 0.1, max_iterations: int = 100, model_filename: str | None = None):
    """The unfitted ``sklearn_crfsuite.CRF`` of this baseline (``model_filename``: an existing model to read)."""
    import sklearn_crfsuite  # the finetune extra; imported here so the CLI's --help does not need it

    return sklearn_crfsuite.CRF(algorithm="lbfgs", c1=c1, c2=c2, max_iterations=max_iterations,
                                all_possible_transitions=True, model_filename=model_filename)


def fit(sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[str]], c1: float = 0.1, c2: float = 0.1,
        max_iterations: int = 100) -> bytes:
    """Train on word lists and their tags; the model file's bytes."""
    model = crf(c1, c2, max_iterations)
    model.fit([features(s) for s in sentences], [list(t) for t in tags])
    data = Path(model.modelfile.name).read_bytes()
    model.modelfile.cleanup()  # the temporary file sklearn-crfsuite trained into
    return data


def load(folder: str | Path):
    """The fitted CRF stored as ``folder/crf.crfsuite``."""
    return crf(model_filename=str(Path(folder) / MODEL_FILE))


def predict(model, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    return [list(t) for t in model.predict([features(s) for s in sentences])]
