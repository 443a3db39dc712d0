"""The pre-training recipe: tokenizer + prepared shards + objective + model -> a Trainer and its run folder.

This is where the pieces meet; the Trainer itself stays ignorant of objectives and data formats.

* **Tokenizer.** ``config.tokenizer``, or the copy ``lmforge data prepare`` keeps in ``DATA/tokenizer``. It must
  be the tokenizer the shards were made with (compared by digest).
* **Model.** A preset name, a config file, or a model folder (its weights are loaded: continued pre-training),
  with ``config.overrides`` applied. ELMo's biLM (``elmo-tiny`` or a folder with ``arch: bilstm``, see
  :mod:`lmforge.models.bilstm_lm`) is the one non-Transformer; it takes only its vocabulary and padding id
  from the tokenizer. Special-token ids always come from the tokenizer, and so does
  ``vocab_size`` unless the model folder or an override fixes it (it may be larger, never smaller).
* **Objective.** Built by name; its keyword arguments are filled from the tokenizer by parameter name
  (``pad_token_id``, ``mask_token_id``, ``sentinel_ids``, ``vocab_size``, ...), so an objective that needs a
  token the tokenizer lacks is refused with a message naming it. ``check_architecture`` refuses objectives
  that do not fit the model (span corruption on an encoder, ...).
* **Data.** Objectives for decoder-only models read packed blocks of ``seq_len + 1`` tokens
  (:class:`~lmforge.data.PackedDataset`); the others read document segments (:class:`~lmforge.data.DocumentDataset`)
  of ``seq_len - 2`` tokens, leaving room for the framing tokens they add ([CLS] ... [SEP], <s> ... </s>,
  ... </s>). Evaluation uses the ``val`` split in file order. With ``seq_len_schedule`` (BERT's 128 then 512)
  there is one source and one objective per length, switched at step boundaries
  (:mod:`lmforge.training.seq_len_schedule`), and evaluation reads the longest length.
* **NSP and input formats.** ``mlm+nsp`` (BERT: MLM + next sentence prediction) reads segments of
  ``seq_len - 3`` tokens cut at sentence ends (the tokenizer's ``sentence_end_ids``), turns them into
  ``[CLS] A [SEP] B [SEP]`` pairs, and switches on the model's pooler and NSP head unless the model folder's
  weights fix them. ``--objective-option format=`` picks RoBERTa's input format
  (:mod:`lmforge.objectives.input_formats`): segment-pair (default) or sentence-pair for ``mlm+nsp``,
  full-sentences or doc-sentences for ``mlm`` (sentence-aligned segments; full-sentences also packs them
  across documents). Plain ``mlm`` is unchanged.

* **Languages.** ``multilingual-denoising`` (mBART) reads a data folder that holds one prepared folder per
  language, named by its code (``DATA/en``, ``DATA/es``; every one prepared with the same tokenizer). Batches
  are drawn across them with the objective's temperature ``alpha``
  (:class:`~lmforge.data.language_mixture.LanguageMixture`); the languages, in name order unless
  ``--objective-option languages=[...]`` orders them, get the ids after the tokenizer's vocabulary, so the
  model's ``vocab_size`` grows by their number, and ``OUT/model/languages.json`` records them.
* **Added tokens.** An objective whose class names ``added_tokens`` (UL2's mode tokens [NLU], [NLG], [S2S]) gets
  the ids after the tokenizer's vocabulary too; the model's ``vocab_size`` grows by their number, and
  ``OUT/model/mode_tokens.json`` records them.

* **Ranks.** Under torchrun (``strategy`` ddp/fsdp) the process group is joined first, so that the datasets
  take this rank's slice; the training objective's seed is :func:`~lmforge.training.distributed.rank_seed`, so
  ranks mask differently (static masks, keyed by sample, share the run's seed). Only rank 0 writes
  ``config.yaml`` and ``tokenizer/``, and only when the Trainer starts, after its resume checks passed and it
  holds the run folder's lock: a refused resume leaves the folder as it was.

The run folder is self-contained: ``config.yaml`` (these settings), ``tokenizer/``, ``checkpoints/``,
``metrics.jsonl``, ``tensorboard/``, ``loss.png`` and, at the end, ``model/`` (loadable by ``lmforge.load``).

Example (its first lines make the same tiny corpus as :mod:`lmforge.data.loader`'s example: each example runs on
its own):
    >>> import pathlib, tempfile
    >>> from lmforge.data.prepare import prepare
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "corpus.txt").write_text("".join(f"Document {i} is short.\\n\\n" for i in range(400)))
    >>> tok = train_tokenizer([d / "corpus.txt"], vocab_size=300, family="gpt", show_progress=False)
    >>> _ = prepare([d / "corpus.txt"], tok, d / "data", val_fraction=0.1, progress=False)
    >>> cfg = TrainConfig(model="gpt-tiny", objective="clm", data=str(d / "data"), out=str(d / "runs/gpt"),
    ...                   overrides={"n_layers": 2}, max_steps=5, seq_len=16, batch_size=4, progress=False)
    >>> pretrain(cfg).model_dir.relative_to(d)
    PosixPath('runs/gpt/model')
"""

