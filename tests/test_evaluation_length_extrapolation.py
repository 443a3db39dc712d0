"""Length extrapolation: the loss at the training length is the Trainer's ordinary evaluation loss; positions are
scored as the causal LM scores them; a model read past its max_seq_len computes its first positions exactly as
before (every scheme that extrapolates), and a learned table is refused."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.evaluation import length_extrapolation as lx
from lmforge.objectives.clm import CausalLM
from lmforge.training import Trainer
from tests import task_helpers as th

L = 16


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return th.tokenizer(tmp_path_factory.mktemp("tok"), "gpt")


def _ids(tok, n=400):
    text = " ".join(t for t, _ in th.sentiment_rows(200))
    return tok.encode(text, add_special_tokens=False)[:n]


def test_loss_at_the_training_length_is_the_trainers_evaluation_loss(tok, tmp_path):
    torch.manual_seed(0)
    model = th.body("gpt", tok, position="rope", max_seq_len=L)
    ids = _ids(tok)
    result = lx.report(model, ids, L)
    blocks = torch.tensor(lx.blocks(ids, L))  # (n, L + 1)
    cfg = th.train_config(eval_batches=1, batch_size=len(blocks))
    trainer = Trainer(model, CausalLM(pad_token_id=tok.pad_id), [blocks], cfg, out=tmp_path / "run",
                      eval_data=[blocks])
    assert result["loss"] == pytest.approx(trainer.evaluate()["eval_loss"], rel=1e-5)
    assert result["blocks"] == len(ids) // (L + 1) and [b["positions"] for b in result["buckets"]] == ["0-15"]


def test_each_position_is_its_next_token_loss(tok):
    torch.manual_seed(0)
    model = th.body("gpt", tok, position="alibi", max_seq_len=L).eval()
    ids = _ids(tok, 3 * (L + 1))
    total, n = lx.position_losses(model, ids, L, batch_size=2)
    assert n == 3
    by_hand = torch.zeros(L, dtype=torch.float64)
    with torch.no_grad():
        for block in lx.blocks(ids, L):
            for p in range(L):  # the prefix alone: causality makes it the same prediction
                logits = model(torch.tensor([block[:p + 1]])).logits[0, -1]
                by_hand[p] += float(F.cross_entropy(logits[None], torch.tensor([block[p + 1]])))
    torch.testing.assert_close(total, by_hand, atol=1e-4, rtol=1e-5)
    result = lx.report(model, ids, L, train_len=4)
    assert [b["positions"] for b in result["buckets"]] == ["0-3", "4-7", "8-11", "12-15"]
    assert result["buckets"][1]["loss"] == pytest.approx(float(by_hand[4:8].sum()) / (3 * 4), rel=1e-5)
    assert [b["beyond_training"] for b in result["buckets"]] == [False, True, True, True]


@pytest.mark.parametrize("position, extra", [("sinusoidal", {}), ("rope", {}), ("alibi", {}), ("t5-bias", {}),
                                             ("relative", {"relative_k": 4})])
def test_a_longer_reading_keeps_the_first_positions(tok, position, extra):
    torch.manual_seed(0)
    model = th.body("gpt", tok, position=position, max_seq_len=L, **extra).eval()
    longer = lx.at_length(model, 4 * L)
    assert longer.config.max_seq_len == 4 * L and lx.at_length(model, L) is model
    x = torch.tensor([_ids(tok, 4 * L)])
    with torch.no_grad():
        torch.testing.assert_close(longer(x).logits[:, :L], model(x[:, :L]).logits, atol=1e-5, rtol=1e-5)
    result = lx.report(model, _ids(tok), 2 * L)
    assert [b["beyond_training"] for b in result["buckets"]] == [False, True]


def test_learned_positions_and_encoders_are_refused(tok, tmp_path, capsys):
    model = th.body("gpt", tok, position="learned", max_seq_len=L)
    assert lx.at_length(model, L) is model
    with pytest.raises(UserInputError, match=r"--seq-len 32: position scheme 'learned' has a table of max_seq_len=16 "
                                             r"trained rows and none beyond"):
        lx.report(model, _ids(tok), 2 * L)
    bert_tok = th.tokenizer(tmp_path, "bert")
    with pytest.raises(UserInputError, match="needs a decoder, not 'encoder'"):
        lx.at_length(th.body("bert", bert_tok), 8)
    with pytest.raises(UserInputError, match="too few for one block"):
        lx.report(th.body("gpt", tok, position="rope", max_seq_len=L), [1, 2, 3], L)


def test_evaluate_seq_len_cli(tok, tmp_path, capsys):
    torch.manual_seed(0)
    folder = checkpoint.save(th.body("gpt", tok, position="rope", max_seq_len=L), tmp_path / "gpt", tokenizer=tok)
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(t for t, _ in th.sentiment_rows(60)) + "\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(folder), "--data", str(text), "--seq-len", str(2 * L)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["train_len"] == L and [b["positions"] for b in result["buckets"]] == ["0-15", "16-31"]
    assert any("(beyond training)" in line for line in out)
    learned = checkpoint.save(th.body("gpt", tok, max_seq_len=L), tmp_path / "learned", tokenizer=tok)
    assert main(["evaluate", "--model", str(learned), "--data", str(text), "--seq-len", str(2 * L)]) == 2
    assert "position scheme 'learned'" in capsys.readouterr().err


def test_benchmark_script_runs_at_toy_sizes(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "length_extrapolation.py"), "--work",
                          str(tmp_path), "--quick", "--steps", "2", "--batch-size", "2", "--train-len", "16",
                          "--lengths", "16,32", "--blocks", "2", "--schemes", "rope"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rope = result["table"]["rope"]  # one scheme keeps it short; learned's refusal: test_evaluate_seq_len_cli
    assert rope[0]["loss"] > 0 and rope[0]["beyond_loss"] is None
    decay = result["rope_decay"]  # at distance 0 every partial sum S_j = j: the mean of 1..32 for d = 64
    assert rope[1]["beyond_loss"] > 0 and decay[0] == pytest.approx(16.5) and max(decay[len(decay) // 2:]) < decay[0] / 2


def test_a_prepared_folder_is_read_as_its_validation_split(tok, tmp_path, capsys):
    from lmforge.data.loader import PackedDataset
    from lmforge.data.prepare import prepare

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t, _ in th.sentiment_rows(120)), encoding="utf-8")
    data = tmp_path / "data"
    prepare([docs], tok, data, val_fraction=0.3, progress=False)
    ids = lx.text_ids(str(data), tok, tok.boundary_id)
    packed = PackedDataset(data, L, 1, split="val", shuffle=False)  # the Trainer's evaluation blocks, in order
    want = [packed.get_batch(0, i)[0].tolist() for i in range(len(packed))]
    assert lx.blocks(ids, L) == want and len(want) > 2
    torch.manual_seed(0)
    folder = checkpoint.save(th.body("gpt", tok, position="alibi", max_seq_len=L), tmp_path / "gpt", tokenizer=tok)
    assert main(["evaluate", "--model", str(folder), "--data", str(data), "--seq-len", str(2 * L)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["blocks"] == len(lx.blocks(ids, 2 * L))
    other = th.tokenizer(tmp_path, "bert")
    with pytest.raises(UserInputError, match="prepared with another tokenizer than the model's"):
        lx.text_ids(str(data), other, other.boundary_id)
