"""Every command that reads a folder, given every folder kind lmforge writes: it does its job, or it refuses in one
line (exit 2, no traceback) that says what the folder is, and writes nothing.

One tiny folder of each kind is built once, by the commands that write it (a 2-layer d_model 32 decoder, one or
two training steps), and each command runs in-process on each of them, stopped early where it accepts the folder
(``--max-steps 1``, two new tokens, a one-row file). The table :data:`CELLS` is the specification: for each command
the kinds it takes (``ok``, exit 0) and the kinds it takes but refuses for a reason of their content (``error``: a
task folder cannot ``generate`` when its body has no LM head); every other kind must be refused by
:func:`lmforge.utils.folder_kinds.require_kind`, naming the kind.
"""

from __future__ import annotations

import importlib
import io
import shutil
from pathlib import Path

import pytest

import align_helpers
import experiment_helpers
import task_helpers as th
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.utils import folder_kinds as fk
from lmforge.utils.folder_kinds import KINDS, folder_kind, require_kind

FIXTURES = Path(__file__).resolve().parent / "fixtures"
COMMON = ["--no-progress", "--no-tensorboard", "--precision", "fp32"]
STEP = ["--max-steps", "1", "--batch-size", "2", *COMMON]
TINY = [f"--override={k}={v}" for k, v in {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64,
                                           "max_seq_len": 64}.items()]
# The kinds of the issue (#63), each a folder a user can pass; "baseline" and "bilm" are the model folders of their
# runs, "run" a pre-training run folder (its model/ inside).
KIND_NAMES = ("model", "task", "adapter", "quantized", "run", "bilm", "baseline", "experiment", "quickstart",
              "tokenizer", "shards")


