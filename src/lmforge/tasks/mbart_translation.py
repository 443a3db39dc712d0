"""Translation fine-tuning of an mBART-style model (Liu et al. 2020, §3): one direction, language ids kept.

A model pre-trained with ``lmforge pretrain --objective multilingual-denoising`` knows a language-id token per
language (``MODEL/languages.json``). Fine-tuning on sentence pairs keeps the pre-training's framing
(:class:`~lmforge.objectives.multilingual_denoising.LanguagePairs`)::

    encoder   X </s> <src>          decoder   <tgt> Y </s>          labels   Y </s> <tgt>

and the fine-tuned model decodes with ``decoder_start_token_id`` = ``<tgt>``: it is a ``src -> tgt``
translator, saved as an ordinary model folder (plus ``languages.json``). The same recipe trains a randomly
initialised model of the same shape, the paper's baseline (Table 2: mBART25 vs Random).

Training is the one :class:`~lmforge.training.Trainer` with the pairs collator; translation is greedy
decoding (:func:`lmforge.tasks.seq2seq.greedy_generate`), scored with sacrebleu's corpus BLEU.

Example (a sketch: ``runs/mbart/model`` is a model pre-trained with ``--objective multilingual-denoising``; the
English/Spanish Bible pairs ship with lmforge as ``kjv-rv1909``)::

    result = finetune_translation("runs/mbart/model", datasets.load("kjv-rv1909"), source="en",
                                  target="es", out="runs/mbart-en-es", max_steps=2000)
    evaluate_translation("runs/mbart-en-es/model", datasets.load("kjv-rv1909", "test"), source="en", target="es")
    # {'bleu': ..., 'chrf': ..., 'examples': 1699}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from lmforge import checkpoint
from lmforge.models.transformer import set_label_smoothing
from lmforge.errors import UserInputError
from lmforge.objectives.base import pad
from lmforge.objectives.multilingual_denoising import LANGUAGES_FILE, LanguagePairs
from lmforge.tasks import metrics
from lmforge.tasks.data import ExampleBatches
from lmforge.tasks.seq2seq import greedy_generate
from lmforge.tokenization import Tokenizer
from lmforge.training.config import TrainConfig
from lmforge.training.trainer import Trainer, TrainResult
from lmforge.utils.io import read_mapping_file


def read_languages(model_dir: str | Path) -> dict[str, int]:
    """The language ids a model folder records (``languages.json``, written by multilingual pre-training)."""
    file = Path(model_dir) / LANGUAGES_FILE
    if not file.is_file():
        raise UserInputError(f"{model_dir}: no {LANGUAGES_FILE}; pre-train the model with "
                             "--objective multilingual-denoising, which gives it language ids")
    ids = read_mapping_file(file, "languages")
    if not isinstance(ids, dict) or not all(isinstance(v, int) for v in ids.values()):
        raise UserInputError(f"{file}: expected a mapping of language codes to token ids, got {ids!r:.80}")
    return {str(k): v for k, v in ids.items()}


def _direction(languages: dict[str, int], source: str, target: str, where) -> tuple[int, int]:
    for lang in (source, target):
        if lang not in languages:
            raise UserInputError(f"{where}: no language id for {lang!r} (it has {', '.join(languages)})")
    return languages[source], languages[target]


def encode_pairs(tokenizer: Tokenizer, rows: Sequence[dict], source: str, target: str,
                 max_length: int) -> list[tuple[list[int], list[int]]]:
    """``(source ids, target ids)`` of rows with ``source`` and ``target`` columns, each cut to ``max_length - 2``
    (room for ``</s>`` and the language id); no other special tokens, as in pre-training."""
    if rows and not {source, target} <= set(rows[0]):
        raise UserInputError(f"translation rows need columns {source!r} and {target!r}; have {', '.join(rows[0])}")
    keep = max_length - 2
    texts = [r[source] for r in rows] + [r[target] for r in rows]
    ids = tokenizer.encode_batch(texts, add_special_tokens=False)["input_ids"]
    return [(ids[i][:keep], ids[len(rows) + i][:keep]) for i in range(len(rows))]


def finetune_translation(model: str | Path, rows: Sequence[dict], *, source: str, target: str, out: str | Path,
                         random_init: bool = False, max_steps: int = 1000, batch_size: int = 16, lr: float = 3e-4,
                         warmup: int | None = None, max_length: int = 64, seed: int = 0,
                         **settings: Any) -> TrainResult:
    """Fine-tune the multilingual model folder ``model`` to translate ``source`` -> ``target`` on ``rows``.

    Args:
        model: model folder of a multilingual-denoising run (``RUN/model``), with its tokenizer and languages.
        rows: dicts with a ``source`` and a ``target`` column (e.g. ``datasets.load("kjv-rv1909")``: ``en``, ``es``).
        out: the Trainer's run folder; the translator is ``OUT/model``.
        random_init: the same architecture and language ids with fresh weights (the paper's Random baseline).
        max_steps, batch_size, lr, warmup, seed: the run's settings (warmup default: a tenth of the steps);
            ``settings``: any other :class:`~lmforge.training.TrainConfig` setting (``precision``,
            ``label_smoothing``, ``save_every`` ...).
        max_length: longest source / target, in tokens, framing included.
    """
    languages = read_languages(model)
    src_id, tgt_id = _direction(languages, source, target, model)
    torch.manual_seed(seed)
    body = checkpoint.load(model)
    if random_init:
        body = type(body)(body.config)  # same shape, fresh weights
    # decoding starts with the target's language id: the model is now a one-direction translator
    body.config = body.config.replace(decoder_start_token_id=tgt_id)
    tokenizer = Tokenizer.load(model)
    pairs = encode_pairs(tokenizer, rows, source, target, max_length)
    ids = tokenizer.special_token_ids()
    collate = LanguagePairs(eos_token_id=ids["eos_token_id"], pad_token_id=tokenizer.pad_id, source_id=src_id,
                            target_id=tgt_id)
    warmup = max_steps // 10 if warmup is None else warmup
    config = TrainConfig.from_dict({"max_steps": max_steps, "batch_size": batch_size, "lr": lr, "warmup": warmup,
                                    "seed": seed, "eval_every": 0, "save_every": 0, "progress": False,
                                    "tensorboard": False, **settings}, source="finetune_translation")
    set_label_smoothing(body, config.label_smoothing)
    trainer = Trainer(body.train(), collate, ExampleBatches(pairs, batch_size, seed=seed, length=lambda p: len(p[0])),
                      config, out=out, tokenizer=tokenizer,
                      model_files={LANGUAGES_FILE: json.dumps(languages, indent=1) + "\n"})
    return trainer.fit()


@torch.no_grad()
def translate(model, tokenizer: Tokenizer, texts: Sequence[str], *, source_id: int, max_new_tokens: int = 64,
              max_length: int = 64, batch_size: int = 32) -> list[str]:
    """Greedy translations of ``texts``: each framed ``X </s> <src>``; the decoder starts with the model's
    ``decoder_start_token_id`` (the target language id of a fine-tuned translator)."""
    ids = tokenizer.special_token_ids()
    eos = ids["eos_token_id"]
    frame = LanguagePairs(eos_token_id=eos, pad_token_id=tokenizer.pad_id, source_id=source_id,
                          target_id=model.config.decoder_start_token_id)
    encoded = tokenizer.encode_batch(list(texts), add_special_tokens=False)["input_ids"]
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(encoded), batch_size):
        sources = [frame.source(x[: max_length - 2]) for x in encoded[start:start + batch_size]]
        input_ids, real = pad(sources, tokenizer.pad_id)  # (B, S)
        generated, _ = greedy_generate(model, input_ids.to(device), real.long().to(device), max_new_tokens, eos,
                                       tokenizer.pad_id)
        for row in generated.tolist():
            row = row[: row.index(eos)] if eos in row else row
            # language ids lie past the tokenizer's vocabulary: they are framing, not text
            out.append(tokenizer.decode([t for t in row if t < tokenizer.vocab_size]))
    return out


def evaluate_translation(model: str | Path, rows: Sequence[dict], *, source: str, target: str,
                         max_new_tokens: int = 64, max_length: int = 64, limit: int | None = None,
                         device: str = "cpu", batch_size: int = 32) -> dict[str, Any]:
    """BLEU and chrF of a fine-tuned translator folder on ``rows`` (the first ``limit`` of them), decoded greedily
    on ``device``."""
    languages = read_languages(model)
    src_id, tgt_id = _direction(languages, source, target, model)
    body = checkpoint.load(model, device=device)
    if body.config.decoder_start_token_id != tgt_id:
        raise UserInputError(f"{model}: it decodes from id {body.config.decoder_start_token_id}, not {target!r}'s "
                             f"language id {tgt_id}; fine-tune it for {source} -> {target} first")
    rows = list(rows)[:limit] if limit else list(rows)
    hypotheses = translate(body, Tokenizer.load(model), [r[source] for r in rows], source_id=src_id,
                           max_new_tokens=max_new_tokens, max_length=max_length, batch_size=batch_size)
    references = [r[target] for r in rows]
    return {"bleu": metrics.bleu(hypotheses, references), "chrf": metrics.chrf(hypotheses, references),
            "examples": len(rows)}
