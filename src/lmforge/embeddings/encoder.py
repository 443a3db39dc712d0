"""Sentence and contextual word vectors from any lmforge model: tokenise -> run -> pick a layer -> pool.

A sentence embedding here is the Sentence-BERT chain (Reimers & Gurevych 2019): Transformer -> Pooling ->
(optional) L2 normalisation. The layer can be any of the N+1 hidden states (0 = embeddings, -1 = the final
output), or ``"scalar-mix"``: ELMo's softmax-weighted sum of all of them (Peters et al. 2018), uniform
until trained.

    texts (B strings) --tokenise, pad--> ids (B, T) --model--> N+1 x (B, T, D) --layer--> (B, T, D)
                      --pool--> (B, D) --normalize--> (B, D), unit rows

ELMo's biLM (:class:`lmforge.models.bilstm_lm.BiLM`) works the same way: its N+1 states are the projected
token embeddings and ``[h_fwd; h_bwd]`` of each LSTM layer, and ``"scalar-mix"`` uses the model's own mix.

Word alignment: :meth:`SentenceEncoder.word_vectors` takes pre-split words and averages each word's
sub-word vectors, so a tagger or a probe sees one vector per word (Tenney et al. 2019 pool spans likewise).

Example:
    >>> import lmforge, tempfile
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = tempfile.mkdtemp(); p = f"{d}/c.txt"
    >>> _ = open(p, "w").write("the cat sat on the mat\\n\\n" * 20)
    >>> tok = train_tokenizer([p], kind="wordpiece", vocab_size=60, family="bert", show_progress=False)
    >>> model = lmforge.build_model("bert-tiny", vocab_size=tok.vocab_size, n_layers=2, d_model=32,
    ...                             n_heads=2, d_ff=64)
    >>> enc = SentenceEncoder(model, tok)
    >>> enc.encode(["the cat", "sat on the mat"], pooling="mean").shape
    (2, 32)
    >>> [v.shape for v in enc.word_vectors([["the", "cat"]], layer=1)]
    [(2, 32)]
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

import lmforge
from lmforge.checkpoint import model_source
from lmforge.embeddings.pooling import POOLINGS, pool
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.nn.scalar_mix import ScalarMix
from lmforge.tokenization import Tokenizer
from lmforge.utils.folder_kinds import MODELS, require_kind

Layer = int | str


def default_pooling(model: nn.Module) -> str:
    """``last`` for decoder-only models (only the last token has seen the whole text), else ``mean``."""
    return "last" if getattr(model.config, "arch", "encoder") == "decoder" else "mean"


def hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """All N+1 hidden states of ``model`` for (B, T) ids, each (B, T, D); the last is the final (normed) output."""
    if hasattr(model, "layer_states"):  # ELMo's biLM: [embeddings; (fwd, bwd) of each LSTM layer]
        return model.layer_states(input_ids, attention_mask)
    if model.config.arch == "decoder":
        return list(model(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states)
    # encoder and encoder-decoder: the encoder stack alone, without a decoder or an LM head to pay for
    return list(model.encode(input_ids, attention_mask, output_hidden_states=True)[1])


class SentenceEncoder(nn.Module):
    """A model plus its tokenizer, producing sentence vectors and per-layer token/word vectors.

    Args:
        model: an lmforge Transformer (encoder, decoder or encoder-decoder: the latter uses its encoder), or
            ELMo's :class:`~lmforge.models.bilstm_lm.BiLM`.
        tokenizer: its :class:`lmforge.tokenization.Tokenizer`.
        max_length: truncate inputs to this many tokens (default: the model's ``max_seq_len``).
        scalar_mix: a :class:`ScalarMix` for ``layer="scalar-mix"`` (default: the model's own, as ELMo's biLM
            has, so a trained mix is saved with the model; else a fresh, uniform one).
        pooling: the default pooling of :meth:`encode` (default: :func:`default_pooling`; a folder trained by
            :func:`lmforge.embeddings.sbert.train_embedding` records its own in ``embedding.json``).
    """

    def __init__(self, model: nn.Module, tokenizer, max_length: int | None = None,
                 scalar_mix: ScalarMix | None = None, pooling: str | None = None):
        super().__init__()
        self.pooling = pooling or default_pooling(model)
        self.model = model
        self.tokenizer = tokenizer
        context = getattr(model.config, "max_seq_len", 512)
        self.max_length = max_length or context
        if self.max_length > context and getattr(model.config, "position", None) in ("learned", "sinusoidal"):
            # Past its position table the model cannot read at all (RoPE, relative positions and LSTMs can,
            # if less well): cut to what it reads, and say so.
            warnings.warn(f"--max-length {self.max_length} is more than the model reads: inputs are cut to its "
                          f"context of {context} tokens (max_seq_len); to keep more, use a model with a longer "
                          "context", UserWarning, stacklevel=2)
            self.max_length = context
        self.n_states = model.config.n_layers + 1  # embeddings + every block
        device = next(model.parameters()).device  # the mix must live beside the states it mixes
        if scalar_mix is None:
            scalar_mix = getattr(model, "scalar_mix", None)
        self.scalar_mix = scalar_mix if scalar_mix is not None else ScalarMix(self.n_states).to(device)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", **kwargs) -> "SentenceEncoder":
        """Model and tokenizer from one folder written by ``lmforge.save`` / ``lmforge convert`` (or a packaged
        model's name, such as ``all-MiniLM-L6-v2``: see :func:`lmforge.checkpoint.model_source`)."""
        folder = Path(model_source(path))
        if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").is_file():
            raise InputFileNotFound(f"{folder}: no tokenizer.json; embeddings need a model folder with its tokenizer")
        settings = folder / "embedding.json"
        if "pooling" not in kwargs and settings.is_file():
            kwargs["pooling"] = json.loads(settings.read_text(encoding="utf-8")).get("pooling")
        return cls(lmforge.load(folder, device=device), Tokenizer.load(folder), **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ differentiable core
    def tokenize(self, texts: Sequence[str] | Sequence[Sequence[str]], *, words: bool = False) -> dict:
        """Pad/truncate a batch to (B, T) tensors on the model's device (``word_ids`` kept as lists)."""
        batch = self.tokenizer.encode_batch(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                            is_split_into_words=words, return_word_ids=words)
        out = {k: torch.tensor(batch[k], device=self.device) for k in ("input_ids", "attention_mask")}
        if words:
            out["word_ids"] = batch["word_ids"]
        return out

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """All N+1 hidden states, each (B, T, D); the last one is the model's final (normed) output."""
        return hidden_states(self.model, input_ids, attention_mask)

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: Layer = -1) -> torch.Tensor:
        """(B, T, D) states of one layer (int, Python-style negative allowed) or the scalar mix."""
        states = self.hidden_states(input_ids, attention_mask)
        if layer == "scalar-mix":
            return self.scalar_mix(states)
        if not isinstance(layer, int) or not -len(states) <= layer < len(states):
            raise UserInputError(f"layer={layer!r}: use an int in [-{len(states)}, {len(states) - 1}] or 'scalar-mix'")
        return states[layer]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, pooling: str = "mean",
                layer: Layer = -1, normalize: bool = False) -> torch.Tensor:
        """Differentiable sentence vectors (B, D) from a tokenised batch (used by training)."""
        vectors = pool(self.token_states(input_ids, attention_mask, layer), attention_mask, pooling)
        return nn.functional.normalize(vectors, dim=-1) if normalize else vectors

    # ------------------------------------------------------------------ inference API
    @torch.no_grad()
    def encode(self, texts: Sequence[str], *, pooling: str | None = None, layer: Layer = -1, normalize: bool = True,
               batch_size: int = 32, progress: bool = False, sort_by_length: bool = True) -> np.ndarray:
        """Sentence embeddings, (len(texts), D) float32.

        Args:
            texts: strings.
            pooling: one of ``cls | mean | max | last``; default ``self.pooling``.
            layer: hidden state index (0 = embeddings, -1 = output) or ``"scalar-mix"``.
            normalize: L2-normalise rows, so a dot product is the cosine similarity.
            batch_size: texts per forward pass.
            progress: show a tqdm bar.
            sort_by_length: batch texts of similar length together (less padding); output keeps input order.
        """
        pooling = pooling or self.pooling
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}: use one of {', '.join(POOLINGS)}")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.model.config.d_model), dtype=np.float32)
        was_training = self.training
        self.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if sort_by_length else list(range(len(texts)))
        out = np.zeros((len(texts), self.model.config.d_model), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if progress:
            from tqdm.auto import tqdm
            starts = tqdm(starts, desc="embed", unit="batch")
        try:
            for start in starts:
                idx = order[start:start + batch_size]
                batch = self.tokenize([texts[i] for i in idx])
                vectors = self(batch["input_ids"], batch["attention_mask"], pooling=pooling, layer=layer,
                               normalize=normalize)
                out[idx] = vectors.float().cpu().numpy()
        finally:
            self.train(was_training)
        return out

    @torch.no_grad()
    def word_vectors(self, sentences: Sequence[Sequence[str]], *, layer: Layer = -1, batch_size: int = 32,
                     reduce: str = "mean") -> list[np.ndarray]:
        """Contextual vectors of pre-split words: one (n_words_i, D) array per sentence.

        A word cut into several sub-words gets their mean (``reduce="mean"``) or its first piece's vector
        (``"first"``, the BERT NER convention). A word that was truncated away gets a zero row.
        """
        return [v[0] for v in self.word_vectors_all_layers(sentences, layers=[layer], batch_size=batch_size,
                                                           reduce=reduce)]

    @torch.no_grad()
    def word_vectors_all_layers(self, sentences: Sequence[Sequence[str]], *, layers: Sequence[Layer] | None = None,
                                batch_size: int = 32, reduce: str = "mean") -> list[np.ndarray]:
        """Like :meth:`word_vectors` for several layers at once (one forward): per sentence (L, n_words, D).

        ``layers=None`` takes all N+1 hidden states (what a probe sweeps over).
        """
        if reduce not in ("mean", "first"):
            raise ValueError(f"reduce={reduce!r}: use 'mean' or 'first'")
        was_training = self.training
        self.eval()
        results: list[np.ndarray] = []
        try:
            for start in range(0, len(sentences), batch_size):
                chunk = [list(s) for s in sentences[start:start + batch_size]]
                batch = self.tokenize(chunk, words=True)
                states = self.hidden_states(batch["input_ids"], batch["attention_mask"])
                picked = [self.scalar_mix(states) if l == "scalar-mix" else states[l]
                          for l in (layers if layers is not None else range(len(states)))]
                stacked = torch.stack(picked, 1).float().cpu()  # (B, L, T, D)
                for b, words in enumerate(chunk):
                    results.append(_align(stacked[b], batch["word_ids"][b], len(words), reduce))
        finally:
            self.train(was_training)
        return results


def _align(states: torch.Tensor, word_ids: list[int | None], n_words: int, reduce: str) -> np.ndarray:
    """(L, T, D) token states -> (L, n_words, D) word states, via the tokenizer's word index per token."""
    L, _, D = states.shape
    out = torch.zeros(L, n_words, D)
    counts = torch.zeros(n_words)
    for t, w in enumerate(word_ids):
        if w is None or (reduce == "first" and counts[w] > 0):
            continue
        out[:, w] += states[:, t]
        counts[w] += 1
    return (out / counts.clamp(min=1)[None, :, None]).numpy()


def load_encoder(folder: str | Path, *, device: str = "cpu", max_length: int | None = None) -> SentenceEncoder:
    """:meth:`SentenceEncoder.load` for a folder a user named: a missing folder or tokenizer is a
    :class:`~lmforge.errors.UserInputError` that says what to give instead."""
    folder = Path(model_source(folder))
    if not folder.is_dir():
        raise UserInputError(f"--model {folder}: not a folder (convert a Hugging Face model with "
                             "`lmforge convert from-hf`)")
    require_kind(folder, (*MODELS, "bilm"), flag="--model")
    try:
        return SentenceEncoder.load(folder, device=device, max_length=max_length)
    except FileNotFoundError as exc:
        raise UserInputError(str(exc)) from None


def embed_texts(model: str | Path | SentenceEncoder, texts: Sequence[str], **encode_kwargs) -> np.ndarray:
    """One-call sentence embeddings from a model folder (or a :class:`SentenceEncoder`): (len(texts), D).

    Example (``all-MiniLM-L6-v2``: the pretrained model that ``make`` installs; any model folder works):
        >>> vecs = embed_texts("all-MiniLM-L6-v2", ["A man plays guitar.", "Someone plays music."])
        >>> vecs.shape
        (2, 384)
    """
    encoder = model if isinstance(model, SentenceEncoder) else SentenceEncoder.load(model)
    return encoder.encode(texts, **encode_kwargs)