def _run(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:  # argparse: a usage error is exit 2 with its own message
        return exc.code


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """{kind: folder} plus the inputs the commands read; built once by lmforge's own writers."""
    root = tmp_path_factory.mktemp("kinds")
    tok = th.tokenizer(root, "gpt")  # writes root/corpus.txt
    tok.save(root / "tokenizer")
    from lmforge.data.prepare import prepare

    prepare([root / "corpus.txt"], root / "tokenizer", root / "shards", val_fraction=0.1, progress=False)
    checkpoint.save(th.body("gpt", tok), root / "model", tokenizer=tok)
    th.write_sentiment(root / "train.tsv", 8)
    th.write_sentiment(root / "dev.tsv", 4, seed=1)
    th.write_conll(root / "tags.conll", 6)
    (root / "docs.txt").write_text("good film\nbad plot\nthe movie was great\n", encoding="utf-8")
    align_helpers.write_jsonl(root / "pairs.jsonl", align_helpers.pair_rows(4))

    from lmforge.peft import PeftConfig, apply_peft

    apply_peft(checkpoint.load(root / "model"), PeftConfig(method="lora", r=2)).save_adapter(root / "adapter")
    steps = ["--max-steps", "1", "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1",
             "--save-every", "1", *COMMON]
    builds = [
        ["finetune", "--model", root / "model", "--task", "classify", "--train", root / "train.tsv", "--out",
         root / "taskrun", *STEP],
        ["quantize", "--model", root / "model", "--to", "int8", "--out", root / "quantized"],
        ["pretrain", "--model", "gpt-tiny", "--objective", "clm", "--data", root / "shards", "--out", root / "run",
         *steps, *TINY],
        ["pretrain", "--model", "elmo-tiny", "--objective", "bilm", "--data", root / "shards", "--out",
         root / "bilmrun", *steps, "--override", "d_embed=16", "--override", "d_hidden=16", "--override", "n_layers=1"],
        ["finetune", "--baseline", "tfidf-logreg", "--task", "classify", "--train", root / "train.tsv", "--out",
         root / "baseline"],
    ]
    for argv in builds:
        assert _run(argv) == 0, argv

    # A one-cell grid; its cell runs in this process (the runner's child process is the same code, seconds slower).
    import lmforge.experiments.backends as backends
    from lmforge.experiments.cell import run_task

    grid = experiment_helpers.write_grid(root, experiment_helpers.grid_text(
        root / "shards", [{"name": "lr", "variants": [{"name": "low", "lr": 1e-3}]}], seeds=(0,), steps=1,
        settings={"model": "gpt-tiny", "objective": "clm", "data": str(root / "shards"),
                  "overrides": dict(experiment_helpers.TINY), "seq_len": 16, "batch_size": 2, "eval_every": 1,
                  "eval_batches": 1, "save_every": 1, "precision": "fp32", "device": "cpu"}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "run_cell_process", lambda run, threads: (run_task(run), 0)[1])
        assert _run(["experiment", "run", grid, "--out", root / "experiment"]) == 0

    # A quickstart stopped after its first stage: what `lmforge quickstart` leaves on Ctrl-C.
    from lmforge.quickstart.folder import RunFolder

    quick = RunFolder(root / "quickstart")
    quick.root.mkdir()
    quick.start({"minutes": 1.0, "device": "cpu"})
    quick.finish("data", {"summary": "the bundled corpora"})

    folders = {"model": root / "model", "task": root / "taskrun" / "model", "adapter": root / "adapter",
               "quantized": root / "quantized", "run": root / "run", "bilm": root / "bilmrun" / "model",
               "baseline": root / "baseline" / "model", "experiment": root / "experiment",
               "quickstart": root / "quickstart", "tokenizer": root / "tokenizer", "shards": root / "shards"}
    return root, folders


def _argv(command: str, root: Path, folder: Path, out: Path) -> list:
    """The command line of ``command`` with ``folder`` in its folder argument, stopped early where it is taken."""
    r = root
    return {
        "finetune": ["finetune", "--model", folder, "--task", "classify", "--train", r / "train.tsv", "--out", out, *STEP],
        "evaluate": ["evaluate", "--model", folder, "--data", r / "dev.tsv"],
        "predict": ["predict", "--model", folder, "--data", r / "dev.tsv", "--output", out / "p.jsonl"],
        "generate": ["generate", "--model", folder, "--prompt", "good", "--max-new-tokens", "2", "--no-stream"],
        "chat": ["chat", "--model", folder, "--max-new-tokens", "2"],
        "fill-mask": ["fill-mask", "--model", folder, "the [MASK] film"],
        "attention": ["attention", "--model", folder, "--out", out, "--max-tokens", "4", "good film"],
        "probe layers": ["probe", "layers", "--model", folder, "--train", r / "tags.conll", "--eval", r / "tags.conll",
                         "--out", out, "--max-iter", "5"],
        "probe cloze": ["probe", "cloze", "--model", folder],
        "probe bias": ["probe", "bias", "--model", folder, "--pairs", FIXTURES / "bias_pairs_illustrative.csv"],
        "neighbors": ["neighbors", "--model", folder, "--corpus", r / "corpus.txt", "--word", "good", "--static",
                      "ppmi", "--max-sentences", "40"],
        "embed": ["embed", "--model", folder, "--input", r / "docs.txt", "--output", out / "v.npy", "--quiet"],
        "index build": ["index", "build", "--model", folder, "--docs", r / "docs.txt", "--out", out, "--quiet"],
        "quantize": ["quantize", "--model", folder, "--to", "int8", "--out", out],
        "convert to-hf": ["convert", "to-hf", folder, out],
        "peft merge": ["peft", "merge", "--base", r / "model", "--adapter", folder, "--out", out],
        "peft info": ["peft", "info", folder],
        "peft export-hf": ["peft", "export-hf", "--base", r / "model", "--adapter", folder, "--out", out],
        "distill": ["distill", "--teacher", folder, "--student", "gpt-tiny", "--data", r / "shards", "--objective",
                    "clm", "--out", out, "--seq-len", "16", *STEP, *TINY],
        "align": ["align", "--method", "dpo", "--policy", folder, "--train", r / "pairs.jsonl", "--out", out, *STEP],
        "serve": ["serve", "--model", folder, "--port", "8123"],
        "cost": ["cost", folder],
        "checkpoint consolidate": ["checkpoint", "consolidate", folder, out],
        "checkpoint average": ["checkpoint", "average", folder, "--last", "1", "--out", out],
        "model info": ["model", "info", folder],
        "tokenizer encode": ["tokenizer", "encode", "--tokenizer", folder, "good film"],
        "pretrain --resume": ["pretrain", "--resume", "--out", folder, "--max-steps", "2"],
        "pretrain --model": ["pretrain", "--model", folder, "--objective", "clm", "--data", r / "shards", "--out", out,
                             "--seq-len", "16", *STEP],
        "experiment report": ["experiment", "report", folder],
        "benchmark": ["benchmark", "glue", "--model", folder, "--data-dir", FIXTURES / "benchmarks" / "glue", "--out",
                      out, "--tasks", "glue/sst2", "--max-length", "16", *STEP],
        "tasks evaluate": ["tasks", "evaluate", "rt-sentiment", "--model", folder],
    }[command]


# command -> (kinds it runs on, exit 0; kinds it takes but refuses for their content, one line). Every other kind is
# refused by its kind. The run folder's model is a decoder with an LM head, so the commands that read a run's model/
# behave on "run" as on "model".
CELLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "finetune": (("model", "task"), ("quantized",)),
    "evaluate": (("task", "baseline"), ("model", "quantized", "run")),  # a plain model: only generative tasks
    "predict": (("task", "baseline"), ("model", "quantized", "run")),
    "generate": (("model", "quantized", "run"), ("task",)),  # the classifier's body has no LM head
    "chat": (("model", "quantized", "run"), ()),  # no chat template: the plain default one, with a notice
    "fill-mask": (("model", "quantized", "run"), ()),
    "attention": (("model", "task", "quantized", "run"), ()),
    "probe layers": (("model", "task", "quantized", "bilm"), ()),
    "probe cloze": (("model", "task"), ("quantized",)),  # probes re-use the trainable loader: inference-only refused
    "probe bias": (("model",), ("task", "quantized")),
    "neighbors": (("model", "task", "quantized", "bilm"), ()),
    "embed": (("model", "task", "quantized", "bilm"), ()),
    "index build": (("model", "task", "quantized", "bilm"), ()),
    "quantize": (("model", "run"), ("task", "quantized")),
    "convert to-hf": (("model", "quantized"), ("task",)),  # a gpt2 body has no HF task class lmforge writes
    "peft merge": (("adapter",), ("task",)),  # a task folder merges only when finetune --peft wrote it
    "peft info": (("adapter",), ()),
    "peft export-hf": (("adapter",), ()),
    "distill": (("model", "quantized", "run"), ("task",)),  # a task teacher takes --train, not --data
    "align": (("model",), ("task",)),  # the classifier is no decoder LM
    "serve": (("model", "task", "quantized"), ()),
    "cost": (("run", "bilm", "experiment"), ("model", "task", "quantized", "baseline", "quickstart")),  # no price tag
    "checkpoint consolidate": (("run",), ()),
    "checkpoint average": (("run",), ()),
    "model info": (("model", "task", "quantized"), ()),
    "tokenizer encode": (("model", "task", "quantized", "bilm", "tokenizer"), ()),
    "pretrain --resume": (("run",), ()),
    "pretrain --model": (("model",), ("bilm", "quantized")),  # a biLM continues with --objective bilm only
    "experiment report": (("experiment",), ()),
    "benchmark": (("model", "task"), ()),
    "tasks evaluate": (("task", "baseline"), ("run",)),  # a run's model/ is no task folder
}
MATRIX = [(command, kind) for command in CELLS for kind in KIND_NAMES]
WRITES_INTO = ("pretrain --resume", "experiment report")  # their job is to write into the folder they are given


def _state(folder: Path) -> dict[str, tuple[int, int]]:
    """size and mtime of every file below ``folder``: what a command that writes nothing leaves alone."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_server(monkeypatch) -> None:
    """``serve`` up to its listening socket: the models load, then their scheduler threads are stopped again."""
    pytest.importorskip("fastapi", reason="serve needs the serve extra (fastapi, uvicorn)")
    import lmforge.serve.app as app
    import lmforge.serve.server as server

    def create_app(served, *args, **kwargs):
        for model in served.values():
            model.close()

    monkeypatch.setattr(app, "create_app", create_app)
    monkeypatch.setattr(server, "serve_forever", lambda *args, **kwargs: None)


@pytest.mark.parametrize("command, kind", MATRIX, ids=[f"{c}-{k}".replace(" ", "_") for c, k in MATRIX])
def test_a_command_does_its_job_or_refuses_the_folder_in_one_line(command, kind, kinds, tmp_path, capsys, monkeypatch):
    root, folders = kinds
    if command == "serve":
        _no_server(monkeypatch)
    folder = folders[kind]
    if command in WRITES_INTO:
        folder = shutil.copytree(folder, tmp_path / "copy" / kind)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # chat reads end-of-input and ends
    out = tmp_path / "out"
    before = _state(folder)
    capsys.readouterr()
    code = _run(_argv(command, root, folder, out))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    ok, content_errors = CELLS[command]
    if kind in ok:
        assert code == 0, err
        if command not in WRITES_INTO:
            assert _state(folder) == before  # reading a folder never changes it
        return
    # Notes such as "using RUN/model (its final model)" say which folder a run stands for; the error is one line.
    lines = [line for line in err.splitlines() if " using " not in line or ": error: " in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("lmforge "), err
    assert ": error: " in lines[0], err
    if kind not in content_errors:
        assert f" is {KINDS[kind].label}" in lines[0], lines[0]
    assert not out.exists(), f"{command} on {kind} wrote {out}"
    assert _state(folder) == before


# ------------------------------------------------------------------------------------ the classification itself
def test_every_kind_is_recognised_by_its_marker_files(kinds):
    root, folders = kinds
    assert {kind: folder_kind(folder) for kind, folder in folders.items()} == {k: k for k in folders}
    assert folder_kind(root / "bilmrun") == folder_kind(root / "baseline") == "run"  # their models are inside
    assert folder_kind(root / "run" / "checkpoints") == "checkpoint"
    assert folder_kind(root / "run" / "checkpoints" / "step-00000001") == "checkpoint"
    assert folder_kind(root / "nothing") == "missing" and folder_kind(root / "train.tsv") == "file"


def test_the_two_kinds_outside_the_matrix_are_recognised_too(kinds, tmp_path):
    root, folders = kinds
    assert main(["convert", "to-hf", str(folders["model"]), str(tmp_path / "hf")]) == 0
    assert main(["index", "build", "--model", str(folders["model"]), "--docs", str(root / "docs.txt"), "--out",
                 str(tmp_path / "index"), "--quiet"]) == 0
    assert folder_kind(tmp_path / "hf") == "hf" and folder_kind(tmp_path / "index") == "index"


def test_the_issue_s_example_reads_as_promised(kinds, capsys):
    """#63: an ELMo biLM run given to `generate` crashed with AttributeError; now one line says what it is."""
    root, _ = kinds
    assert main(["generate", "--model", str(root / "bilmrun"), "--prompt", "x", "--no-stream"]) == 2
    err = capsys.readouterr().err
    assert err == (f"lmforge generate: error: --model {root / 'bilmrun' / 'model'} is an ELMo biLM folder, which "
                   "`lmforge generate` does not take; use it with `lmforge probe`, `embed`, `neighbors`, "
                   "`index build` or `finetune --baseline bilstm --features elmo=DIR`\n")


def test_require_kind_passes_what_it_cannot_judge_and_names_unknown_kinds(tmp_path):
    assert require_kind("gpt-tiny", ("model",)) == "missing"  # a preset name: the loader knows it
    (tmp_path / "empty").mkdir()
    assert require_kind(tmp_path / "empty", ("model",)) == "unknown"  # the command's own check names what is missing
    with pytest.raises(ValueError, match="unknown folder kind"):
        require_kind(tmp_path, ("modle",))


def test_the_markers_are_the_writers_own_file_names():
    from lmforge import model_folder
    from lmforge.embeddings import index
    from lmforge.evaluation import baselines
    from lmforge.models import bilstm_lm, quantize
    from lmforge.peft import io as peft_io
    from lmforge.quickstart import folder as quick
    from lmforge.tasks import model as task_model
    from lmforge.training import state
    from lmforge.utils import runs

    experiment_report = importlib.import_module("lmforge.experiments.report")  # the package exports a function so named
    assert (fk.CONFIG, fk.WEIGHTS, fk.TOKENIZER) == (model_folder.CONFIG_FILE, model_folder.WEIGHTS_FILE,
                                                     model_folder.TOKENIZER_FILE)
    assert (fk.TASK, fk.TASK_HEAD) == (task_model.TASK_FILE, task_model.HEAD_FILE)
    assert fk.ADAPTER_CONFIG == peft_io.ADAPTER_CONFIG and fk.QUANTIZATION == quantize.QUANT_FILE
    assert (fk.BASELINE_WEIGHTS, fk.BASELINE_RUN) == (baselines.WEIGHTS_FILE, baselines.RUN_FILE)
    assert (fk.INDEX_META, fk.INDEX_EMBEDDINGS) == (index.META, index.EMBEDDINGS)
    assert (fk.TRAINER_STATE, fk.LATEST) == (state.STATE_FILE, state.LATEST_FILE)
    assert fk.EXPERIMENT == experiment_report.EXPERIMENT_FILE
    assert (fk.QUICKSTART_SETTINGS, fk.QUICKSTART_STAGES) == (quick.SETTINGS, quick.STAGES)
    assert fk.RUN_MODEL_DIRS == runs.RUN_MODEL_DIRS and fk.BILM_ARCH == bilstm_lm.ARCH


def test_each_hint_names_commands_that_take_the_kind():
    """The "use it with" of a kind lists commands that run on it in the matrix above."""
    for kind, commands in {"bilm": ("probe layers", "embed", "neighbors", "index build"),
                           "task": ("evaluate", "predict", "serve"), "adapter": ("peft info", "peft merge"),
                           "run": ("pretrain --resume", "cost", "checkpoint consolidate"),
                           "experiment": ("experiment report", "cost"), "baseline": ("evaluate", "predict"),
                           "tokenizer": ("tokenizer encode",)}.items():
        for command in commands:
            assert kind in CELLS[command][0], (kind, command)
            assert f"`{command.split()[0]}" in KINDS[kind].use or f"`lmforge {command.split()[0]}" in KINDS[kind].use, \
                (kind, command)
