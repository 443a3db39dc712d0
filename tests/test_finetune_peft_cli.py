"""PEFT fine-tuning (`finetune(peft=...)`, `lmforge finetune --peft`): what trains, what is saved, that
evaluate/predict load it back exactly, that an interrupted run resumes exactly, and the errors."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.peft import AdapterMismatchError, PeftConfig
from lmforge.peft.model import PeftModel
from lmforge.tasks import inference
from lmforge.tasks.data import read_table
from lmforge.tasks.finetune import FinetuneTrainer, finetune
from lmforge.tasks.model import load_task_model
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import Tokenizer
from tests import task_helpers as th

# Every method at a tiny size.
SMALL = {
    "lora": dict(r=4),
    "qlora": dict(r=4, nf4_block_size=16, nf4_scaler_block_size=4),
    "adapter": dict(adapter_dim=8),
    "prefix": dict(num_virtual_tokens=3, prefix_hidden=16),
    "prompt": dict(num_virtual_tokens=3),
    "ia3": dict(),
    "bitfit": dict(),
    "mam": dict(num_virtual_tokens=3, prefix_hidden=16, adapter_dim=8),
}
COMMON = ["--no-progress", "--no-tensorboard", "--precision", "fp32"]
LORA = ["--peft", "lora", "--peft-option", "r=4", "--peft-option", "alpha=8", "--peft-option", "targets=q,v,ffn"]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toks")
    return {f: th.tokenizer(folder, f) for f in ("bert", "gpt", "t5")}


def _peft(method: str) -> PeftConfig:
    return PeftConfig(method=method, **SMALL[method])


def _batch(model, tok, data):
    """Encoded examples of ``data`` collated into one batch for ``model``."""
    from lmforge.tasks import build_task

    task = build_task(model.spec, tok, model.config)
    examples = task.encode(read_table(data), True)
    return {k: v for k, v in task.collate(examples).items() if k != "labels"}


def _losses(out) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def _interrupt_at(monkeypatch, step: int) -> None:
    """Deliver a real SIGINT to this process after ``step`` training steps (the Trainer's Ctrl-C path)."""
    original = FinetuneTrainer.train_step

    def train_step(self):
        record = original(self)
        if self.step == step:
            os.kill(os.getpid(), signal.SIGINT)
        return record

    monkeypatch.setattr(FinetuneTrainer, "train_step", train_step)


# ------------------------------------------------------------------------------------------- the API
@pytest.mark.parametrize("method", list(SMALL))
def test_only_adapter_and_head_train_and_the_folder_reloads_exactly(method, toks, tmp_path):
    tok = toks["bert"]
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 32), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    body = th.body("bert", tok, dropout=0.1)
    base = {k: v.clone() for k, v in body.state_dict().items()}
    start = {}

    def snapshot(model):  # the wrap hook sees the task model after PEFT, before training
        start.update({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
        return model

    result = finetune(body, TaskSpec(task="classify"), train, dev, out=tmp_path / "run", tokenizer=tok,
                      peft=_peft(method), wrap=snapshot,
                      config=th.train_config(steps=4, batch_size=8, eval_every=2, weight_decay=0.0))
    model = result.model.eval()
    assert isinstance(model.body, PeftModel) and result.train.step == 4
    # The base never moved (a PEFT adapter that leaked gradients into it would change these) ...
    if method != "qlora":  # (QLoRA swaps the linears for NF4 copies; its base is checked through the reload below)
        now = model.body.base_model.state_dict()
        assert all(torch.equal(now[k], v) for k, v in base.items() if k in now)
    # ... while the head and every adapter tensor trained, and they are what the report counts.
    trained = dict(model.named_parameters())
    assert any(n.startswith("head.") for n in start) and any(n.startswith("body.") for n in start)
    assert all(not torch.equal(trained[n], v) for n, v in start.items()), method
    assert result.params["trainable"] == sum(v.numel() for v in start.values()) < result.params["total"]
    # OUT/model holds adapter + head + the base's path, no body weights; the base (a module passed in) was
    # saved once to OUT/base.
    folder = tmp_path / "run" / "model"
    files = {p.name for p in folder.iterdir()}
    assert {"adapter.safetensors", "adapter_config.json", "task.json", "task_head.safetensors",
            "tokenizer.json"} <= files and not files & {"model.safetensors", "config.json"}
    assert json.loads((folder / "task.json").read_text())["peft"] == {"base": "../base"}
    batch = _batch(model, tok, dev)
    reloaded = load_task_model(folder)
    assert isinstance(reloaded.body, PeftModel)
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model(**batch).logits)
    # Trainer checkpoints hold the trainable tensors only (adapter and head), not the frozen base.
    ckpt = load_file(str(tmp_path / "run" / "checkpoints" / "step-00000004" / "model" / "model.safetensors"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(ckpt) == trainable and any(k.startswith("head.") for k in ckpt)


@pytest.mark.parametrize("family,task,method", [("gpt", "classify", "prompt"), ("gpt", "classify", "prefix"),
                                                ("t5", "seq2seq", "lora")])
def test_decoder_and_generative_tasks_reload_exactly(family, task, method, toks, tmp_path):
    tok = toks[family]
    if task == "seq2seq":
        train = th.write_numbers(tmp_path / "train.tsv", 16)
        spec = TaskSpec(task="seq2seq", text_column="source", target_column="target", max_target_length=8)
    else:
        train = th.write_sentiment(tmp_path / "train.tsv", 16)
        spec = TaskSpec(task="classify")
    result = finetune(th.body(family, tok), spec, train, out=tmp_path / "run", tokenizer=tok, peft=_peft(method),
                      config=th.train_config(steps=3, batch_size=8))
    model, reloaded = result.model.eval(), load_task_model(tmp_path / "run" / "model")
    from lmforge.tasks import build_task

    t = build_task(model.spec, tok, model.config)
    batch = t.collate(t.encode(read_table(train), True)[:4])
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("method", list(SMALL))
def test_interrupted_peft_run_resumes_exactly(method, toks, tmp_path, monkeypatch):
    """SIGINT after step 3, then resume: the same per-step losses, adapter, head and best as a straight run.
    Dropout is on, so the resumed RNG stream matters; the base comes back from the OUT/base snapshot."""
    tok = toks["bert"]
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 40), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)

    def run(out, resume=False):
        torch.manual_seed(1)
        return finetune(th.body("bert", tok, dropout=0.1, attn_dropout=0.1), TaskSpec(task="classify"), train, dev,
                        out=out, tokenizer=tok, peft=_peft(method),
                        config=th.train_config(steps=6, batch_size=4, save_every=2, eval_every=2, resume=resume,
                                               schedule="linear", warmup=2, weight_decay=0.01))

    straight = run(tmp_path / "a")
    _interrupt_at(monkeypatch, 3)
    first = run(tmp_path / "b")
    assert first.train.stopped_by == "SIGINT" and first.train.step == 3
    monkeypatch.undo()
    resumed = run(tmp_path / "b", resume=True)
    assert resumed.train.step == 6
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a") and len(_losses(tmp_path / "a")) == 6
    for folder in ("model", "best"):
        a = load_file(str(tmp_path / "a" / folder / "adapter.safetensors"))
        b = load_file(str(tmp_path / "b" / folder / "adapter.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), folder
        a = load_file(str(tmp_path / "a" / folder / "task_head.safetensors"))
        b = load_file(str(tmp_path / "b" / folder / "task_head.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    assert resumed.best == straight.best


# ------------------------------------------------------------------------------------------- the CLI
@pytest.fixture
def cli_run(toks, tmp_path):
    """A base model folder, train/dev files and the flags of a small LoRA run."""
    tok = toks["bert"]
    base = checkpoint.save(th.body("bert", tok, dropout=0.1), tmp_path / "base", tokenizer=tok)
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 32), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    flags = ["--model", str(base), "--task", "classify", "--train", str(train), "--eval", str(dev), "--lr", "3e-2",
             "--max-steps", "6", "--save-every", "2", "--eval-every", "3", "--batch-size", "8", *COMMON]
    return base, train, dev, flags


def test_cli_lora_run_evaluate_predict_and_merge(cli_run, tmp_path, capsys):
    base, _, dev, flags = cli_run
    out = tmp_path / "run"
    assert main(["finetune", *flags, *LORA, "--out", str(out), "--merge"]) == 0
    printed = capsys.readouterr()
    assert "peft lora (targets=['q', 'v', 'ffn'], r=4, alpha=8.0): trainable params:" in printed.err
    assert "merged:" in printed.out
    meta = json.loads((out / "best" / "task.json").read_text())
    assert meta["peft"] == {"base": str(base.resolve())} and meta["best"]["metric"] == "accuracy"
    adapter = json.loads((out / "best" / "adapter_config.json").read_text())
    assert adapter["peft"]["r"] == 4 and adapter["peft"]["targets"] == ["q", "v", "ffn"]
    assert not (out / "base").exists()  # a base folder is referenced, not copied

    # evaluate and predict read the PEFT folder; predictions equal the in-process model's exactly.
    assert main(["evaluate", "--model", str(out / "best"), "--data", str(dev)]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["examples"] == 8
    rows = inference.predict(out / "best", dev, tmp_path / "p.jsonl")
    assert main(["predict", "--model", str(out / "best"), "--data", str(dev),
                 "--output", str(tmp_path / "q.jsonl")]) == 0
    cli_rows = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [r["prediction_probabilities"] for r in cli_rows] == [r["prediction_probabilities"] for r in rows]

    # OUT/merged is a plain task folder (full weights, no adapter) with the same predictions; the adapter
    # matters, so a merge that lost it would show.
    model = load_task_model(out / "best")
    batch = _batch(model, Tokenizer.load(out / "best"), dev)
    with torch.no_grad():
        with model.body.disable_adapters():
            plain = model(**batch).logits.softmax(-1)
        # 10x the merge tolerance below: a merge that dropped the adapter could not pass that check.
        assert (plain - model(**batch).logits.softmax(-1)).abs().max() > 1e-4
    # OUT/merged is a plain task folder (full weights, no adapter) with the same predictions.
    assert (out / "merged" / "model.safetensors").is_file() and not (out / "merged" / "adapter.safetensors").exists()
    merged = inference.predict(out / "merged", dev, tmp_path / "m.jsonl")
    for a, b in zip(rows, merged, strict=True):
        assert a["prediction"] == b["prediction"]
        assert all(abs(a["prediction_probabilities"][k] - b["prediction_probabilities"][k]) < 1e-5
                   for k in a["prediction_probabilities"])
    assert main(["evaluate", "--model", str(out / "merged"), "--data", str(dev)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] == scores["accuracy"]


def test_cli_interrupted_run_resumes_with_only_out(cli_run, tmp_path, monkeypatch, capsys):
    _, _, _, flags = cli_run
    torch.manual_seed(0)  # the head and adapter initialisations come from torch's global generator
    assert main(["finetune", *flags, *LORA, "--out", str(tmp_path / "a")]) == 0
    _interrupt_at(monkeypatch, 3)
    torch.manual_seed(0)
    assert main(["finetune", *flags, *LORA, "--out", str(tmp_path / "b")]) == 128 + signal.SIGINT
    assert "--resume" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["finetune", "--out", str(tmp_path / "b"), "--resume", *COMMON]) == 0
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")
    a = load_file(str(tmp_path / "a" / "model" / "adapter.safetensors"))
    b = load_file(str(tmp_path / "b" / "model" / "adapter.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_resume_refuses_other_peft_settings_and_a_changed_base(cli_run, tmp_path, capsys, toks):
    base, _, _, flags = cli_run
    out = tmp_path / "run"
    assert main(["finetune", *flags, *LORA, "--out", str(out), "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert main(["finetune", "--out", str(out), "--resume", "--max-steps", "4", "--peft", "ia3", *COMMON]) == 2
    assert "--peft: this run was started with PEFT settings" in capsys.readouterr().err
    # The base folder is rebuilt on resume: a different one there must not be trained on silently.
    checkpoint.save(th.body("bert", toks["bert"], dropout=0.1, initializer_range=0.5), base, tokenizer=toks["bert"])
    assert main(["finetune", "--out", str(out), "--resume", "--max-steps", "4", *COMMON]) == 2
    assert "weights differ" in capsys.readouterr().err
    # ... nor evaluated on: the adapter folder names its base and checks it.
    with pytest.raises(AdapterMismatchError, match="weights differ"):
        load_task_model(out / "model")
    shutil.rmtree(base)
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(tmp_path / "dev.tsv")]) == 2
    assert "base model folder" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--peft", "lora", "--peft-option", "rank=4"], "--peft-option rank: not a PEFT option"),
    (["--peft", "lora", "--peft-option", "r=four"], "--peft-option 'r=four': r must be an integer"),
    (["--peft", "lora", "--peft-option", "r"], "expected KEY=VALUE"),
    (["--peft-option", "r=4"], "--peft-option needs --peft METHOD"),
    (["--peft", "lora", "--peft-option", "adapter_dim=8"],
     "--peft lora: PeftConfig.adapter_dim=8 is not used by method 'lora'"),
    (["--peft", "prefix", "--merge"], "--merge: a prefix adapter cannot be folded"),
    (["--merge"], "--merge folds a PEFT adapter into the model; it needs --peft"),
    (["--peft", "lora", "--freeze-body"], "--freeze-body trains the head only"),
])
def test_cli_errors_are_one_line_naming_the_flag(cli_run, tmp_path, capsys, extra, message):
    _, _, _, flags = cli_run
    assert main(["finetune", *flags, *extra, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_cli_peft_config_file(cli_run, tmp_path, capsys):
    _, _, _, flags = cli_run
    flags = [*flags, "--max-steps", "2"]
    # A --peft-config file gives the method and options; --peft-option overrides one of them.
    cfg = tmp_path / "ia3.yaml"
    cfg.write_text("method: ia3\ntargets: [k, v]\n")
    assert main(["finetune", *flags, "--peft-config", str(cfg), "--peft-option", "targets=v",
                 "--out", str(tmp_path / "y")]) == 0
    saved = json.loads((tmp_path / "y" / "model" / "adapter_config.json").read_text())["peft"]
    assert saved["method"] == "ia3" and saved["targets"] == ["v"]
    cfg.write_text("method: ia3\nr: 4\n")
    assert main(["finetune", *flags, "--peft-config", str(cfg), "--out", str(tmp_path / "z")]) == 2
    assert "--peft-config: " in capsys.readouterr().err
