"""A causal LM whose held-out loss is still near its data's unigram entropy is announced by `lmforge generate`
(and `chat`) in one note on stderr; without either number there is no note."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
import scipy.stats

from lmforge.cli.main import main
from lmforge.data.prepare import prepare
from lmforge.data.unigram import entropy
from lmforge.tokenization import Tokenizer
from lmforge.training.held_out import MARGIN, frequency_note, held_out_loss, note_for
from tests import task_helpers as th

TINY = [f"--override={k}={v}" for k, v in {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64,
                                           "max_seq_len": 64}.items()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step causal LM run (its held-out loss is about ln V, above the unigram entropy) on prepared data."""
    root = tmp_path_factory.mktemp("unigram")
    th.tokenizer(root, "gpt").save(root / "tokenizer")  # writes root/corpus.txt
    prepare([root / "corpus.txt"], root / "tokenizer", root / "shards", val_fraction=0.1, progress=False)
    argv = ["pretrain", "--model", "gpt-tiny", "--objective", "clm", "--data", root / "shards", "--out", root / "run",
            "--max-steps", "2", "--batch-size", "2", "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1",
            "--no-progress", "--no-tensorboard", "--precision", "fp32", *TINY]
    assert main([str(a) for a in argv]) == 0
    return root


def test_prepare_records_the_unigram_entropy_of_the_training_tokens(run):
    manifest = json.loads((run / "shards" / "manifest.json").read_text())
    tok = Tokenizer.load(run / "tokenizer")
    # By hand: the train split's stored tokens, and one boundary token per train document (the loaders' eos).
    counts: Counter = Counter()
    for chunk in manifest["chunks"]:
        shard = chunk["train"]
        counts.update(np.fromfile(run / "shards" / shard["bin"], dtype=manifest["dtype"]).tolist())
    counts[("boundary", tok.boundary_id)] = manifest["splits"]["train"]["documents"]
    assert manifest["unigram_entropy"] == pytest.approx(scipy.stats.entropy(list(counts.values())), abs=1e-6)
    assert entropy([1, 1, 1, 1]) == pytest.approx(np.log(4))


def test_generate_notes_a_model_near_the_unigram_loss(run, capsys):
    loss = held_out_loss(run / "run" / "model")
    unigram = json.loads((run / "shards" / "manifest.json").read_text())["unigram_entropy"]
    assert loss is not None and loss > unigram - MARGIN  # two steps: the model knows next to nothing yet
    assert main(["generate", "--model", str(run / "run" / "model"), "--prompt", "the film", "--max-new-tokens", "2",
                 "--no-stream", "--no-price-tag"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"lmforge generate: {frequency_note(loss, unigram)}"]
    assert f"held-out loss ({loss:.2f} nats) is within 1.0 of a unigram model's ({unigram:.2f}" in err[0]


def test_no_note_when_the_model_learnt_more_or_a_number_is_unknown(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run / "run", copy)
    assert note_for(copy / "model") is not None
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    low = [{**r, "eval_loss": 0.5} if "eval_loss" in r else r for r in records]
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in low))
    assert note_for(copy / "model") is None  # far below the unigram entropy: it uses context
    assert main(["generate", "--model", str(copy / "model"), "--prompt", "the film", "--max-new-tokens", "2",
                 "--no-stream", "--no-price-tag"]) == 0
    assert capsys.readouterr().err == ""
    # No evaluation recorded: no held-out loss, no note.
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if "eval_loss" not in r))
    assert held_out_loss(copy / "model") is None and note_for(copy / "model") is None
    (copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    # Data prepared before the entropy was recorded (or moved away): no note.
    data = tmp_path / "shards"
    shutil.copytree(run / "shards", data)
    manifest = json.loads((data / "manifest.json").read_text())
    del manifest["unigram_entropy"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    config = (copy / "config.yaml").read_text()
    assert str(run / "shards") in config
    (copy / "config.yaml").write_text(config.replace(str(run / "shards"), str(data)))
    assert note_for(copy / "model") is None
    (copy / "config.yaml").write_text(config.replace(str(run / "shards"), str(tmp_path / "gone")))
    assert note_for(copy / "model") is None
    # A model folder outside its run folder: nothing to read.
    shutil.copytree(copy / "model", tmp_path / "alone")
    assert note_for(tmp_path / "alone") is None


def test_another_objective_gets_no_note(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run / "run", copy)
    config = (copy / "config.yaml").read_text()
    assert "objective: clm" in config
    (copy / "config.yaml").write_text(config.replace("objective: clm", "objective: mlm"))
    assert note_for(copy / "model") is None  # a masked LM's loss is over the masked tokens only


def test_the_note_is_one_line_and_absent_far_below():
    assert frequency_note(6.41, 6.60).count("\n") == 0
    assert frequency_note(6.60 - MARGIN + 0.01, 6.60) is not None
    assert frequency_note(6.60 - MARGIN - 0.01, 6.60) is None
    assert frequency_note(None, 6.6) is None and frequency_note(6.4, None) is None
