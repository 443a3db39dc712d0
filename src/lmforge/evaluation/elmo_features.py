"""ELMo in a task model: a frozen biLM's scalar-mixed layers beside a word baseline's own embeddings.

Peters et al. (2018), "Deep contextualized word representations", §3.3: run the pre-trained biLM, freeze its
weights, and feed the task model ``[x_k; ELMo_k]``, its own context-free word vector ``x_k`` concatenated with
a task-specific mix of the biLM's L+1 layers (eq. 1)::

    ELMo_k = gamma * sum_j softmax(s)_j * h_{k,j}        s (L+1,) and gamma: learned with the task

    words (B, T) --the biLM's tokenizer--> pieces (B, S) --frozen biLM--> L+1 x (B, S, D)
        --mean of each word's pieces--> L+1 x (B, T, D) --ScalarMix--> ELMo (B, T, D)
    [embed(words) (B, T, E); ELMo (B, T, D)] --dropout--> BiLSTM -> ... (the baseline, unchanged above)

``lmforge finetune --baseline bilstm|bilstm-tagger --features elmo=BILM_DIR`` trains that
(:func:`parse_features` reads the flag; :class:`ElmoFeatures` is the module).

* **Frozen.** The biLM is held outside the module tree (not a submodule): the optimizer never sees its
  weights, ``Trainer``'s ``model.train()`` never reaches it (it stays in eval mode: no dropout, so a word's
  features are the same at every step), and its states are computed under ``torch.no_grad``. Only ``s`` and
  ``gamma`` (:class:`~lmforge.nn.scalar_mix.ScalarMix`) and the baseline's own weights train.
* **Units.** The baselines read words; the biLM reads its tokenizer's pieces. Each baseline word is split by
  the biLM's own tokenizer (``is_split_into_words``, framed by the tokenizer's template as pre-training framed
  its segments) and a word's vector is the mean of its pieces' vectors (as
  :meth:`lmforge.embeddings.SentenceEncoder.word_vectors` aligns words). The biLM sees the words in their
  original case (the baseline's vocabulary lower-cases them). Pieces past the biLM's ``max_seq_len`` are cut;
  their words get zero ELMo vectors.
* **Saved.** The task folder's weights hold the baseline and the mix (``elmo.mix.*``), never the biLM: its
  ``task.json`` records the biLM's folder, the sha256 of its ``model.safetensors``, its tokenizer's digest and
  its config, and :meth:`ElmoFeatures.from_record` reloads it from there (refused in one line if it moved or
  changed).

Example:
    >>> import torch
    >>> from lmforge.models.bilstm_lm import BiLM, BiLMConfig
    >>> bilm = BiLM(BiLMConfig(vocab_size=30, d_embed=8, d_hidden=8, n_layers=2))
    >>> elmo = ElmoFeatures(bilm, tokenizer=None)
    >>> ids, words = torch.tensor([[2, 5, 6, 7, 3]]), torch.tensor([[-1, 0, 0, 1, -1]])  # word 0 has 2 pieces
    >>> elmo(ids, torch.ones_like(ids), words, n_words=2).shape, [p.shape for p in elmo.parameters()]
    (torch.Size([1, 2, 16]), [torch.Size([3]), torch.Size([])])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from lmforge.checkpoint import load_bilm
from lmforge.embeddings.static import words as split_words
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.model_folder import TOKENIZER_FILE, WEIGHTS_FILE
from lmforge.nn.scalar_mix import ScalarMix
from lmforge.tasks.base import pad_batch
from lmforge.tokenization import Tokenizer
from lmforge.utils.folder_kinds import KINDS, WrongFolderKind, describe, folder_kind
from lmforge.utils.manifest import sha256_file

# kind -> what its value is (the help text and the refusal of an unknown kind list these)
FEATURE_KINDS = {"elmo": "elmo=BILM_DIR, a biLM folder from `lmforge pretrain --objective bilm`"}
# The baselines that read words through an embedding the features can sit beside.
FEATURE_BASELINES = ("bilstm", "bilstm-tagger")
FEATURES_KEY = "features"  # task.json: {"features": {"elmo": record}}
NO_WORD = -1  # the word index of a piece that belongs to no word (framing, padding)


def parse_features(values: Sequence[str] | None) -> dict[str, str]:
    """``["elmo=runs/bilm/model"]`` -> ``{"elmo": "runs/bilm/model"}``; a bad entry is one line listing the kinds.

    Example:
        >>> parse_features(["elmo=runs/bilm/model"])
        {'elmo': 'runs/bilm/model'}
        >>> try:
        ...     parse_features(["bert=runs/bert"])
        ... except UserInputError as exc:
        ...     print(exc)
        --features bert=runs/bert: unknown feature kind 'bert'; kinds: elmo=BILM_DIR, a biLM folder from `lmforge pretrain --objective bilm`
    """
    kinds = "; ".join(FEATURE_KINDS.values())
    out: dict[str, str] = {}
    for value in values or []:
        kind, sep, path = str(value).partition("=")
        kind = kind.strip()
        if not sep or not path.strip():
            raise UserInputError(f"--features {value}: expected KIND=PATH; kinds: {kinds}")
        if kind not in FEATURE_KINDS:
            raise UserInputError(f"--features {value}: unknown feature kind {kind!r}; kinds: {kinds}")
        if kind in out:
            raise UserInputError(f"--features {value}: {kind} is given twice ({kind}={out[kind]} already)")
        out[kind] = path.strip()
    return out


def check_baseline(features: dict[str, str] | None, baseline: str) -> None:
    """Refuse features for a baseline that has no word embedding to put them beside."""
    if features and baseline not in FEATURE_BASELINES:
        given = " ".join(f"{k}={v}" for k, v in features.items())
        raise UserInputError(f"--features {given}: --baseline {baseline} takes no features; use --baseline "
                             f"{' or '.join(FEATURE_BASELINES)}")


def _check_bilm_folder(path: Path, flag: str) -> None:
    kind = folder_kind(path)
    if kind == "missing":
        raise InputFileNotFound(f"{flag}{path}: no such folder (give a biLM folder: RUN/model of "
                                "`lmforge pretrain --objective bilm`)")
    if kind == "run" and folder_kind(path / "model") == "bilm":
        raise WrongFolderKind(f"{flag}{describe(path, kind)}; pass its biLM, {path / 'model'}")
    if kind != "bilm":
        what = f"{describe(path, kind)}, not" if kind in KINDS else f"{path}: not"  # a file or unknown: just "not"
        raise WrongFolderKind(f"{flag}{what} an ELMo biLM folder (config.json with arch: bilstm, "
                              "model.safetensors and tokenizer.json: RUN/model of `lmforge pretrain --objective bilm`)")
    for name in (WEIGHTS_FILE, TOKENIZER_FILE):
        if not (path / name).is_file():
            raise InputFileNotFound(f"{flag}{path}: an ELMo biLM folder without {name} (`lmforge pretrain "
                                    "--objective bilm` writes both into RUN/model)")


def cased_words(text: str) -> list[str]:
    """The words a baseline reads in ``text`` (:func:`lmforge.embeddings.static.words`), in their original case
    for the biLM; the lower-cased ones where lower-casing changed the split (a rare Unicode case).

    Example:
        >>> cased_words("A fine film.")
        ['A', 'fine', 'film', '.']
    """
    cased, lower = split_words(text, lowercase=False), split_words(text)
    return cased if len(cased) == len(lower) else lower


class ElmoFeatures(nn.Module):
    """A frozen biLM, its tokenizer and the task's :class:`ScalarMix`: per-word ELMo vectors (B, T, D).

    Args:
        bilm: a :class:`~lmforge.models.bilstm_lm.BiLM`; frozen here (no grad, eval mode, not a submodule).
        tokenizer: the biLM's :class:`~lmforge.tokenization.Tokenizer` (for :meth:`pieces`).
        source: what :meth:`record` writes into task.json (the folder, its digests and config).
    """

    def __init__(self, bilm: nn.Module, tokenizer: Tokenizer | None, source: dict[str, Any] | None = None) -> None:
        super().__init__()
        bilm.requires_grad_(False)
        bilm.eval()
        # Not a submodule: its weights stay out of state_dict (the task folder records where they are),
        # out of parameters() (the optimizer) and out of train() (it keeps eval mode).
        self.__dict__["bilm"] = bilm
        self.tokenizer = tokenizer
        self.source = dict(source or {})
        self.mix = ScalarMix(bilm.config.n_layers + 1)

    @property
    def dim(self) -> int:
        """D, the width of an ELMo vector (2H, or 2P with projections)."""
        return self.bilm.config.d_model

    def _apply(self, fn, *args, **kwargs):
        # .to(device) / .double() move the frozen biLM with the mix it feeds
        self.bilm._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)

    # ------------------------------------------------------------------ the folder
    @classmethod
    def from_folder(cls, path: str | Path, flag: str = "--features elmo=") -> "ElmoFeatures":
        """The biLM of folder ``path``, refused in one line when it is no biLM folder (saying what it is)."""
        path = Path(path).resolve()
        _check_bilm_folder(path, flag)
        bilm, tokenizer = load_bilm(path), Tokenizer.load(path)
        source = {"path": str(path), "sha256": sha256_file(path / WEIGHTS_FILE), "tokenizer_sha256": tokenizer.sha256(),
                  "config": bilm.config.to_dict()}
        return cls(bilm, tokenizer, source)

    def record(self) -> dict[str, Any]:
        """What task.json keeps to reload this biLM: folder, sha256 of its weights and tokenizer, config."""
        return dict(self.source)

    @classmethod
    def from_record(cls, record: dict[str, Any], where: str | Path) -> "ElmoFeatures":
        """The biLM a task folder recorded (``where``: its task.json, named in the messages), checked unchanged."""
        path = Path(record.get("path", ""))
        if folder_kind(path) != "bilm" or not (path / WEIGHTS_FILE).is_file():
            raise InputFileNotFound(f"{where}: the task reads its ELMo features from the biLM {path}, which is not "
                                    "there any more (put the biLM folder back at that path)")
        digest = sha256_file(path / WEIGHTS_FILE)
        if digest != record.get("sha256"):
            raise UserInputError(f"{where}: the biLM {path} changed since the task was trained (sha256 of "
                                 f"{WEIGHTS_FILE} {digest[:12]}..., recorded {str(record.get('sha256'))[:12]}...)")
        features = cls.from_folder(path, flag=f"{where}: ")
        if features.source["tokenizer_sha256"] != record.get("tokenizer_sha256"):
            raise UserInputError(f"{where}: the tokenizer of the biLM {path} changed since the task was trained")
        return features

    # ------------------------------------------------------------------ inputs
    def pieces(self, words: Sequence[str]) -> dict[str, list[int]]:
        """One example's biLM input: ``elmo_ids`` (S,) pieces, framed, and ``elmo_words`` (S,) the word each
        piece belongs to (``-1``: none); cut to the biLM's ``max_seq_len``."""
        enc = self.tokenizer.encode_batch([list(words)], is_split_into_words=True, return_word_ids=True,
                                          truncation=True, max_length=self.bilm.config.max_seq_len)
        ids, word_ids = enc["input_ids"][0], [NO_WORD if w is None else int(w) for w in enc["word_ids"][0]]
        if not ids:  # no words and no framing: one padding piece of no word keeps the batch's shapes
            ids, word_ids = [self.bilm.config.pad_token_id], [NO_WORD]
        return {"elmo_ids": ids, "elmo_words": word_ids}

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pad the :meth:`pieces` of a batch: ``elmo_ids``, ``elmo_mask``, ``elmo_words``, each (B, S)."""
        ids, mask = pad_batch([e["elmo_ids"] for e in examples], self.bilm.config.pad_token_id)
        words = pad_batch([e["elmo_words"] for e in examples], NO_WORD)[0]
        return {"elmo_ids": ids, "elmo_mask": mask.long(), "elmo_words": words}

    # ------------------------------------------------------------------ forward
    def word_layers(self, elmo_ids: torch.Tensor, elmo_mask: torch.Tensor, elmo_words: torch.Tensor,
                    n_words: int) -> torch.Tensor:
        """(L+1, B, T, D): every biLM layer at each word, the mean over its pieces (zeros for no piece)."""
        with torch.no_grad():  # frozen: nothing of the biLM is in the graph
            states = torch.stack(self.bilm.layer_states(elmo_ids, elmo_mask))  # (L+1, B, S, D)
        L, B, S, D = states.shape
        # scatter every piece into slot b*T + word; pieces of no word (and words past n_words) into a spare slot
        keep = (elmo_words >= 0) & (elmo_words < n_words) & elmo_mask.bool()
        slot = torch.where(keep, torch.arange(B, device=states.device)[:, None] * n_words + elmo_words, B * n_words)
        sums = states.new_zeros(L, B * n_words + 1, D).index_add_(1, slot.flatten(), states.flatten(1, 2))
        counts = states.new_zeros(B * n_words + 1).index_add_(0, slot.flatten(), keep.flatten().to(states.dtype))
        return (sums[:, :-1] / counts[:-1].clamp(min=1)[None, :, None]).view(L, B, n_words, D)

    def forward(self, elmo_ids: torch.Tensor, elmo_mask: torch.Tensor, elmo_words: torch.Tensor,
                n_words: int) -> torch.Tensor:
        """(B, T, D) ELMo vectors, ``gamma * sum_j softmax(s)_j h_j`` per word; gradients reach s and gamma."""
        return self.mix(list(self.word_layers(elmo_ids, elmo_mask, elmo_words, n_words)))


class WithFeatures(nn.Module):
    """A word baseline (``task``: BiLSTM classifier or tagger built with ``feature_dim = elmo.dim``) reading
    ELMo vectors beside its embeddings; state_dict keys ``task.*`` and ``elmo.mix.*``."""

    def __init__(self, task: nn.Module, elmo: ElmoFeatures) -> None:
        super().__init__()
        self.task, self.elmo = task, elmo

    @property
    def embed(self) -> nn.Embedding:
        return self.task.embed

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, *, elmo_ids: torch.Tensor,
                elmo_mask: torch.Tensor, elmo_words: torch.Tensor, **_):
        features = self.elmo(elmo_ids, elmo_mask, elmo_words, n_words=input_ids.shape[1])  # (B, T, D)
        return self.task(input_ids, labels, features=features)


def load_features(meta: dict[str, Any], where: str | Path) -> ElmoFeatures | None:
    """The features a task folder's task.json (``meta``) records, or None."""
    records = meta.get(FEATURES_KEY) or {}
    unknown = [k for k in records if k not in FEATURE_KINDS]
    if unknown:
        raise UserInputError(f"{where}: unknown feature kind(s) {', '.join(unknown)}; kinds: "
                             f"{', '.join(FEATURE_KINDS)}")
    return ElmoFeatures.from_record(records["elmo"], where) if "elmo" in records else None
