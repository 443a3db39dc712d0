"""`lmforge pretrain` end to end on tiny prepared shards (real tokenizers, real data modules), and the
recipe's refusals: objectives that do not fit, tokens a tokenizer lacks, bad settings named with their source.

The helpers here (``prepared``, ``TINY``, ``pretrain_args``) are shared with the other training tests.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import command_args
import lmforge
from lmforge import datasets
from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from lmforge.tokenization import Tokenizer, train_tokenizer
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining, objective_kwargs

# The Austen corpus as shipped in the package (byte for byte the shared source, see test_datasets.py).
CORPUS = datasets.path("corpus")

# family -> (tokenizer kind, vocabulary size). Sizes are tiny; T5's includes its 100 sentinels.
FAMILIES = {"gpt": ("byte-bpe", 300), "bert": ("wordpiece", 200), "t5": ("unigram", 250), "bart": ("bpe", 200)}
# objective -> (preset, tokenizer family, ModelConfig overrides that make it tiny)
DECODER = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}
TINY = {
    "clm": ("gpt-tiny", "gpt", DECODER),
    "prefix-lm": ("gpt-tiny", "gpt", DECODER),
    "mlm": ("bert-tiny", "bert", DECODER),
    "span-corruption": ("t5-tiny", "t5", {**DECODER, "head_dim": 16, "n_decoder_layers": 1}),
    "denoising": ("bart-tiny", "bart", {**DECODER, "n_decoder_layers": 1}),
}


def prepared(root: Path, family: str) -> Path:
    """Tokenizer + shards (10% validation) from 60 kB of Austen, under ``root/family``; returns the data folder."""
    data = root / family
    if not (data / "manifest.json").is_file():
        if not CORPUS.is_file():
            pytest.fail(f"{CORPUS} is missing from the installed package")
        text = root / "corpus.txt"
        if not text.is_file():
            text.write_text(gzip.decompress(CORPUS.read_bytes()).decode("utf-8")[:60_000], encoding="utf-8")
        kind, vocab = FAMILIES[family]
        tok = train_tokenizer([text], kind=kind, family=family, vocab_size=vocab, show_progress=False)
        prepare([text], tok, data, val_fraction=0.1, progress=False)
    return data


def pretrain_args(recipe: str, data: Path, out: Path, **settings) -> list[str]:
    """Command line for a tiny, fast, fp32 run of the ``TINY[recipe]`` model with objective ``recipe``;
    ``settings`` add or replace options."""
    preset, _, overrides = TINY[recipe]
    options = {"model": preset, "objective": recipe, "data": data, "out": out, "max_steps": 3,
               "batch_size": 2, "seq_len": 32, "eval_every": 2, "eval_batches": 1, "save_every": 2,
               "precision": "fp32", "warmup": 1, **settings}
    return command_args(["pretrain", "--no-progress"], options, overrides)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prepared")


@pytest.mark.parametrize("objective", list(TINY))
def test_pretrain_end_to_end(objective, data_root, tmp_path, capsys):
    _, family, _ = TINY[objective]
    data = prepared(data_root, family)
    out = tmp_path / "run"
    assert main(pretrain_args(objective, data, out)) == 0

    model = lmforge.load(out / "model")
    tok = Tokenizer.load(out / "model")
    assert tok.sha256() == Tokenizer.load(data / "tokenizer").sha256()
    assert model.config.vocab_size == tok.vocab_size  # taken from the tokenizer, not the preset's 8192
    for key, value in tok.special_token_ids().items():
        if key.endswith("_token_id"):
            assert getattr(model.config, key) == value
    assert model.config.n_layers == 1 and model.config.d_model == 32  # --override reached the model

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 for r in records)
    assert {"eval_loss", "eval_ppl", "eval_accuracy"} <= set(records[1]) and "eval_loss" in records[2]
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000003"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-00000002", "step-00000003"]
    saved = TrainConfig.load(out / "config.yaml")
    assert saved.objective == objective and Path(saved.data) == data.resolve()
    assert Tokenizer.load(out / "tokenizer").sha256() == tok.sha256()
    assert "done: step 3" in capsys.readouterr().out


def test_config_file_and_command_line_precedence(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"model: gpt-tiny\nobjective: clm\ndata: {data}\nmax-steps: 2\nlr: 3e-3\nbatch_size: 2\n"
                        "seq_len: 16\nprecision: fp32\neval_every: 0\noverrides: {n_layers: 1, d_model: 32, "
                        "n_heads: 2, d_ff: 64}\n")
    out = tmp_path / "run"
    assert main(["pretrain", "--config", str(cfg_file), "--out", str(out), "--no-progress", "--max-steps", "3",
                 "--override", "d_ff=48"]) == 0
    saved = TrainConfig.load(out / "config.yaml")
    assert (saved.max_steps, saved.lr, saved.batch_size) == (3, 3e-3, 2)  # the command line won on max_steps
    assert saved.overrides == {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 48}  # merged key by key
    assert lmforge.load(out / "model").config.d_ff == 48
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Cosine without warmup over 3 steps: update 1 is a third of the way down, (1 + cos(pi/3)) / 2 = 0.75.
    assert [r["lr"] for r in records] == pytest.approx([3e-3 * 0.75, 3e-3 * 0.25, 0.0])


@pytest.mark.parametrize("content, expected", [
    ("learning_rate: 0.1\n", "unknown setting 'learning_rate'"),
    ("max_step: 10\n", "did you mean 'max_steps'"),
    ("lr: fast\n", "lr='fast' must be a number"),
    ("batch_size: 2.5\n", "batch_size=2.5 must be an integer"),
    ("schedule: cosin\n", "schedule='cosin' is not one of"),
    ("warmup: -1\n", "warmup=-1 must be >= 0"),
    ("betas: [0.9]\n", "betas=[0.9] must be two numbers"),
    ("- just a list\n", "expected a mapping of settings"),
])
def test_bad_config_file_names_key_and_file(content, expected, tmp_path, capsys):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(content)
    assert main(["pretrain", "--config", str(cfg_file), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(cfg_file) in err and expected in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("objective, extra, expected", [
    # the tiny BERT of the MLM run, asked to do span corruption; the tiny GPT asked to do MLM
    ("mlm", {"objective": "span-corruption"}, "objective 'span-corruption' does not fit arch='encoder'"),
    ("clm", {"objective": "mlm"}, "objective 'mlm' does not fit arch='decoder'"),
    ("clm", {"seq_len": 100}, "seq_len=100 exceeds the model's max_seq_len=64"),
    ("clm", {"lr": -1}, "lr=-1.0 must be > 0"),
    ("clm", {"objective_option": "mask_prob=0.2"}, "'clm' has no option 'mask_prob'"),
])
def test_refusals_name_the_problem(objective, extra, expected, data_root, tmp_path, capsys):
    data = prepared(data_root, "gpt")
    assert main(pretrain_args(objective, data, tmp_path / "run", **extra)) == 2
    assert expected in capsys.readouterr().err


def test_model_overrides_and_tokenizer_checks(data_root, tmp_path, capsys):
    gpt, bert = prepared(data_root, "gpt"), prepared(data_root, "bert")
    cases = [
        (pretrain_args("clm", gpt, tmp_path / "a") + ["--override", "n_layer=2"],
         "unknown ModelConfig field(s) n_layer"),
        (pretrain_args("clm", gpt, tmp_path / "b") + ["--override", "n_heads=5"], "n_heads=5"),
        (pretrain_args("clm", gpt, tmp_path / "c") + ["--override", "vocab_size=100"],
         "vocab_size=100 is smaller than the tokenizer's 300 tokens"),
        (pretrain_args("clm", gpt, tmp_path / "d") + ["--override", "d_model"],
         "--override 'd_model': expected KEY=VALUE"),
        (pretrain_args("clm", gpt, tmp_path / "e", tokenizer=bert / "tokenizer"), "is not the one"),
        # An MLM model on a GPT tokenizer: there is no [MASK] token to mask with.
        (pretrain_args("mlm", gpt, tmp_path / "f"), "needs mask_token_id"),
    ]
    for args, expected in cases:
        assert main(args) == 2, expected
        assert expected in capsys.readouterr().err


def test_required_settings_and_existing_runs(data_root, tmp_path, capsys):
    data = prepared(data_root, "gpt")
    assert main(["pretrain", "--objective", "clm", "--data", str(data), "--out", str(tmp_path / "x")]) == 2
    assert "missing required setting 'model': pass --model" in capsys.readouterr().err

    out = tmp_path / "run"
    assert main(pretrain_args("clm", data, out, max_steps=2)) == 0
    before = (out / "config.yaml").read_text()
    assert main(pretrain_args("clm", data, out, max_steps=2, lr=0.1)) == 2  # would clobber the run
    assert "already holds a run (checkpoints up to step 2): resume it with --resume" in capsys.readouterr().err
    assert (out / "config.yaml").read_text() == before


def test_objective_kwargs_come_from_the_tokenizer(data_root):
    t5 = Tokenizer.load(prepared(data_root, "t5") / "tokenizer")
    kwargs = objective_kwargs("span-corruption", t5, seed=3, options={"noise_density": 0.3})
    ids = t5.special_token_ids()
    assert kwargs["sentinel_ids"] == ids["sentinel_token_ids"] and kwargs["eos_token_id"] == ids["eos_token_id"]
    assert (kwargs["pad_token_id"], kwargs["seed"], kwargs["noise_density"]) == (ids["pad_token_id"], 3, 0.3)
    bert = Tokenizer.load(prepared(data_root, "bert") / "tokenizer")
    kwargs = objective_kwargs("mlm", bert, seed=0, options={})
    assert kwargs["add_cls_sep"] and kwargs["vocab_size"] == bert.vocab_size
    assert set(kwargs["special_token_ids"]) == {v for k, v in bert.special_token_ids().items()}


def test_denoising_gets_the_sentence_ends(data_root):
    # Without them BART's sentence permutation sees each flat document as one sentence: a silent no-op.
    bart = Tokenizer.load(prepared(data_root, "bart") / "tokenizer")
    kwargs = objective_kwargs("denoising", bart, seed=0, options={})
    ends = kwargs["sentence_end_ids"]
    assert bart.token_to_id(".") in ends and bart.token_to_id("?") in ends
    assert all(set(bart.decode([i]).strip()) <= set(".!?\"')»”’") for i in ends)
    assert not set(ends) & {v for k, v in bart.special_token_ids().items() if k.endswith("_token_id")}
    from lmforge.objectives import OBJECTIVES

    # Only the permutation (no infilling): the four sentences come back in other orders.
    denoise = OBJECTIVES["denoising"](**kwargs, infill_ratio=0.0)
    doc = bart.encode("It rained. The sun came out. We walked home. Then it rained again.", add_special_tokens=False)
    outs = {tuple(denoise([doc])["input_ids"][0].tolist()) for _ in range(8)}
    assert len(outs) > 1, "sentence permutation never changed the order"


def test_build_pretraining_document_segments_fit_the_model(data_root, tmp_path):
    # Document objectives read segments of seq_len - 2 tokens and frame them: inputs never exceed seq_len.
    data = prepared(data_root, "bart")
    preset, _, overrides = TINY["denoising"]
    cfg = TrainConfig(model=preset, objective="denoising", data=str(data), out=str(tmp_path / "run"), seq_len=24,
                      batch_size=4, overrides=overrides, eval_every=0, precision="fp32", progress=False)
    trainer = build_pretraining(cfg).trainer
    for raw, _ in zip(trainer.train_data, range(5)):
        batch = trainer.objective(raw)
        assert batch["labels"].shape[1] <= 24 and batch["input_ids"].shape[1] <= 24
