"""Tokenizers on HF ``tokenizers``: training, the model families' special tokens, encode/decode, save/load.

Four kinds of vocabulary are trained by ``tokenizers`` (nothing here re-implements BPE):

    kind       model      pre-tokenisation                 decode
    byte-bpe   BPE        GPT-2 byte level (lossless)      exact: decode(encode(x)) == x
    bpe        BPE        SentencePiece-style "▁" spaces   whitespace runs become one space
    unigram    Unigram    SentencePiece-style "▁" spaces   whitespace runs become one space
    wordpiece  WordPiece  BERT (split on space/punct.)     "##" pieces joined, spaces around punct.

A *family* fixes the special tokens, their roles and how a sequence / a pair is wrapped:

    family   special tokens (ids in this order)        single            pair
    bert     [PAD] [UNK] [CLS] [SEP] [MASK]            [CLS] A [SEP]     [CLS] A [SEP] B [SEP]
    roberta  <s> <pad> </s> <unk> <mask>               <s> A </s>        <s> A </s></s> B </s>
    bart     <s> <pad> </s> <unk> <mask>               <s> A </s>        <s> A </s></s> B </s>
    t5       <pad> </s> <unk> ... <extra_id_0..99>     A </s>            A </s> B </s>
    gpt      <|endoftext|>                             A                 A B

T5's 100 sentinels come last in the vocabulary (``--vocab-size`` counts them). GPT has no unknown
token; it gains ``<unk>`` only for kinds that can meet unknown characters (all but byte-bpe).

A saved tokenizer is a folder holding ``tokenizer.json`` (HF format, loadable by
``tokenizers.Tokenizer.from_file`` and ``transformers``) and ``lmforge_tokenizer.json`` (family, kind and
the role of each special token). :meth:`Tokenizer.load` also reads a BERT ``vocab.txt`` and GPT-2
``vocab.json`` + ``merges.txt`` (or OpenAI's ``encoder.json`` + ``vocab.bpe``).

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("the cat sat on the mat\\n\\nthe dog sat on the log\\n" * 50)
    >>> tok = train_tokenizer([d / "a.txt"], kind="byte-bpe", vocab_size=300, family="gpt",
    ...                       show_progress=False)
    >>> ids = tok.encode("the cat sat")
    >>> tok.decode(ids)
    'the cat sat'
    >>> tok.special_token_ids()
    {'bos_token_id': 0, 'eos_token_id': 0}
    >>> folder = tok.save(d / "tok")
    >>> Tokenizer.load(folder).special_token_ids()["eos_token_id"]
    0
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import (
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as _Backend

from lmforge.data.sources import iter_documents, resolve_inputs
from lmforge.errors import InputFileNotFound, LmforgeError
from lmforge.utils.io import atomic_dir, atomic_write_text, make_folder
from lmforge.utils.lock import remove_stale_temporaries

KINDS = ("bpe", "byte-bpe", "wordpiece", "unigram")
SIDECAR = "lmforge_tokenizer.json"
# Roles in the order the ModelConfig fields are listed; key = role, config field = f"{role}_token_id".
_SENTENCE_PUNCTUATION = set('.!?"\')»”’…')  # what a sentence-ending token may consist of
ROLES = ("pad", "bos", "eos", "unk", "mask", "cls", "sep", "decoder_start")
T5_SENTINELS = tuple(f"<extra_id_{i}>" for i in range(100))


@dataclass(frozen=True)
class Family:
    """Special tokens of one model family.

    Args:
        tokens: special tokens placed first in a trained vocabulary, in id order.
        roles: role (see :data:`ROLES`) -> token.
        single: ``TemplateProcessing`` template for one sequence, or None to add nothing.
        pair: template for a pair of sequences.
        sentinels: tokens appended at the *end* of the vocabulary (T5's span-corruption sentinels).
    """

    tokens: tuple[str, ...]
    roles: dict[str, str]
    single: str | None
    pair: str | None
    sentinels: tuple[str, ...] = ()


_ROBERTA_ROLES = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>",
                  "cls": "<s>", "sep": "</s>"}
FAMILIES: dict[str, Family] = {
    "bert": Family(
        tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        roles={"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1"),
    "roberta": Family(
        tokens=("<s>", "<pad>", "</s>", "<unk>", "<mask>"), roles=dict(_ROBERTA_ROLES),
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>"),
    # BART's decoder starts from </s> (fairseq convention kept by HF's BartConfig).
    "bart": Family(
        tokens=("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
        roles={**_ROBERTA_ROLES, "decoder_start": "</s>"},
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>"),
    "t5": Family(
        tokens=("<pad>", "</s>", "<unk>"),
        roles={"pad": "<pad>", "eos": "</s>", "unk": "<unk>", "decoder_start": "<pad>"},
        single="$A </s>", pair="$A </s> $B </s>", sentinels=T5_SENTINELS),
    "gpt": Family(tokens=("<|endoftext|>",), roles={"bos": "<|endoftext|>", "eos": "<|endoftext|>"},
                  single=None, pair=None),
}
# Default family per kind when none is given: the pairing the classic models used.
DEFAULT_FAMILY = {"byte-bpe": "gpt", "bpe": "roberta", "wordpiece": "bert", "unigram": "t5"}


class TokenizerError(LmforgeError, ValueError):
    """A tokenizer cannot be built or loaded; the message says which file or option is wrong."""


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise TokenizerError(f"unknown tokenizer family {name!r}: choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _post_processor(single: str | None, pair: str | None, specials: Iterable[str], backend: _Backend,
                    byte_level: bool):
    # Template pieces look like "[SEP]" or "[SEP]:1"; "$A"/"$B" are the sequences.
    pieces = {p.split(":")[0] for p in f"{single or ''} {pair or ''}".split()}
    used = [t for t in dict.fromkeys(specials) if t in pieces]
    parts = []
    if byte_level:
        # Keeps offsets on the word (without its leading "Ġ" space), as RoBERTa/GPT-2 do.
        parts.append(processors.ByteLevel(trim_offsets=True))
    if single:
        parts.append(processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, backend.token_to_id(t)) for t in used]))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else processors.Sequence(parts)


def _sentencepiece_like(backend: _Backend) -> None:
    # Collapsing whitespace first keeps "\n" and tabs out of the pieces ("▁" marks a single space).
    backend.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " ")])
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")


def _bert_pipeline(backend: _Backend, lowercase: bool) -> None:
    # Exactly what transformers' BertTokenizerFast builds from a vocab.txt (convert_slow_tokenizer).
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")


def _wordpiece(unk: str | None, lowercase: bool, vocab: dict[str, int] | None = None) -> _Backend:
    backend = _Backend(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##",
                                        max_input_chars_per_word=100))
    _bert_pipeline(backend, lowercase)
    return backend


def _continuations(backend: _Backend) -> list[str]:
    """The ``##c`` pieces of a trained WordPiece vocabulary: one per character seen inside a word, sorted."""
    return sorted(t for t in backend.get_vocab(with_added_tokens=False) if len(t) == 3 and t.startswith("##"))


def _canonical_wordpiece(backend: _Backend, specials: Sequence[str], unk: str | None,
                         lowercase: bool) -> _Backend:
    """A trained WordPiece tokenizer whose ids depend only on its tokens: the special tokens keep theirs, the rest
    follow by piece length, word-initial pieces before ``##`` ones, then by text.

    WordPiece tokenises by longest match, so ids carry no meaning of their own. The second training run put the
    ``##c`` pieces among the special tokens, so they are dropped from those here.
    """
    vocab = backend.get_vocab(with_added_tokens=False)
    kept = sorted(specials, key=vocab.__getitem__)

    def key(token: str) -> tuple[int, bool, str]:
        piece = token.removeprefix("##")
        return len(piece), piece != token, piece

    order = kept + sorted(set(vocab) - set(kept), key=key)
    canonical = _wordpiece(unk, lowercase, {t: i for i, t in enumerate(order)})
    canonical.add_special_tokens(list(specials))
    return canonical


def _canonical_unigram(backend: _Backend, n_specials: int) -> None:
    """Give a trained Unigram model scores and ids that depend only on the corpus.

    The trainer leaves two traces of hash-map order (huggingface/tokenizers#1794 is the WordPiece twin):
    - it sums its EM statistics in that order, so scores differ in their last bits and near-equal pieces swap ids:
      scores are rounded to 1e-6, which leaves every segmentation as it was, and pieces are ordered by them (ties
      by text);
    - the characters that EM dropped come back for coverage at the lowest score plus 0, 1e-4, 2e-4, ... in that
      order: those scores go to them in character order instead.
    The special tokens lead, as trained.
    """
    model = json.loads(backend.to_str())["model"]
    pieces = [[piece, round(score, 6)] for piece, score in model["vocab"]]
    rest = pieces[n_specials:]
    if rest:
        low = min(score for _, score in rest)
        rungs: dict[int, list[list]] = {}
        for piece in rest:
            step = (piece[1] - low) / 1e-4
            if len(piece[0]) == 1 and abs(step - round(step)) < 0.05:
                rungs.setdefault(round(step), []).append(piece)
        ladder = list(itertools.chain.from_iterable(itertools.takewhile(bool, map(rungs.get, itertools.count()))))
        for piece, score in zip(sorted(ladder), sorted(p[1] for p in ladder)):
            piece[1] = score
    order = pieces[:n_specials] + sorted(rest, key=lambda p: (-p[1], p[0]))
    backend.model = models.Unigram([tuple(p) for p in order], model["unk_id"], model.get("byte_fallback", False))


def _byte_level_pipeline(backend: _Backend) -> None:
    # add_prefix_space=False keeps the round trip exact: decode(encode(x)) == x.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()


def _roles_for(family: Family, kind: str | None) -> dict[str, str]:
    roles = dict(family.roles)
    if "unk" not in roles and kind not in (None, "byte-bpe"):
        roles["unk"] = "<unk>"
    return roles


def train_tokenizer(
    files: Sequence[str | Path],
    *,
    kind: str = "byte-bpe",
    vocab_size: int = 8192,
    family: str | None = None,
    min_frequency: int = 2,
    lowercase: bool = False,
    text_field: str = "text",
    errors: str = "strict",
    show_progress: bool = True,
) -> "Tokenizer":
    """Train a vocabulary with HF ``tokenizers`` on corpus files (any format :mod:`lmforge.data.sources` reads).

    Args:
        files: files, globs or folders (``.txt``, ``.jsonl``, ``.csv``, ``.tsv``, ``.parquet``, optionally
            ``.gz``/``.zst``).
        kind: ``"byte-bpe"``, ``"bpe"``, ``"wordpiece"`` or ``"unigram"``.
        vocab_size: size of the final vocabulary, special tokens and T5 sentinels included.
        family: ``"bert"``, ``"roberta"``, ``"bart"``, ``"t5"`` or ``"gpt"``; default by kind
            (:data:`DEFAULT_FAMILY`).
        min_frequency: pairs/pieces seen fewer times are not merged (BPE, WordPiece).
        lowercase: lower-case text first (WordPiece only; the other kinds keep case).
        text_field: field/column holding the text in JSONL/CSV/TSV/Parquet inputs.
        errors: ``"strict"`` fails on non-UTF-8 bytes (naming file and byte offset); ``"replace"`` uses U+FFFD.
        show_progress: show ``tokenizers``' progress bars on stderr.

    Returns:
        The trained :class:`Tokenizer`. The same corpus and arguments give the same tokenizer, byte for byte
        (WordPiece reads the corpus twice for that: see the comment in the code).

    Example:
        >>> import tempfile, pathlib
        >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
        >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
        >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
        >>> tok.special_token_ids()["cls_token_id"]
        2
    """
    if kind not in KINDS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}: choose one of {', '.join(KINDS)}")
    family = family or DEFAULT_FAMILY[kind]
    fam = _family(family)
    roles = _roles_for(fam, kind)
    specials = list(dict.fromkeys(list(fam.tokens) + [roles[r] for r in roles]))
    n_train = vocab_size - len(fam.sentinels)
    minimum = len(specials) + (256 if kind == "byte-bpe" else 1)
    if n_train < minimum:
        raise TokenizerError(f"--vocab-size {vocab_size} is too small for kind {kind!r} and family {family!r}: "
                             f"need at least {minimum + len(fam.sentinels)}")
    paths = resolve_inputs(files)

    def train(backend: _Backend, trainer: trainers.Trainer) -> int:
        """Train ``backend`` on the corpus; returns how many documents it read."""
        documents = iter_documents(paths, text_field=text_field, errors=errors)
        seen = 0

        def batches():
            nonlocal seen
            # Lists of documents let the Rust side pre-tokenise a whole batch in parallel.
            while batch := list(itertools.islice(documents, 1000)):
                seen += len(batch)
                yield batch

        backend.train_from_iterator(batches(), trainer=trainer)
        return seen

    def nothing_to_train_on() -> None:
        raise TokenizerError(f"no text to train on in {', '.join(map(str, paths))} (are the files empty?)")

    unk = roles.get("unk")
    if kind == "byte-bpe":
        backend = _Backend(models.BPE())
        _byte_level_pipeline(backend)
        trainer = trainers.BpeTrainer(vocab_size=n_train, min_frequency=min_frequency, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show_progress)
    elif kind == "bpe":
        backend = _Backend(models.BPE(unk_token=unk))
        _sentencepiece_like(backend)
        trainer = trainers.BpeTrainer(vocab_size=n_train, min_frequency=min_frequency, special_tokens=specials,
                                      show_progress=show_progress)
    elif kind == "wordpiece":
        # tokenizers numbers the ##c pieces in hash-map order (huggingface/tokenizers#1794); merges tie-break on
        # those ids, so one corpus gave different vocabularies. A first run, stopped before any merge, finds the
        # ##c pieces; the real run gets them, sorted, among its special tokens, so every id it uses is fixed.
        backend = _wordpiece(unk, lowercase)
        if not train(backend, trainers.WordPieceTrainer(vocab_size=1, special_tokens=specials,
                                                        continuing_subword_prefix="##", show_progress=False)):
            nothing_to_train_on()
        continuations = _continuations(backend)
        backend = _wordpiece(unk, lowercase)
        trainer = trainers.WordPieceTrainer(vocab_size=n_train, min_frequency=min_frequency,
                                            special_tokens=specials + continuations, continuing_subword_prefix="##",
                                            show_progress=show_progress)
    else:
        backend = _Backend(models.Unigram())
        _sentencepiece_like(backend)
        trainer = trainers.UnigramTrainer(vocab_size=n_train, special_tokens=specials, unk_token=unk,
                                          show_progress=show_progress)

    if not train(backend, trainer):
        nothing_to_train_on()
    if kind == "wordpiece":
        backend = _canonical_wordpiece(backend, specials, unk, lowercase)
    elif kind == "unigram":
        _canonical_unigram(backend, len(specials))
    if fam.sentinels:
        backend.add_special_tokens(list(fam.sentinels))
    backend.post_processor = _post_processor(fam.single, fam.pair, specials, backend,
                                             byte_level=kind == "byte-bpe")
    return Tokenizer(backend, family=family, kind=kind, roles=roles, sentinels=fam.sentinels)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the lmforge family: which special token plays which role.

    Padding and truncation are arguments of each call, never state left on the backend (a
    ``tokenizer.json`` that enables them is loaded with both switched off).

    Args:
        backend: the HF ``tokenizers.Tokenizer``.
        family: family name (see :data:`FAMILIES`) or None for a foreign tokenizer.
        kind: vocabulary kind (see :data:`KINDS`) if known.
        roles: role -> special token, e.g. ``{"eos": "</s>"}``; roles whose token is missing are dropped.
        sentinels: sentinel tokens (T5), in order ``<extra_id_0>, <extra_id_1>, ...``.

    Example:
        >>> import tempfile, pathlib
        >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
        >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
        >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
        >>> batch = tok(["a b", "c"], padding=True, return_tensors="pt")
        >>> batch["input_ids"].shape  # (B, T)
        torch.Size([2, 4])
    """

    def __init__(self, backend: _Backend, *, family: str | None = None, kind: str | None = None,
                 roles: dict[str, str] | None = None, sentinels: Sequence[str] = ()) -> None:
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.family = family
        self.kind = kind
        self.roles = {r: t for r, t in (roles or {}).items() if backend.token_to_id(t) is not None}
        self.sentinels = [t for t in sentinels if backend.token_to_id(t) is not None]
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable for DataLoader workers: the lock is per process.
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (ids are ``0 .. vocab_size - 1``)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        return self.backend.id_to_token(idx)

    def special_token_ids(self) -> dict[str, Any]:
        """Ids of the special tokens, keyed by the :class:`lmforge.config.ModelConfig` field names.

        Returns:
            ``{"pad_token_id": ..., "eos_token_id": ..., ...}`` for the roles this family has (others are
            omitted), plus ``"sentinel_token_ids"`` (a list, T5 only).

        Example:
            >>> import tempfile, pathlib
            >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
            >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
            >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
            >>> from lmforge.config import ModelConfig
            >>> cfg = ModelConfig(vocab_size=len(tok), **{k: v for k, v in tok.special_token_ids().items()
            ...                   if k.endswith("_token_id")})
            >>> cfg.pad_token_id, cfg.cls_token_id
            (0, 2)
        """
        out: dict[str, Any] = {f"{r}_token_id": self.backend.token_to_id(self.roles[r])
                               for r in ROLES if r in self.roles}
        if self.sentinels:
            out["sentinel_token_ids"] = [self.backend.token_to_id(t) for t in self.sentinels]
        return out

    def sentence_end_ids(self) -> list[int]:
        """Ids of the tokens that end a sentence: punctuation-only tokens holding ``.``, ``!`` or ``?``
        (``.``, ``?!``, ``."`` ...), specials excluded. BART's sentence permutation splits flat documents
        at them; a full stop inside ``3.5`` splits too, an approximation that only reorders noise.

        Example:
            >>> import tempfile, pathlib
            >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
            >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
            >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
            >>> ids = tok.sentence_end_ids()
            >>> sorted(tok.decode([i]) for i in ids)
            ['!', '.', '?']
        """
        specials = {self.backend.token_to_id(t) for t in [*self.roles.values(), *self.sentinels]}
        out = []
        for idx in range(self.vocab_size):
            text = self.backend.decode([idx], skip_special_tokens=False).strip()
            if (idx not in specials and text and any(c in ".!?" for c in text)
                    and all(c in _SENTENCE_PUNCTUATION for c in text)):
                out.append(idx)
        return out

    def continuation_ids(self) -> list[int] | None:
        """Ids of the pieces that continue the word before them (whole-word and span masking group by word).

        A piece *starts* a word when it carries the vocabulary's word-start mark: WordPiece marks the
        others instead (``##ing``); SentencePiece-style BPE and Unigram mark starts with ``▁``; byte-level
        BPE with the byte-level form of a leading space or other whitespace (``Ġ``, ``Ċ``, ...). So for the
        last two a word is a whitespace-delimited run (``world.`` is one word). Special tokens and T5
        sentinels always start a word. Computed once per tokenizer; None when the kind is unknown (a
        foreign tokenizer whose model is none of the four kinds).

        Example:
            >>> import tempfile, pathlib
            >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
            >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
            >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
            >>> pieces = tok.tokenize("a hat sat")
            >>> pieces
            ['a', 'h', '##at', 'sat']
            >>> [tok.token_to_id(p) in tok.continuation_ids() for p in pieces]
            [False, False, True, False]
        """
        if "_continuation" not in self.__dict__:
            self._continuation = self._scan_continuation_ids()
        return self._continuation

    def _scan_continuation_ids(self) -> list[int] | None:
        if self.kind == "wordpiece":
            prefix = getattr(self.backend.model, "continuing_subword_prefix", None) or "##"
            continues = lambda piece: piece.startswith(prefix)  # noqa: E731
        elif self.kind in ("bpe", "unigram"):
            continues = lambda piece: not piece.startswith("▁")  # noqa: E731
        elif self.kind == "byte-bpe":
            # The byte-level alphabet's spelling of the six ASCII whitespace bytes (" " is "Ġ", "\n" is "Ċ").
            spaces = set(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
                         .pre_tokenize_str(" \t\n\r\x0b\x0c")[0][0])
            continues = lambda piece: piece[:1] not in spaces  # noqa: E731
        else:
            return None
        specials = {self.backend.token_to_id(t) for t in [*self.roles.values(), *self.sentinels]}
        added = set(self.backend.get_added_tokens_decoder())
        return [idx for idx in range(self.vocab_size)
                if idx not in specials and idx not in added and continues(self.backend.id_to_token(idx) or "")]

    def special_token(self, role: str) -> str | None:
        """The token playing ``role`` (``"eos"``, ``"pad"``, ...), or None."""
        return self.roles.get(role)

    @property
    def pad_id(self) -> int:
        """Id used for padding: the pad token, else eos (GPT has no pad token), else 0."""
        for role in ("pad", "eos"):
            if role in self.roles:
                return self.backend.token_to_id(self.roles[role])
        return 0

    @property
    def boundary_id(self) -> int | None:
        """Token separating packed documents: eos, else sep (BERT), else None."""
        for role in ("eos", "sep"):
            if role in self.roles:
                return self.backend.token_to_id(self.roles[role])
        return None

    def sha256(self) -> str:
        """Digest of the serialised tokenizer: equal digests encode identically.

        Serialised after one parse, because Unigram scores written by a freshly trained tokenizer can
        differ in the last digit from the same scores re-read (the same tokenizer, saved and loaded,
        must keep its digest).
        """
        canonical = _Backend.from_str(self.backend.to_str()).to_str()
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------ encode / decode
    def tokenize(self, text: str) -> list[str]:
        """The tokens (strings) of ``text``, without special tokens."""
        with self._lock:
            return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str | Sequence[str], pair: str | Sequence[str] | None = None, *,
               add_special_tokens: bool = True, is_split_into_words: bool = False) -> list[int]:
        """Ids of one text (or pair), with the family's special tokens unless ``add_special_tokens=False``.

        Args:
            text: a string, or a list of words when ``is_split_into_words``.
            pair: optional second sequence (sentence-pair tasks).
            add_special_tokens: wrap with the family template (``[CLS] A [SEP]``, ``<s> A </s>``, ...).
            is_split_into_words: ``text``/``pair`` are already split into words (tagging tasks).

        Returns:
            A list of ids, shape ``(T,)``.
        """
        with self._lock:  # never while another thread has padding/truncation switched on
            return self.backend.encode(text, pair, is_pretokenized=is_split_into_words,
                                       add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (a list or a 1-D tensor/array of ids)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """Texts of a batch of id sequences (a list of lists or a ``(B, T)`` tensor/array)."""
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return self.backend.decode_batch([list(x) for x in batch], skip_special_tokens=skip_special_tokens)

    @contextlib.contextmanager
    def _configured(self, padding, truncation, max_length, pad_to_multiple_of):
        # The backend holds padding/truncation as state; set it for one call and restore it after.
        with self._lock:
            try:
                if truncation:
                    if max_length is None:
                        raise TokenizerError("truncation=True needs max_length")
                    self.backend.enable_truncation(max_length, strategy="longest_first")
                if padding:
                    length = max_length if padding == "max_length" else None
                    if padding == "max_length" and max_length is None:
                        raise TokenizerError("padding='max_length' needs max_length")
                    pad_token = self.backend.id_to_token(self.pad_id)
                    self.backend.enable_padding(pad_id=self.pad_id, pad_token=pad_token, length=length,
                                                pad_to_multiple_of=pad_to_multiple_of)
                yield
            finally:
                self.backend.no_padding()
                self.backend.no_truncation()

    def encode_batch(
        self,
        texts: Sequence[str] | Sequence[Sequence[str]],
        pairs: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        is_split_into_words: bool = False,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_offsets: bool = False,
        return_word_ids: bool = False,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """Encode a batch in parallel (Rust threads), with optional padding, truncation, offsets, word ids.

        Args:
            texts: ``B`` strings, or ``B`` lists of words when ``is_split_into_words``.
            pairs: optional ``B`` second sequences.
            add_special_tokens: wrap each item with the family template.
            is_split_into_words: inputs are pre-split words; ``word_ids`` then index those words.
            padding: ``False``; ``True``/``"longest"`` pads to the longest item; ``"max_length"`` to ``max_length``.
                Pads with the pad token (eos for GPT) on the right.
            truncation: cut items (pairs: longest first) to ``max_length`` tokens, specials included.
            max_length: length limit for truncation and ``padding="max_length"``.
            pad_to_multiple_of: round the padded length up to a multiple of this.
            return_offsets: add ``"offsets"``: per token ``(start, end)`` character span in its text
                (``(0, 0)`` for special and padding tokens).
            return_word_ids: add ``"word_ids"`` (word index per token, None for specials/padding) and, for
                pairs, ``"sequence_ids"`` (0/1/None).
            return_tensors: None for lists, ``"pt"`` for torch tensors, ``"np"`` for numpy arrays (needs
                equal lengths, i.e. padding).

        Returns:
            Dict with ``input_ids`` and ``attention_mask`` (``B`` lists, or ``(B, T)`` arrays), plus
            ``token_type_ids`` for pairs and the optional keys above.

        Example:
            >>> import tempfile, pathlib
            >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
            >>> _ = corpus.write_text("The cat sat on the mat. Did the dog sit?\\n\\nThe dog sat on the log!\\n" * 50)
            >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=200, show_progress=False)
            >>> b = tok.encode_batch(["a b c", "d"], padding=True, return_tensors="pt")
            >>> b["input_ids"].shape, b["attention_mask"][1].tolist()
            (torch.Size([2, 5]), [1, 1, 1, 0, 0])
        """
        if padding is True:
            padding = "longest"
        if padding not in (False, None, "longest", "max_length"):
            raise TokenizerError(f"padding={padding!r}: use False, True, 'longest' or 'max_length'")
        inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        with self._configured(padding, truncation, max_length, pad_to_multiple_of):
            encs = self.backend.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                             add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {"input_ids": [e.ids for e in encs],
                               "attention_mask": [e.attention_mask for e in encs]}
        if pairs is not None:
            out["token_type_ids"] = [e.type_ids for e in encs]
        if return_offsets:
            out["offsets"] = [e.offsets for e in encs]
        if return_word_ids:
            out["word_ids"] = [e.word_ids for e in encs]
            if pairs is not None:
                out["sequence_ids"] = [e.sequence_ids for e in encs]
        if return_tensors:
            out = self._to_tensors(out, return_tensors)
        return out

    @staticmethod
    def _to_tensors(out: dict[str, Any], kind: str) -> dict[str, Any]:
        if kind not in ("pt", "np"):
            raise TokenizerError(f"return_tensors={kind!r}: use 'pt' or 'np'")
        lengths = {len(x) for x in out["input_ids"]}
        if len(lengths) > 1:
            raise TokenizerError("items have different lengths; pass padding=True to return tensors")
        import numpy as np

        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if key in out:
                arr = np.asarray(out[key], dtype=np.int64)
                if kind == "pt":
                    import torch

                    arr = torch.from_numpy(arr)
                out[key] = arr
        return out

    def __call__(self, text, pair=None, **kwargs) -> dict[str, Any]:
        """HF-style call: a string gives one item (lists of ids), a list of strings gives a batch.

        See :meth:`encode_batch` for the keyword arguments.
        """
        single = isinstance(text, str) or (kwargs.get("is_split_into_words") and text and isinstance(text[0], str))
        if not single:
            return self.encode_batch(text, pair, **kwargs)
        out = self.encode_batch([text], None if pair is None else [pair], **kwargs)
        return {k: v[0] for k, v in out.items()}

    # ------------------------------------------------------------------ save / load
    def sidecar(self) -> dict[str, Any]:
        """The lmforge metadata saved next to ``tokenizer.json``."""
        return {"format": "lmforge-tokenizer", "version": 1, "family": self.family, "kind": self.kind,
                "special_tokens": dict(self.roles), "sentinels": list(self.sentinels),
                "special_token_ids": self.special_token_ids(), "vocab_size": self.vocab_size}

    def save(self, folder: str | Path) -> Path:
        """Write ``tokenizer.json`` and ``lmforge_tokenizer.json`` into ``folder``.

        A new folder, or one holding nothing but a tokenizer, is replaced as a whole, atomically: a failed or
        killed save never pairs a new vocabulary with the old roles. In a folder with other files (a model
        folder being staged) each file is written atomically.
        """
        folder = Path(folder)
        files = {"tokenizer.json": self.backend.to_str(pretty=True),
                 SIDECAR: json.dumps(self.sidecar(), indent=2) + "\n"}
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else None
        if not folder.exists() or (names and names <= set(files) and folder.resolve() != Path.cwd()):
            remove_stale_temporaries(folder.parent, folder.name)  # a killed earlier save's leftovers
            with atomic_dir(folder) as tmp:
                for name, text in files.items():
                    (tmp / name).write_text(text, encoding="utf-8")
        else:
            make_folder(folder)
            for name, text in files.items():
                atomic_write_text(folder / name, text)
        return folder

    @classmethod
    def load(cls, path: str | Path, *, family: str | None = None, lowercase: bool | None = None) -> "Tokenizer":
        """Load a tokenizer from a folder or a file.

        Accepted: an lmforge folder (``tokenizer.json`` + ``lmforge_tokenizer.json``); any HF
        ``tokenizer.json`` (file or folder; the family is guessed from its special tokens); a BERT
        ``vocab.txt``; GPT-2 ``vocab.json`` + ``merges.txt`` or OpenAI ``encoder.json`` + ``vocab.bpe``.

        Args:
            path: folder or file.
            family: override the (saved or guessed) family, e.g. ``"bart"`` (indistinguishable from
                RoBERTa by its tokens).
            lowercase: for ``vocab.txt`` only; default from a ``tokenizer_config.json`` beside it
                (``do_lower_case``), else True as in ``BertTokenizerFast``.

        Example (GPT-2's own folder gives ``{'bos_token_id': 50256, 'eos_token_id': 50256}``):
            >>> import pathlib, tempfile
            >>> d = pathlib.Path(tempfile.mkdtemp())
            >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
            >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
            >>> _ = tok.save(d / "tok")
            >>> Tokenizer.load(d / "tok").special_token_ids()
            {'bos_token_id': 0, 'eos_token_id': 0}
            >>> Tokenizer.load(d / "tok" / "tokenizer.json").family  # a bare HF file: the family is guessed
            'gpt'
        """
        path = Path(path)
        if not path.exists():
            raise InputFileNotFound(f"tokenizer not found: {path}")
        folder = path if path.is_dir() else path.parent
        name = None if path.is_dir() else path.name
        if name in (None, "tokenizer.json") and (folder / "tokenizer.json").is_file():
            return cls._load_json(folder / "tokenizer.json", family)
        if name == SIDECAR and (folder / "tokenizer.json").is_file():
            return cls._load_json(folder / "tokenizer.json", family)
        if name and name.endswith(".json") and name not in ("vocab.json", "encoder.json"):
            return cls._load_json(path, family)
        if name in (None, "vocab.txt") and (folder / "vocab.txt").is_file():
            return cls._load_wordpiece_vocab(folder / "vocab.txt", family, lowercase)
        for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
            if name in (None, vocab, merges) and (folder / vocab).is_file():
                if not (folder / merges).is_file():
                    raise TokenizerError(f"{folder / vocab} needs {merges} beside it")
                return cls._load_gpt2_bpe(folder / vocab, folder / merges, family)
        raise TokenizerError(f"{path}: no tokenizer found; expected tokenizer.json, vocab.txt, "
                             "vocab.json + merges.txt or encoder.json + vocab.bpe")

    from_file = load

    @classmethod
    def _load_json(cls, file: Path, family: str | None) -> "Tokenizer":
        try:
            backend = _Backend.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise TokenizerError(f"{file}: not a valid tokenizer.json ({exc})") from exc
        meta = {}
        if (file.parent / SIDECAR).is_file() and file.name == "tokenizer.json":
            meta = json.loads((file.parent / SIDECAR).read_text(encoding="utf-8"))
        fam = family or meta.get("family") or _guess_family(backend)
        roles = meta.get("special_tokens")
        if roles is None or (family and family != meta.get("family")):
            roles = _guess_roles(backend, fam)
        sentinels = meta.get("sentinels", list(T5_SENTINELS) if fam == "t5" else [])
        return cls(backend, family=fam, kind=meta.get("kind") or _guess_kind(backend), roles=roles,
                   sentinels=sentinels)

    @classmethod
    def _load_wordpiece_vocab(cls, vocab: Path, family: str | None, lowercase: bool | None) -> "Tokenizer":
        if lowercase is None:
            lowercase = True
            cfg = vocab.parent / "tokenizer_config.json"
            if cfg.is_file():
                lowercase = bool(json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case", True))
        backend = _Backend(models.WordPiece(models.WordPiece.read_file(str(vocab)), unk_token="[UNK]",
                                            max_input_chars_per_word=100))
        _bert_pipeline(backend, lowercase)
        fam = _family(family or "bert")
        present = [t for t in fam.tokens if backend.token_to_id(t) is not None]
        backend.add_special_tokens(present)
        backend.post_processor = _post_processor(fam.single, fam.pair, present, backend, byte_level=False)
        return cls(backend, family=family or "bert", kind="wordpiece", roles=fam.roles)

    @classmethod
    def _load_gpt2_bpe(cls, vocab: Path, merges: Path, family: str | None) -> "Tokenizer":
        v, m = models.BPE.read_file(str(vocab), str(merges))
        backend = _Backend(models.BPE(v, m))
        _byte_level_pipeline(backend)
        fam_name = family or "gpt"
        fam = _family(fam_name)
        present = [t for t in fam.tokens if backend.token_to_id(t) is not None]
        backend.add_special_tokens(present)
        # GPT-2 adds no special tokens to a sequence; RoBERTa-style families wrap with <s> ... </s>.
        post = _post_processor(fam.single, fam.pair, present, backend, byte_level=True)
        backend.post_processor = post if fam.single else processors.ByteLevel(trim_offsets=False)
        return cls(backend, family=fam_name, kind="byte-bpe", roles=fam.roles)


# Candidate tokens per role for tokenizers saved by other tools (first one present wins).
_ROLE_CANDIDATES = {
    "pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]",), "sep": ("[SEP]",),
    "mask": ("[MASK]", "<mask>"), "bos": ("<s>", "<|endoftext|>"), "eos": ("</s>", "<|endoftext|>"),
}


def _guess_family(backend: _Backend) -> str | None:
    has = lambda t: backend.token_to_id(t) is not None  # noqa: E731
    if has("<extra_id_0>") and has("</s>"):
        return "t5"
    if has("[CLS]") and has("[SEP]"):
        return "bert"
    if has("<s>") and has("</s>") and has("<mask>"):
        return "roberta"
    if has("<|endoftext|>"):
        return "gpt"
    return None


def _guess_roles(backend: _Backend, family: str | None) -> dict[str, str]:
    if family in FAMILIES:
        return {r: t for r, t in _roles_for(FAMILIES[family], _guess_kind(backend)).items()
                if backend.token_to_id(t) is not None}
    roles = {}
    for role, candidates in _ROLE_CANDIDATES.items():
        for token in candidates:
            if backend.token_to_id(token) is not None:
                roles[role] = token
                break
    return roles


def _guess_kind(backend: _Backend) -> str | None:
    spec = json.loads(backend.to_str())
    model = spec["model"]["type"]
    if model == "BPE":
        return "byte-bpe" if "ByteLevel" in json.dumps(spec.get("pre_tokenizer")) else "bpe"
    return {"WordPiece": "wordpiece", "Unigram": "unigram"}.get(model)
