"""The fault probe's re-run, case by case (issue 63): each case a user hit from outside, now one line and exit 2,
with nothing of the user's deleted and nothing half-made left behind.

* ``quantize --out`` onto a folder holding a user's file, or onto a run folder, deleted it (exit 0); a killed
  quantize left a hidden temporary folder that no rerun removed.
* ``pretrain`` from a model folder onto shards of another tokenizer trained and rewrote the model's special ids.
* ``align`` took ``"chosen": 5`` (a number) as text and trained.
* ``pretrain --lr 1e6 --max-steps 3`` ended "done ... loss nan, model saved", exit 0.
* ``experiment run`` on a grid whose data folder does not exist ran every cell, failed each, exited 1.
* ``benchmark`` without usable data left an empty ``--out`` folder.

(Concurrent runs on one folder: ``test_concurrent_runs.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import EXIT_USER
from test_faults_lock import snapshot
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401

TESTS = Path(__file__).resolve().parent


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A tiny decoder model folder with its own (toy) tokenizer."""
    from task_helpers import body, tokenizer

    folder = tmp_path_factory.mktemp("decoder")
    tok = tokenizer(folder, "gpt")
    return checkpoint.save(body("gpt", tok), folder / "model", tokenizer=tok)


def _run_folder(path: Path) -> Path:
    """The shape of a training run folder: what quantize must not replace."""
    (path / "checkpoints" / "step-00000002").mkdir(parents=True)
    (path / "checkpoints" / "step-00000002" / "state.pt").write_bytes(b"weights and optimizer")
    (path / "checkpoints" / "latest").write_text("step-00000002\n")
    (path / "config.yaml").write_text("model: gpt-tiny\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    return path


def test_quantize_out_refuses_a_folder_of_something_else_and_replaces_its_own_kind(decoder, tmp_path, capsys):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("my notes")
    run = _run_folder(tmp_path / "run")
    for out, holds in ((users, "notes.txt"), (run, "checkpoints, config.yaml, metrics.jsonl")):
        before = snapshot(out)
        capsys.readouterr()
        assert main(["quantize", "--model", str(decoder), "--to", "int8", "--out", str(out)]) == EXIT_USER
        line = one_error_line(capsys.readouterr().err)
        assert f"--out {out}: not empty and not a model folder (it holds {holds})" in line, line
        assert snapshot(out) == before  # every file as it was
    # A model folder is its own kind: quantising onto it again replaces it.
    out = tmp_path / "q"
    assert main(["quantize", "--model", str(decoder), "--to", "int8", "--out", str(out)]) == 0
    assert main(["quantize", "--model", str(decoder), "--to", "int4", "--out", str(out)]) == 0
    assert json.loads((out / "quantization.json").read_text())["mode"] == "int4"


KILLED_MID_SAVE = textwrap.dedent("""
    import os, signal, sys
    import lmforge.model_folder as mf
    real = mf.save_file
    def save_file(tensors, name, metadata=None):  # die half-way through writing the weights
        real(tensors, name, metadata=metadata)
        with open(name, "r+b") as f:
            f.truncate(os.path.getsize(name) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    mf.save_file = save_file
    from lmforge.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_killed_quantize_leaves_a_temporary_that_the_next_run_removes(decoder, tmp_path):
    out = tmp_path / "q8"
    args = ["quantize", "--model", str(decoder), "--to", "int8", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".q8.") and p.name.endswith(".tmp")]
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file() and not out.exists()
    assert main(args) == 0
    assert (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".q8.")]  # the dead writer's leftover went


def test_convert_out_refuses_a_folder_of_something_else(decoder, tmp_path, capsys):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("my notes")
    capsys.readouterr()
    assert main(["convert", "to-hf", str(decoder), str(users), "--overwrite"]) == EXIT_USER
    assert "not empty and not a model folder (it holds notes.txt)" in one_error_line(capsys.readouterr().err)
    assert (users / "notes.txt").read_text() == "my notes" and sorted(p.name for p in users.iterdir()) == ["notes.txt"]


def test_pretrain_from_a_model_of_another_tokenizer_is_refused_as_finetune_and_distill_are(decoder, data_root,
                                                                                         tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "gpt")  # its byte-level BPE is not the model's toy tokenizer
    out = tmp_path / "run"
    args = pretrain_args("clm", data, out, max_steps=2, eval_every=0)
    model_at = args.index("--model") + 1
    args[model_at] = str(decoder)
    args = [a for i, a in enumerate(args) if not (a == "--override" or (i and args[i - 1] == "--override"))]
    capsys.readouterr()
    assert main(args) == EXIT_USER
    line = one_error_line(capsys.readouterr().err)
    assert f"{decoder} was trained with another tokenizer" in line and f"the tokenizer of {data}" in line, line
    assert not out.exists()
    # The one shared check: the same words as every command that continues from a model.
    from lmforge.tokenization import Tokenizer
    with pytest.raises(Exception) as shared:
        checkpoint.check_tokenizer(decoder, Tokenizer.load(data / "tokenizer"), f"the tokenizer of {data}")
    assert str(shared.value) in line


def test_align_refuses_a_field_that_is_not_text(decoder, tmp_path, capsys):
    for value, kind in ((5, "a number (5)"), (["a"], "a list (['a'])"), (True, "a boolean (True)")):
        pairs = tmp_path / "pairs.jsonl"
        pairs.write_text(json.dumps({"prompt": "the film", "chosen": " good", "rejected": " bad"}) + "\n"
                         + json.dumps({"prompt": "the plot", "chosen": value, "rejected": " dull"}) + "\n")
        out = tmp_path / "align"
        capsys.readouterr()
        assert main(["align", "--method", "dpo", "--policy", str(decoder), "--train", str(pairs), "--out", str(out),
                     "--max-steps", "1", "--batch-size", "2", "--precision", "fp32", "--no-progress",
                     "--no-tensorboard"]) == EXIT_USER
        line = one_error_line(capsys.readouterr().err)
        assert f"pairs.jsonl: row 2 (line 2): field 'chosen' is {kind}, not text" in line, line
        assert not out.exists()


def test_a_run_that_ends_on_a_non_finite_loss_exits_2_naming_the_lr_and_saves_no_model(data_root, tmp_path,
                                                                                      capsys):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(pretrain_args("clm", data, out, max_steps=3, lr=1e6, eval_every=0)) == EXIT_USER
    err = capsys.readouterr().err
    line = one_error_line(err)
    assert "training diverged by its end, step 3" in line and "loss nan" in line and "peak lr 1e+06" in line, line
    assert "model saved" not in err and not (out / "model").exists()
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("step-00000003"))


def test_a_grid_with_a_missing_input_is_refused_before_any_cell_runs(data_root, tmp_path, capsys):  # noqa: F811
    from experiment_helpers import LR_AXIS, grid_text, write_grid

    missing = tmp_path / "no-such-data"
    grid = write_grid(tmp_path, grid_text(missing, [LR_AXIS], seeds=(0,), steps=4))
    out = tmp_path / "exp"
    capsys.readouterr()
    assert main(["experiment", "run", str(grid), "--out", str(out)]) == EXIT_USER
    line = one_error_line(capsys.readouterr().err)
    assert f"cell lr=low: pretrain data: {missing}: no such file or folder" in line, line
    assert not out.exists()  # nothing run, nothing written
    # A later cell's missing input is found as early: the first cell's data exists, the second's does not.
    data = prepared(data_root, "gpt")
    axis = {"name": "data", "variants": [{"name": "real", "data": str(data)}, {"name": "gone", "data": str(missing)}]}
    grid = write_grid(tmp_path, grid_text(data, [axis], seeds=(0,), steps=4), "two.yaml")
    assert main(["experiment", "run", str(grid), "--out", str(out)]) == EXIT_USER
    assert f"cell data=gone: pretrain data: {missing}" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_benchmark_without_data_creates_nothing_and_keeps_a_folder_it_found(decoder, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["benchmark", "glue", "--model", str(decoder), "--data-dir", str(tmp_path / "no-glue"), "--out", str(out),
            "--tasks", "cola", "--max-steps", "1"]
    capsys.readouterr()
    assert main(args) == EXIT_USER
    assert "CoLA" in one_error_line(capsys.readouterr().err)
    assert not out.exists()
    out.mkdir()  # the user's own empty folder stays
    assert main(args) == EXIT_USER
    assert out.is_dir()