from __future__ import annotations

import inspect
import json
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch

from lmforge import checkpoint as model_checkpoint
from lmforge.config import ConfigError, ModelConfig, resolve_config
from lmforge.data import DocumentDataset, PackedDataset, StatefulLoader, read_manifest
from lmforge.data.language_mixture import LanguageMixture
from lmforge.data.sources import DataError
from lmforge.models import Transformer
from lmforge.checkpoint import bilm_config, is_bilm
from lmforge.models.bilstm_lm import BiLM, BiLMConfig
from lmforge.models.electra import ElectraPretrainer
from lmforge.models.quantize import refuse_training
from lmforge.models.transformer import set_label_smoothing
from lmforge.models.two_stream import TwoStreamLM
from lmforge.objectives import OBJECTIVES, PermutedLM, ReplacedTokenDetection, architectures_for, check_architecture
from lmforge.objectives.decoder_layout import check_layout_fits, default_layout
from lmforge.objectives.input_formats import FullSentences, check_format
from lmforge.objectives.multilingual_denoising import LANGUAGES_FILE, language_token_ids
from lmforge.objectives.ul2 import MODE_TOKENS_FILE
from lmforge.tokenization import Tokenizer
from lmforge.training import distributed
from lmforge.training.config import TrainConfig
from lmforge.training.resume_settings import record_resume
from lmforge.training.seq_len_schedule import (PhasedData, PhasedObjective, base_objective, parse_seq_len_schedule,
                                               phase_starts)
from lmforge.training.trainer import Trainer, TrainResult
from lmforge.utils.io import atomic_write_text

FRAMING_TOKENS = 2  # room left in a document segment for the special tokens an objective wraps it in
TOKEN_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name.endswith("_token_id"))


@dataclass
class PretrainPlan:
    """What :func:`plan_pretraining` checked and assembled: the run's inputs, before any model exists."""

    config: TrainConfig
    tokenizer: Tokenizer
    model_config: ModelConfig | BiLMConfig
    objective: Any
    eval_objective: Any
    train_data: Any
    eval_data: Any
    languages: dict[str, int]


@dataclass
class PretrainRun:
    """Everything :func:`build_pretraining` assembled (handy for inspecting a run before training it)."""

    config: TrainConfig
    tokenizer: Tokenizer
    model: Transformer | BiLM | ElectraPretrainer
    trainer: Trainer


def added_token_ids(objective: str | None, tokenizer: Tokenizer) -> dict[str, int]:
    """Token -> id of the tokens ``objective`` adds after the tokenizer's vocabulary (UL2's mode tokens); {} for
    most objectives."""
    added = getattr(OBJECTIVES.get(objective), "added_tokens", ())
    return {token: tokenizer.vocab_size + i for i, token in enumerate(added)}


def multilingual(objective: str | None) -> bool:
    """True when ``objective`` reads one data folder per language (mBART's multilingual denoising)."""
    return bool(getattr(OBJECTIVES.get(objective), "multilingual", False))


