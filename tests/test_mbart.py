"""mBART-style multilingual denoising: the batch layout by hand, the language sampling's temperature, exact
resume of the mixture, `lmforge pretrain --objective multilingual-denoising` on the bundled English and Spanish
Bible text, then fine-tuning for EN->ES translation."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers import command_args
import lmforge
from lmforge import datasets
from lmforge.cli.main import main
from lmforge.data.language_mixture import LanguageMixture, temperature_probs
from lmforge.data.prepare import prepare
from lmforge.errors import LmforgeError
from lmforge.objectives import check_architecture
from lmforge.objectives.denoising import BartDenoising
from lmforge.objectives.multilingual_denoising import LanguagePairs, MultilingualDenoising, language_token_ids
from lmforge.tokenization import Tokenizer, train_tokenizer

IDS = dict(mask_token_id=4, eos_token_id=2, pad_token_id=1)


def test_the_batch_layout_by_hand():
    mbart = MultilingualDenoising(**IDS, vocab_size=50, languages=["en", "es"], infill_ratio=0.0, permute_prob=0.0)
    batch = mbart([("en", [10, 11, 12]), ("es", [20, 21])])
    # encoder: X </s> <LID>; labels: the same, unnoised; decoder input: <LID> X </s>, each row its own language
    assert batch["input_ids"].tolist() == [[10, 11, 12, 2, 50], [20, 21, 2, 51, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[10, 11, 12, 2, 50], [20, 21, 2, 51, -100]]
    # (the shifted-in 51 at row 1's padded position is masked out by decoder_attention_mask)
    assert batch["decoder_input_ids"].tolist() == [[50, 10, 11, 12, 2], [51, 20, 21, 2, 51]]
    assert batch["decoder_attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 1, 0]]
    assert language_token_ids(50, ["en", "es"]) == {"en": 50, "es": 51}
    with pytest.raises(LmforgeError, match="'fr' is not one of"):
        mbart([("fr", [10])])
    with pytest.raises(ValueError, match=r"\(language, ids\) examples"):
        mbart([[10, 11]])


def test_the_noise_is_barts_permutation_and_infilling_at_mbarts_rates():
    doc = [[10, 11, 5], [12, 13, 14, 5], [15, 16, 5], [17, 18, 19, 20, 5]]  # four sentences
    flat = [t for s in doc for t in s]
    mbart = MultilingualDenoising(**IDS, vocab_size=50, languages=["en"], sentence_end_ids=[5], seed=3)
    assert (mbart.infill_ratio, mbart.poisson_lambda, mbart.permute_prob, mbart.alpha) == (0.35, 3.5, 1.0, 0.7)
    bart = BartDenoising(**IDS, sentence_end_ids=[5], infill_ratio=0.35, poisson_lambda=3.5, seed=3)
    batch = mbart([("en", doc)])
    noised = bart.noise(torch.tensor(flat), [len(s) for s in doc])  # the same generator stream: the same noise
    assert batch["input_ids"][0].tolist() == noised.tolist() + [2, 50]
    assert batch["labels"][0].tolist() == flat + [2, 50]  # the target is the original order, unmasked
    # over many draws, 35% of the tokens are masked in spans (one <mask> per span)
    masked, total = 0, 0
    for _ in range(200):
        src = mbart([("en", list(range(10, 50)))])["input_ids"][0]
        kept = int(((src != 4) & (src < 50) & (src != 2)).sum())
        masked, total = masked + 40 - kept, total + 40
    assert masked / total == pytest.approx(0.35, abs=0.01)


def test_language_pairs_frame_a_translation_pair_by_hand():
    pairs = LanguagePairs(eos_token_id=2, pad_token_id=1, source_id=50, target_id=51)
    batch = pairs([([7, 8, 9], [30]), ([7], [31, 32])])
    assert batch["input_ids"].tolist() == [[7, 8, 9, 2, 50], [7, 2, 50, 1, 1]]
    assert batch["labels"].tolist() == [[30, 2, 51, -100], [31, 32, 2, 51]]
    assert batch["decoder_input_ids"].tolist() == [[51, 30, 2, 51], [51, 31, 32, 2]]  # last of row 0: masked
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_temperature_sampling_by_hand_and_in_the_stream():
    p = [0.9, 0.1]
    q = [x ** 0.7 / sum(y ** 0.7 for y in p) for x in p]
    assert temperature_probs([900, 100], 0.7) == pytest.approx(q)
    assert temperature_probs([900, 100], 1.0) == pytest.approx(p)
    assert temperature_probs([900, 100], 0.0) == pytest.approx([0.5, 0.5])
    with pytest.raises(LmforgeError, match="alpha=1.5"):
        temperature_probs([1, 2], 1.5)
    mix = LanguageMixture({"en": [[1]] * 3, "es": [[2]]}, sizes={"en": 900, "es": 100}, alpha=0.7, seed=0)
    stream = iter(mix)
    counts = Counter(next(stream)[0][0] for _ in range(4000))
    assert counts["es"] / 4000 == pytest.approx(q[1], abs=0.02)  # 0.177, not the corpus's 0.1
    assert math.isclose(sum(mix.probs), 1.0)


class _Counting:
    """A re-iterable data set with a position, as DocumentDataset has: batch i of an epoch is [(epoch, i)]."""

    def __init__(self, n):
        self.n, self.epoch, self.batch = n, 0, 0

    def __iter__(self):
        while self.batch < self.n:
            self.batch += 1
            yield [(self.epoch, self.batch - 1)]
        self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state):
        self.epoch, self.batch = state["epoch"], state["batch"]


def test_the_mixture_resumes_exactly():
    def mixture():
        return LanguageMixture({"en": _Counting(3), "es": _Counting(2)}, sizes={"en": 3, "es": 2}, seed=1)

    whole = mixture()
    stream = iter(whole)
    first = [next(stream) for _ in range(7)]
    state = json.loads(json.dumps(whole.state_dict()))  # as a checkpoint stores it
    rest = [next(stream) for _ in range(9)]
    resumed = mixture()
    resumed.load_state_dict(state)
    stream = iter(resumed)
    assert [next(stream) for _ in range(9)] == rest
    assert {b[0][0] for b in first + rest} == {"en", "es"}
    with pytest.raises(LmforgeError, match="saved seed=1"):
        other = LanguageMixture({"en": _Counting(3), "es": _Counting(2)}, sizes={"en": 3, "es": 2}, seed=2)
        other.load_state_dict(state)


def test_mass_like_refusals():
    with pytest.raises(LmforgeError, match="'multilingual-denoising' does not fit arch='decoder'"):
        check_architecture("multilingual-denoising", "decoder")


@pytest.fixture(scope="module")
def bilingual(tmp_path_factory) -> Path:
    """DATA/en and DATA/es: 1,200 verses of each side of the bundled KJV / Reina-Valera pairs, one shared BPE
    tokenizer trained on both."""
    root = tmp_path_factory.mktemp("bilingual")
    rows = datasets.load("kjv-rv1909", "train")[:1200]
    for lang in ("en", "es"):
        # a document per 8 verses, so that sentence permutation has sentences to permute
        docs = [" ".join(r[lang] for r in rows[i:i + 8]) for i in range(0, len(rows), 8)]
        (root / f"{lang}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    tok = train_tokenizer([root / "en.txt", root / "es.txt"], kind="bpe", family="bart", vocab_size=400,
                          show_progress=False)
    for lang in ("en", "es"):
        prepare([root / f"{lang}.txt"], tok, root / "data" / lang, val_fraction=0.1, progress=False)
    return root / "data"


TINY_BART = {"n_layers": 1, "n_decoder_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


def pretrain_args(data, out, **settings):
    options = {"model": "bart-tiny", "objective": "multilingual-denoising", "data": data, "out": out,
               "max_steps": 30, "batch_size": 8, "seq_len": 64, "eval_every": 30, "eval_batches": 2,
               "save_every": 15, "precision": "fp32", "warmup": 3, "lr": 3e-3, **settings}
    return command_args(["pretrain", "--no-progress"], options, TINY_BART)


def test_pretrain_then_finetune_en_to_es(bilingual, tmp_path, capsys):
    from lmforge.tasks.mbart_translation import evaluate_translation, finetune_translation, read_languages
    from lmforge.training.logging import read_metrics

    out = tmp_path / "mbart"
    assert main(pretrain_args(bilingual, out)) == 0
    tok = Tokenizer.load(out / "model")
    model = lmforge.load(out / "model")
    V = tok.vocab_size
    assert read_languages(out / "model") == {"en": V, "es": V + 1}
    assert model.config.vocab_size == V + 2  # one embedding row per language id, learned with the rest
    records = read_metrics(out / "metrics.jsonl")
    assert records[-1]["loss"] < records[0]["loss"] - 0.2, (records[0], records[-1])  # measured: 6.00 -> 5.75
    assert "eval_loss" in records[-1]
    assert (out / "config.yaml").read_text().count("- en") == 1  # the languages are recorded for resume
    # the checkpoints average like any run's
    assert main(["checkpoint", "average", str(out), "--last", "2"]) == 0

    pairs = datasets.load("kjv-rv1909", "train")[:64]
    result = finetune_translation(out / "model", pairs, source="en", target="es", out=tmp_path / "en-es",
                                  max_steps=40, batch_size=8, lr=3e-3, warmup=4, precision="fp32")
    losses = [r["loss"] for r in read_metrics(tmp_path / "en-es" / "metrics.jsonl")]
    assert result.step == 40 and losses[-1] < losses[0] - 0.5, losses  # measured: 5.52 -> 4.79
    translator = lmforge.load(tmp_path / "en-es" / "model")
    assert translator.config.decoder_start_token_id == V + 1  # decoding starts with <es>
    scores = evaluate_translation(tmp_path / "en-es" / "model", pairs[:8], source="en", target="es",
                                  max_new_tokens=16)
    assert scores["examples"] == 8 and 0.0 <= scores["bleu"] <= 100.0
    # the random-initialisation baseline trains the same shape
    finetune_translation(out / "model", pairs, source="en", target="es", out=tmp_path / "random", random_init=True,
                         max_steps=2, batch_size=8, precision="fp32")
    with pytest.raises(LmforgeError, match="no language id for 'fr'"):
        finetune_translation(out / "model", pairs, source="en", target="fr", out=tmp_path / "fr", max_steps=1)


def test_pretrain_refuses_a_data_folder_without_languages(bilingual, tmp_path, capsys):
    assert main(pretrain_args(bilingual / "en", tmp_path / "run")) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one prepared folder per language" in err[0], err
    assert main(pretrain_args(bilingual, tmp_path / "run2", objective_option="languages=[en,fr]")) != 0
    assert "no prepared folder for language(s) fr" in capsys.readouterr().err
    assert main(pretrain_args(bilingual, tmp_path / "run3", num_workers=2)) != 0
    assert "draws its batches across languages in this process" in capsys.readouterr().err
    assert not (tmp_path / "run3").exists() or not any((tmp_path / "run3").iterdir())  # refused before writing


def test_an_interrupted_run_resumes_exactly(bilingual, tmp_path):
    """The mixture's position (its batch count and every language's loader) is in the checkpoints."""
    from lmforge.training import TrainConfig
    from lmforge.training.logging import read_metrics
    from lmforge.training.pretrain import build_pretraining

    def config(out, **changes):
        return TrainConfig.from_dict({"model": "bart-tiny", "objective": "multilingual-denoising",
                                      "data": str(bilingual), "out": str(out), "overrides": TINY_BART,
                                      "max_steps": 6, "batch_size": 4, "seq_len": 64, "save_every": 3,
                                      "eval_every": 0, "precision": "fp32", "progress": False, "tensorboard": False,
                                      **changes})

    build_pretraining(config(tmp_path / "whole")).trainer.fit()
    assert build_pretraining(config(tmp_path / "cut")).trainer.fit(steps=3).stopped_by == "steps"
    build_pretraining(config(tmp_path / "cut", resume=True)).trainer.fit()
    whole = [r["loss"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]
    cut = [r["loss"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")]
    assert len(whole) == 6 and cut[-3:] == pytest.approx(whole[-3:], rel=1e-6)