def language_folders(config: TrainConfig) -> dict[str, Path]:
    """Language code -> prepared data folder, for a multilingual objective: the folders of ``config.data``
    that hold a manifest, in name order, or in the order of ``objective_options['languages']``."""
    root = Path(config.data)
    found = {p.name: p for p in sorted(root.iterdir()) if (p / "manifest.json").is_file()} if root.is_dir() else {}
    if not found:
        raise ConfigError(f"data={config.data}: objective {config.objective!r} reads one prepared folder per "
                          "language (DATA/en, DATA/es, ... each from `lmforge data prepare` with the same tokenizer); "
                          "none found")
    wanted = config.objective_options.get("languages")
    if wanted is None:
        return found
    if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
        raise ConfigError(f"objective_options: languages={wanted!r} must be a list of language codes")
    missing = [w for w in wanted if w not in found]
    if missing:
        raise ConfigError(f"data={config.data}: no prepared folder for language(s) {', '.join(missing)} "
                          f"(found {', '.join(found)})")
    return {w: found[w] for w in wanted}


def load_tokenizer(config: TrainConfig) -> Tokenizer:
    """The run's tokenizer, checked against the one the shards in ``config.data`` were prepared with (for a
    multilingual objective: the shards of every language)."""
    folders = list(language_folders(config).values()) if multilingual(config.objective) else [Path(config.data)]
    manifest = read_manifest(folders[0])
    path = Path(config.tokenizer) if config.tokenizer else folders[0] / manifest["tokenizer"]["path"]
    tokenizer = Tokenizer.load(path)
    for folder in folders:
        if tokenizer.sha256() != read_manifest(folder)["tokenizer"]["sha256"]:
            raise ConfigError(f"tokenizer {path} is not the one {folder} was prepared with; "
                              f"{'prepare every language with one tokenizer, or ' if len(folders) > 1 else ''}"
                              f"omit --tokenizer to use {folder / manifest['tokenizer']['path']}")
    return tokenizer


def model_config_for(spec: str, tokenizer: Tokenizer, overrides: dict[str, Any],
                     source: str = "the data's tokenizer") -> ModelConfig | BiLMConfig:
    """``spec`` (preset, config file or model folder) + ``overrides``, with the tokenizer's ids and vocabulary.

    A model folder that records another tokenizer than ``tokenizer`` (named ``source`` in the refusal) is
    refused, as every command that continues from a model refuses it
    (:func:`lmforge.checkpoint.check_tokenizer`, ``--allow-tokenizer-mismatch`` to go on anyway): its embedding
    rows mean other tokens, and its special ids would be rewritten."""
    bilm = is_bilm(spec)
    base = bilm_config(spec) if bilm else resolve_config(spec)
    has_weights = (Path(spec) / model_checkpoint.WEIGHTS_FILE).is_file()
    if has_weights:
        model_checkpoint.check_tokenizer(spec, tokenizer, source)
    vocab = overrides.get("vocab_size", base.vocab_size if has_weights else tokenizer.vocab_size)
    if isinstance(vocab, int) and vocab < tokenizer.vocab_size:
        raise ConfigError(f"vocab_size={vocab} is smaller than the tokenizer's {tokenizer.vocab_size} tokens"
                          f"{' (fixed by the weights in ' + spec + ')' if has_weights else ''}")
    if bilm:  # no [MASK]/[CLS] roles inside ELMo's biLM: the objective frames the text, padding is all it sees
        return bilm_config(spec, **{"vocab_size": vocab, "pad_token_id": tokenizer.pad_id, **overrides})
    ids = {name: None for name in TOKEN_FIELDS}
    ids.update({k: v for k, v in tokenizer.special_token_ids().items() if k in ids})
    return ModelConfig.from_dict({**base.to_dict(), **ids, "vocab_size": vocab, **overrides},
                                 source="model overrides")


def objective_kwargs(name: str, tokenizer: Tokenizer, seed: int, options: dict[str, Any],
                     seq_len: int | None = None, static_seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for objective ``name``: its parameters that the tokenizer (and ``seq_len``, as
    ``max_length``) can fill, then ``options``.

    ``seed`` may differ between data-parallel ranks; ``static_seed`` (default ``seed``) is the one they share,
    for randomness that must not depend on the rank (MLM's static masks).

    Raises:
        ConfigError: an unknown option, or a required id (e.g. ``mask_token_id``) the tokenizer does not have.
    """
    params = inspect.signature(OBJECTIVES[name]).parameters
    ids = tokenizer.special_token_ids()
    specials = {v for k, v in ids.items() if k.endswith("_token_id")} | set(ids.get("sentinel_token_ids", []))
    available = {
        **{k: v for k, v in ids.items() if k.endswith("_token_id")},
        "pad_token_id": tokenizer.pad_id,  # GPT has no pad token; any id works, since pads carry no loss
        "sentinel_ids": ids.get("sentinel_token_ids"),
        "vocab_size": tokenizer.vocab_size,  # random replacements are drawn from the real tokens
        "special_token_ids": sorted(specials),
        "add_cls_sep": "cls_token_id" in ids and "sep_token_id" in ids,
        "max_length": seq_len,
        "seed": seed,
        "static_seed": static_seed,
    }
    if "sentence_end_ids" in params:  # a vocabulary scan: only for the objectives that split sentences
        available["sentence_end_ids"] = tokenizer.sentence_end_ids()
    if "continuation_token_ids" in params:  # word boundaries, for whole-word and span masking
        available["continuation_token_ids"] = tokenizer.continuation_ids()
    kwargs = {k: v for k, v in available.items() if k in params and v is not None}
    for key, value in options.items():
        if key not in params:
            raise ConfigError(f"objective_options: {name!r} has no option {key!r}; "
                              f"it takes {', '.join(p for p in params if p != 'seed')}")
        kwargs[key] = value
    missing = [p.name for p in params.values() if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(f"objective {name!r} needs {', '.join(missing)}, which the tokenizer "
                          f"(family {tokenizer.family!r}) does not define; use a tokenizer of a family that has it")
    return kwargs


def packed_fits(objective: str) -> bool:
    """True when ``objective`` reads packed blocks (decoder-only objectives), False for document segments."""
    return architectures_for(objective)[0] == "decoder"


def framing_tokens(objective: str) -> int:
    """Special tokens ``objective`` adds to a document segment ([CLS] A [SEP] B [SEP]: 3; most: 2)."""
    return getattr(OBJECTIVES[objective], "framing_tokens", FRAMING_TOKENS)


def sentence_aligned(config: TrainConfig) -> bool:
    """True when the objective reads document segments cut at sentence ends (NSP, RoBERTa's formats)."""
    return bool(getattr(OBJECTIVES[config.objective], "sentence_segments", False)
                or config.objective_options.get("format") is not None)


def datasets_for(config: TrainConfig, seq_len: int, sentence_end_ids: list[int] | None = None,
                 evaluation: bool = True) -> tuple[Any, Any]:
    """``(train, eval)`` raw-batch sources for ``config.objective``; ``eval`` is None without a usable val split
    (or with ``evaluation=False``). With ``sentence_end_ids``, document segments are cut at sentence ends."""
    packed = packed_fits(config.objective)
    want_eval = evaluation

    def make_one(data, split: str, shuffle: bool):
        if packed:
            return PackedDataset(data, seq_len, config.batch_size, split=split, seed=config.seed, shuffle=shuffle)
        return DocumentDataset(data, seq_len - framing_tokens(config.objective), config.batch_size,
                               split=split, seed=config.seed, shuffle=shuffle, sentence_end_ids=sentence_end_ids)

    def make(split: str, shuffle: bool):
        if not multilingual(config.objective):
            return make_one(config.data, split, shuffle)
        default = inspect.signature(OBJECTIVES[config.objective]).parameters["alpha"].default
        parts = {lang: make_one(folder, split, shuffle) for lang, folder in language_folders(config).items()}
        return LanguageMixture(parts, alpha=config.objective_options.get("alpha", default), seed=config.seed)

    train = make("train", True)
    evaluation = None
    if config.eval_every and want_eval:
        try:
            evaluation = make("val", False)
        except DataError as exc:
            warnings.warn(f"no evaluation: {exc}", stacklevel=2)
    if config.num_workers and multilingual(config.objective):
        raise ConfigError(f"num_workers={config.num_workers}: objective {config.objective!r} draws its batches across "
                          "languages in this process; use num_workers 0")
    if config.num_workers:
        train = StatefulLoader(train, num_workers=config.num_workers)
    return train, evaluation


def _absolute(config: TrainConfig) -> TrainConfig:
    # The saved config.yaml must still work when resumed from another working directory.
    paths = {k: str(Path(getattr(config, k)).resolve()) for k in ("data", "tokenizer", "out")
             if getattr(config, k)}
    if config.model and Path(config.model).exists():
        paths["model"] = str(Path(config.model).resolve())
    return config.updated(paths)


def format_and_options(objective: str, options: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The checked ``format`` option of ``objective``, and the options its class takes: MLM's format is the
    data's and the packing's, not ``MaskedLM``'s, so it is taken out."""
    options = dict(options)
    fmt = check_format(objective, options.get("format"))
    if objective == "mlm":
        options.pop("format", None)
    return fmt, options


def build_objective_for(config: TrainConfig, tokenizer: Tokenizer, seed: int, seq_len: int,
                        sentence_end_ids: list[int] | None, static_seed: int | None = None):
    """The run's objective (its ``format`` option applied, see :mod:`lmforge.objectives.input_formats`)."""
    fmt, options = format_and_options(config.objective, config.objective_options)
    objective = OBJECTIVES[config.objective](**objective_kwargs(config.objective, tokenizer, seed, options, seq_len,
                                                                static_seed=static_seed))
    if fmt == "full-sentences":
        sep = tokenizer.special_token_ids().get("sep_token_id")
        if sep is None:
            raise ConfigError(f"format='full-sentences' separates documents with [SEP], which the tokenizer "
                              f"(family {tokenizer.family!r}) does not define; use a BERT or RoBERTa tokenizer")
        objective = FullSentences(objective, sentence_end_ids=sentence_end_ids or [], separator_id=sep,
                                  max_length=seq_len - FRAMING_TOKENS)
    return objective


def plan_pretraining(config: TrainConfig, rank: int = 0, tokenizer: Tokenizer | None = None) -> PretrainPlan:
    """Check ``config`` and assemble what a pre-training run reads (tokenizer, model config, objectives, data),
    without building the model: :func:`build_pretraining`'s first half, and what an experiment grid counts a
    cell's FLOPs per step on. ``rank`` seeds the training objective (each rank masks differently); ``tokenizer``:
    the data's, when the caller has loaded it already (:func:`load_tokenizer`)."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
    check_format(config.objective, config.objective_options.get("format"))
    # An objective's head (NSP: pooler + nsp_head) is switched on, unless weights or the overrides say otherwise.
    needs = getattr(OBJECTIVES[config.objective], "model_fields", {})
    has_weights = (Path(config.model) / model_checkpoint.WEIGHTS_FILE).is_file()
    overrides = {**({} if has_weights else needs), **config.overrides}
    languages: dict[str, int] = {}
    if multilingual(config.objective):  # language ids follow the tokenizer's vocabulary: the embedding grows
        codes = list(language_folders(config))
        config = config.updated({"objective_options": {**config.objective_options, "languages": codes}})
        languages = language_token_ids(tokenizer.vocab_size, codes)
        if not has_weights:
            overrides = {"vocab_size": tokenizer.vocab_size + len(codes), **overrides}
    added = added_token_ids(config.objective, tokenizer)
    if added and not has_weights:  # UL2's mode tokens follow the tokenizer's vocabulary, like language ids
        overrides = {"vocab_size": tokenizer.vocab_size + len(added), **overrides}
    model_config = model_config_for(config.model, tokenizer, overrides, f"the tokenizer of {config.data}")
    if added and model_config.vocab_size < max(added.values()) + 1:
        raise ConfigError(f"vocab_size={model_config.vocab_size} has no room for the tokens {', '.join(added)} "
                          f"of objective {config.objective!r} after the tokenizer's {tokenizer.vocab_size} tokens; "
                          f"it needs {tokenizer.vocab_size + len(added)}")
    if languages and model_config.vocab_size < max(languages.values()) + 1:
        raise ConfigError(f"vocab_size={model_config.vocab_size} has no room for the {len(languages)} language ids "
                          f"after the tokenizer's {tokenizer.vocab_size} tokens; it needs "
                          f"{tokenizer.vocab_size + len(languages)}")
    check_architecture(config.objective, model_config.arch)
    concatenated = False
    if "layout" in inspect.signature(OBJECTIVES[config.objective]).parameters:  # seq2seq objectives on a decoder
        layout = config.objective_options.get("layout", default_layout(model_config.arch))
        check_layout_fits(config.objective, layout, model_config.arch)
        config = config.updated({"objective_options": {**config.objective_options, "layout": layout}})
        concatenated = layout != "seq2seq"
    if getattr(model_config, "head", None) == "rtd" and config.objective != "electra":
        raise ConfigError(f"model {config.model} has ELECTRA's replaced-token head (head: rtd), which objective "
                          f"{config.objective!r} cannot train; continue it with --objective electra, or fine-tune it")
    missing = [f"{k}={v}" for k, v in needs.items() if getattr(model_config, k, None) != v]
    if missing:
        raise ConfigError(f"objective {config.objective!r} needs a model with {', '.join(missing)}, which "
                          f"{config.model} does not have; start from a preset, or train it with --objective mlm")
    if needs.get("nsp_head") and model_config.type_vocab_size == 1:
        raise ConfigError(f"objective {config.objective!r} marks sentence B with token_type_ids=1, but the model has "
                          "type_vocab_size=1; pass --override type_vocab_size=2 (or 0: no segment embeddings)")
    if needs.get("nsp_head") and config.batch_size < 2:
        raise ConfigError(f"objective {config.objective!r} needs batch_size >= 2 (got {config.batch_size}): "
                          "NotNext sentences come from another document of the batch")
    schedule = parse_seq_len_schedule(config.seq_len_schedule) if config.seq_len_schedule else None
    lengths = [length for length, _ in schedule] if schedule else [config.seq_len or model_config.max_seq_len]
    seq_len = lengths[-1]  # the longest: evaluation's throughout a schedule
    if schedule and seq_len > model_config.max_seq_len:  # the later phases would index positions that do not exist
        raise ConfigError(f"seq_len_schedule={config.seq_len_schedule!r}: its longest length {seq_len} exceeds the "
                          f"model's max_seq_len={model_config.max_seq_len}; pass --override max_seq_len={seq_len} "
                          "or shorten the schedule")
    if seq_len > model_config.max_seq_len:
        raise ConfigError(f"seq_len={seq_len} exceeds the model's max_seq_len={model_config.max_seq_len}; "
                          f"lower --seq-len or pass --override max_seq_len={seq_len}")
    framing = framing_tokens(config.objective)
    text = 2 if needs.get("nsp_head") else 1  # a pair needs a token of A and one of B
    if not packed_fits(config.objective) and lengths[0] < framing + text:
        raise ConfigError(f"seq_len={lengths[0]} leaves no room for {text} token(s) of text besides the {framing} "
                          "framing tokens")
    ends = tokenizer.sentence_end_ids() if sentence_aligned(config) else None
    objective = build_objective_for(config, tokenizer, distributed.rank_seed(config.seed, rank), seq_len, ends,
                                    static_seed=config.seed)
    eval_objective = build_objective_for(config, tokenizer, config.seed + 1, seq_len, ends)
    # Concatenated, input and target share the model's seq_len: each gets about half of it.
    train_data, eval_data = datasets_for(config, seq_len // 2 if concatenated else seq_len, ends)
    if schedule:  # one source and one objective per length; the last phase's data is the one just built
        sources = [datasets_for(config, length // 2 if concatenated else length, ends, evaluation=False)[0]
                   for length in lengths[:-1]] + [train_data]
        train_data = PhasedData(sources, lengths, phase_starts(schedule, config.max_steps), config.grad_accum,
                                config.max_steps)
        objective = PhasedObjective(
            [build_objective_for(config, tokenizer, distributed.rank_seed(config.seed, rank), length, ends,
                                 static_seed=config.seed) for length in lengths[:-1]] + [objective], train_data)
    return PretrainPlan(config, tokenizer, model_config, objective, eval_objective, train_data, eval_data, languages)


def build_pretraining(config: TrainConfig, *, loss=None, init: Callable[[Transformer], None] | None = None,
                      run_files: dict[str, str] | None = None,
                      wrap: Callable[[Transformer], torch.nn.Module] | None = None) -> PretrainRun:
    """Check ``config`` and assemble tokenizer, model, objective, data and Trainer (nothing is trained).

    Other recipes on the same data and objective (distillation, :mod:`lmforge.distillation`) pass the Trainer's
    ``loss``; ``init(model)`` initialises a model that has no weights of its own (a preset or config file);
    ``run_files`` (name -> text) are written into the run folder beside ``config.yaml`` when the run starts;
    ``wrap(model)`` is the module the Trainer trains instead (a training-only wrapper, e.g. with TinyBERT's
    width projections, whose ``saved_model`` is the model: it is what ``OUT/model`` holds).
    """
    config.require("model", "objective", "data", "out")
    refuse_training(config.model, "pre-training")
    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)  # before the datasets: they read rank and world size
    plan = plan_pretraining(config, ctx.rank)
    config, tokenizer, model_config, objective = plan.config, plan.tokenizer, plan.model_config, plan.objective
    eval_objective, train_data, eval_data, languages = plan.eval_objective, plan.train_data, plan.eval_data, \
        plan.languages

    torch.manual_seed(config.seed)  # the same seed, the same initial weights
    if isinstance(model_config, BiLMConfig):
        model = BiLM(model_config)
        if model_config.char_cnn:  # the character CNN reads each vocabulary entry's string
            model.set_token_chars([tokenizer.id_to_token(i) for i in range(model_config.vocab_size)])
    elif isinstance(base_objective(objective), ReplacedTokenDetection):  # ELECTRA: a generator + discriminator pair
        if config.strategy == "fsdp":
            raise ConfigError("objective 'electra' trains a generator + discriminator pair: use strategy ddp, not fsdp")
        model = ElectraPretrainer.from_config(model_config, **base_objective(objective).pretrainer_options())
    elif isinstance(base_objective(objective), PermutedLM):  # XLNet: the encoder runs a content and a query stream
        model = TwoStreamLM(Transformer(model_config))
    else:
        model = Transformer(model_config)
    if config.label_smoothing:
        set_label_smoothing(model, config.label_smoothing)
    if (Path(config.model) / model_checkpoint.WEIGHTS_FILE).is_file():
        model_checkpoint.verify_folder(config.model)
        # ELECTRA continues from a folder's encoder: its body, and its RTD head if it has one (else a fresh one).
        electra = isinstance(model, ElectraPretrainer)
        model_checkpoint.load_weights(model.saved_model if electra or isinstance(model, TwoStreamLM) else model,
                                      Path(config.model) / model_checkpoint.WEIGHTS_FILE,
                                      strict=not electra or model_config.head == "rtd")
    elif init is not None:
        init(model)
    if wrap is not None:
        model = wrap(model)

    config = _absolute(config)
    out = Path(config.out)

    def write_run_files() -> None:  # by the Trainer, once the run folder is checked and locked
        if config.resume and (out / "config.yaml").is_file():  # what this resume changed joins the run's history
            record_resume(out, TrainConfig.load(out / "config.yaml").to_dict(), config.to_dict())
        config.save(out / "config.yaml")
        tokenizer.save(out / "tokenizer")
        for name, text in (run_files or {}).items():
            atomic_write_text(out / name, text)

    model_files = {LANGUAGES_FILE: json.dumps(languages, indent=1) + "\n"} if languages else None
    if added_token_ids(config.objective, tokenizer):  # what a fine-tuning prompt starts with, e.g. [S2S]
        model_files = {**(model_files or {}),
                       MODE_TOKENS_FILE: json.dumps(added_token_ids(config.objective, tokenizer), indent=1) + "\n"}
    trainer = Trainer(model, objective, train_data, config, eval_data=eval_data, eval_objective=eval_objective,
                      tokenizer=tokenizer, dist=ctx, on_start=write_run_files, loss=loss, model_files=model_files,
                      job="pretrain")
    if not config.resume:
        trainer.check_fresh()  # refuse early, before the model is trained or anything is written
    return PretrainRun(config, tokenizer, model, trainer)


def pretrain(config: TrainConfig) -> TrainResult:
    """Build the run described by ``config`` and train it (see the module docstring); under torchrun, inside a
    :func:`~lmforge.training.distributed.session` (the process group is closed at the end, or on a failure)."""
    with distributed.session(config.strategy, config.device, config.dist_timeout):
        return build_pretraining(config).trainer.fit()
