"""`lmforge quickstart`: the budget split, the run folder's resume rules, the report, and one real end-to-end run.

The fast tests drive the runner with stand-in stages (each a few lines), so that skipping, Ctrl-C at any
stage, settings mismatches and the report are checked in milliseconds. The slow ones run the real stages once
with ``--minutes 1`` and then check what a user relies on: every stage in report.json with sane numbers,
an HTML page with embedded figures, a second run that only rebuilds the report, and a Ctrl-C inside a
training stage that the next run resumes from its checkpoint.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import signal
from html import unescape
from pathlib import Path

import pytest

from lmforge.cli.main import build_parser, main
from lmforge.quickstart import budget, html, report, run_quickstart
from lmforge.quickstart.folder import RunFolder, SettingsMismatch
from lmforge.quickstart.runner import finish
from lmforge.quickstart.stages import STAGES, Stage


# ------------------------------------------------------------------------------------------- budget
def test_weights_cover_every_stage_and_sum_to_one():
    assert set(budget.WEIGHTS) == {s.name for s in STAGES} | {"report"}
    assert math.isclose(sum(budget.WEIGHTS.values()), 1.0)


def test_allot_splits_what_is_left_by_weight():
    now = [0.0]
    b = budget.Budget(100.0, {"a": 0.5, "b": 0.3, "c": 0.2}, clock=lambda: now[0])
    assert b.allot("a", ["a", "b", "c"]) == pytest.approx(50.0)
    now[0] = 70.0  # "a" overran by 20 s: "b" and "c" share the 30 s left, 3:2
    assert b.allot("b", ["b", "c"]) == pytest.approx(18.0)
    now[0] = 80.0  # "b" finished early: "c" gets everything left
    assert b.allot("c", ["c"]) == pytest.approx(20.0)
    now[0] = 120.0
    assert b.allot("c", ["c"]) == 0.0 and b.left == 0.0


def test_allot_counts_time_spent_by_earlier_invocations():
    b = budget.Budget(100.0, {"a": 0.5, "b": 0.5}, spent_before=60.0, clock=lambda: 0.0)
    assert b.allot("b", ["b"]) == pytest.approx(40.0)


def test_steps_for_and_scaled():
    assert budget.steps_for(10.0, 0.5) == 20
    assert budget.steps_for(10.0, 0.5, fixed=4.0) == 12
    assert budget.steps_for(1.0, 0.5, minimum=8) == 8  # a tiny budget still gets a complete run
    assert budget.steps_for(100.0, 0.5, maximum=30) == 30
    with pytest.raises(ValueError):
        budget.steps_for(10.0, 0.0)
    assert budget.scaled(1000, 10) == 1000 and budget.scaled(1000, 1, floor=200) == 200
    assert budget.scaled(1000, 5) == 500 and budget.scaled(1000, 30) == 1000


def test_threads_follow_the_free_cores(monkeypatch):
    import os

    import torch

    from lmforge.quickstart import runner

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    for busy, threads in ((0.0, 4), (1.0, 3), (3.0, 1), (9.0, 1)):
        monkeypatch.setattr(runner, "busy_cores", lambda busy=busy: busy)
        assert runner.choose_threads() == threads
    assert runner.choose_threads(2) == 2  # --threads wins


def test_busy_cores_counts_other_running_processes(monkeypatch):
    """/proc/stat's procs_running, less this process; median of the samples (a brief spike is ignored)."""
    import builtins
    import io

    from lmforge.quickstart import runner

    readings = iter([3, 1, 3, 3, 9])

    def fake_open(path, *args, **kwargs):
        assert path == "/proc/stat"
        return io.StringIO(f"cpu  1 2 3\nprocs_running {next(readings)}\nprocs_blocked 0\n")

    monkeypatch.setattr(builtins, "open", fake_open)
    assert runner.busy_cores(samples=5, interval=0.0) == 2.0
    if runner.os.path.exists("/proc/stat"):
        monkeypatch.undo()
        assert runner.busy_cores(samples=3, interval=0.0) >= 0.0


# ------------------------------------------------------------------------------------------- run folder
def test_folder_records_and_settings(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.start({"minutes": 3.0, "device": "cpu"})
    folder.start({"minutes": 3.0, "device": "cpu"})  # the same settings: fine
    folder.finish("a", {"summary": "x", "value": 1.5})
    assert folder.done("a") and not folder.done("b")
    assert folder.results() == {"a": {"summary": "x", "value": 1.5}}
    plan, saved = folder.plan("t", lambda: {"max_steps": 7})
    assert (plan, saved) == ({"max_steps": 7}, False)
    assert folder.plan("t", lambda: {"max_steps": 9}) == ({"max_steps": 7}, True)  # a resumed stage keeps its plan
    assert "t" not in folder.results()  # plans are not stage records
    with pytest.raises(SettingsMismatch, match="--minutes 3.0"):
        folder.start({"minutes": 1.0, "device": "cpu"})
    with pytest.raises(SettingsMismatch, match="--device cpu"):
        folder.start({"minutes": 3.0, "device": "cuda"})


def test_folder_refuses_foreign_folders(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    folder = RunFolder(tmp_path)
    with pytest.raises(SettingsMismatch, match="not a quickstart run folder"):
        folder.start({"minutes": 1.0, "device": "cpu"})
    with pytest.raises(SettingsMismatch, match="refusing to delete"):
        folder.restart()
    assert (tmp_path / "mine.txt").read_text() == "precious"


# ------------------------------------------------------------------------------------------- training stages
def _ctx(tmp_path):
    from lmforge.quickstart.context import Context

    folder = RunFolder(tmp_path / "run")
    folder.start({"minutes": 1.0, "device": "cpu"})
    return Context(folder, 1.0, "cpu", budget.Budget(60.0, clock=lambda: 0.0), progress=False)


def test_plan_run_plans_once_and_resumes_only_with_a_checkpoint(tmp_path):
    from lmforge.quickstart.probe import Probe
    from lmforge.quickstart.runs import plan_run

    ctx = _ctx(tmp_path)
    probes: list[int] = []

    def probe():
        probes.append(1)
        return Probe(0.5, 0)

    plan, resume = plan_run(ctx, "s", 10.1, probe, fixed=lambda per_step: 2.0, minimum=3)
    assert not resume and probes == [1] and plan["seconds_per_step"] == 0.5
    assert plan["max_steps"] == 16  # (10.1 s - the probe's moment - 2 s of other work) / 0.5 s per step
    (ctx.path("runs", "s")).mkdir(parents=True)
    (ctx.path("runs", "s", "stale.txt")).write_text("from an attempt that saved no checkpoint")
    plan_run(ctx, "s", 20.0, probe)  # a plan but no checkpoint: planned afresh, the partial run removed
    assert probes == [1, 1] and not ctx.path("runs", "s", "stale.txt").exists()
    ctx.path("runs", "s", "checkpoints", "step-00000002").mkdir(parents=True)
    saved = json.loads(ctx.folder.plan_file("s").read_text())
    plan, resume = plan_run(ctx, "s", 99.0, probe)  # a plan and a checkpoint: the same schedule, no probe
    assert resume and plan == saved and probes == [1, 1]


def test_curves_and_measured_speed_from_metrics(tmp_path):
    from lmforge.quickstart.runs import loss_drop, measured_step_seconds, read_curve, total_tokens, warmup_for

    # Three steps of 100 tokens, 1 s apart after the first: tokens_per_s is the running rate since logging began.
    rows = [{"step": 1, "loss": 9.0, "tokens": 100, "tokens_per_s": 100 / 2.0},
            {"step": 2, "loss": 8.0, "tokens": 100, "tokens_per_s": 200 / 3.0, "eval_loss": 8.5},
            {"step": 3, "loss": float("nan"), "tokens": 100, "tokens_per_s": 300 / 4.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = read_curve(tmp_path)
    assert curve == {"step": [1, 2], "loss": [9.0, 8.0], "eval_step": [2], "eval_loss": [8.5]}
    assert measured_step_seconds(tmp_path) == pytest.approx(1.0)
    assert total_tokens(tmp_path) == 300
    assert loss_drop(curve, window=1) == (9.0, 8.0)
    assert [warmup_for(n) for n in (1, 2, 10, 100)] == [0, 1, 1, 10]


# ------------------------------------------------------------------------------------------- runner
FAKE = ["alpha", "beta", "gamma"]


def _fake_stages(calls: list[str], fail_at: str | None = None) -> list[Stage]:
    def make(name: str):
        def run(ctx, seconds):
            calls.append(name)
            assert seconds >= 0
            if name == fail_at:
                raise KeyboardInterrupt
            return {"summary": f"{name} ok", "value": len(calls)}
        return run

    return [Stage(name, f"stage {name}", make(name)) for name in FAKE]


def test_runner_skips_finished_stages(tmp_path, capsys):
    calls: list[str] = []
    result = run_quickstart(tmp_path / "run", 1, "cpu", progress=False, stages=_fake_stages(calls))
    assert calls == FAKE
    assert result["complete"] and [r["stage"] for r in result["summary"]] == calls
    assert "report:" in capsys.readouterr().out
    again: list[str] = []
    result = run_quickstart(tmp_path / "run", 1, "cpu", progress=False, stages=_fake_stages(again))
    assert again == [] and result["complete"]
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "report.json").is_file()


def test_interrupted_stage_leaves_the_folder_consistent(tmp_path):
    calls: list[str] = []
    second = FAKE[1]
    with pytest.raises(KeyboardInterrupt):
        run_quickstart(tmp_path / "run", 1, "cpu", progress=False, stages=_fake_stages(calls, fail_at=second))
    folder = RunFolder(tmp_path / "run")
    assert folder.done(FAKE[0]) and not folder.done(second)
    assert not (tmp_path / "run" / "report.json").exists()
    calls.clear()
    result = run_quickstart(tmp_path / "run", 1, "cpu", progress=False, stages=_fake_stages(calls))
    assert calls == FAKE[1:] and result["complete"]


def test_cli_refuses_other_minutes_and_restarts(tmp_path, capsys, monkeypatch):
    from lmforge.quickstart import runner

    calls: list[str] = []
    monkeypatch.setattr(runner, "STAGES", tuple(_fake_stages(calls)))
    assert main(["quickstart", "--out", str(tmp_path / "run"), "--minutes", "1", "--no-progress"]) == 0
    assert main(["quickstart", "--out", str(tmp_path / "run"), "--minutes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--minutes 1.0" in err and "--restart" in err
    calls.clear()
    assert main(["quickstart", "--out", str(tmp_path / "run"), "--minutes", "2", "--restart", "--no-progress"]) == 0
    assert len(calls) == 3 and RunFolder(tmp_path / "run").settings()["minutes"] == 2.0
    assert main(["quickstart", "--out", str(tmp_path / "run"), "--minutes", "0"]) == 2


def test_quickstart_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["quickstart", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--out", "--minutes", "--device", "--restart"):
        assert flag in out


# ------------------------------------------------------------------------------------------- report
def test_report_table_and_html_from_records(tmp_path):
    folder = RunFolder(tmp_path)
    folder.start({"minutes": 1.0, "device": "cpu"})
    curve = {"step": [1, 2, 3], "loss": [9.0, 8.0, 7.5], "eval_step": [3], "eval_loss": [7.8]}
    folder.finish("pretrain-gpt", {"model": "gpt-tiny", "objective": "clm", "parameters": 10, "steps": 3, "tokens": 30,
                                   "first_loss": 9.0, "last_loss": 7.5, "eval_loss": 7.8, "eval_ppl": 2440.6,
                                   "plan": {"seconds_per_step": 0.1}, "curve": curve, "summary": "loss 9 -> 7.5",
                                   "seconds": 2.0, "budget_seconds": 3.0})
    folder.finish("probing", {"skipped": "scikit-learn is not installed", "summary": "skipped", "seconds": 0.0})
    titles = {s.name: s.title for s in STAGES}
    tag = {"total_flops": 3e9, "total_tokens": 30, "wall_s": 2.0, "device_s": 1.8, "energy_kwh": 3.25e-5,
           "energy_method": "estimated: device-seconds x 65 W", "co2e_kg": 1.56e-5, "cost_usd": 2.5e-5}
    (tmp_path / "runs" / "pretrain-gpt" / "model").mkdir(parents=True)
    for where in ("runs/pretrain-gpt", "runs/pretrain-gpt/model"):  # the model folder's copy is not counted twice
        (tmp_path / where / "price_tag.json").write_text(json.dumps(tag))
    result = report.build(folder, titles)
    assert not result["complete"] and list(result["stages"]) == ["pretrain-gpt", "probing"]
    assert [r["run"] for r in result["price_tags"]["runs"]] == ["runs/pretrain-gpt"]
    text = report.table(result)
    assert "loss 9 -> 7.5" in text and "of a 1:00 budget" in text
    assert "3e+09 FLOPs, 0.0005 device-h, 3.25e-05 kWh (estimated), 0.0156 g CO2e, $2.5e-05 over 1 training" in text
    page = html.render(result)
    assert "<h2>Price tags</h2>" in page and "<td>runs/pretrain-gpt</td><td>3e+09</td>" in page.replace(
        ' class="num"', "")
    assert page.count("data:image/png;base64,") >= 2  # loss curves and timings
    assert "skipped: scikit-learn is not installed" in page
    path = report.write({**result, "x": float("nan")}, folder)
    assert json.loads(path.read_text())["x"] is None  # strict JSON: NaN becomes null


def test_report_shows_how_to_chat_with_the_decoder(tmp_path, capsys):
    folder = RunFolder(tmp_path)
    folder.start({"minutes": 1.0, "device": "cpu"})
    titles = {s.name: s.title for s in STAGES}
    folder.finish("probing", {"skipped": "scikit-learn is not installed", "summary": "skipped", "seconds": 0.0})
    assert "<h2>Chat with" not in html.render(report.build(folder, titles), figs={})  # no decoder: no section
    folder.finish("pretrain-gpt", {"model": "gpt-tiny", "objective": "clm", "parameters": 10, "steps": 3,
                                   "tokens": 30, "plan": {"seconds_per_step": 0.1}, "summary": "loss 9 -> 7.5",
                                   "model_dir": "runs/pretrain-gpt/model", "seconds": 2.0})
    page = html.write(report.build(folder, titles), tmp_path, figs={}).read_text(encoding="utf-8")
    model, root = tmp_path.resolve() / "runs" / "pretrain-gpt" / "model", tmp_path.resolve()
    assert "<h2>Chat with gpt-tiny</h2>" in page and "not instruction-tuned" in page and "default template" in page
    commands = re.findall(r"<pre>(lmforge [^<]*)</pre>", page)
    assert commands == [f"lmforge serve --model {model}", f"lmforge chat --model {model}",
                        f"lmforge finetune --task instruct --model {model} --train demo-instructions --out "
                        f"{root}-instruct",  # beside the run folder: inside, it would join its price tags
                        f"lmforge chat --model {root}-instruct/model"]
    assert '<a href="http://127.0.0.1:8000/">' in page
    for command in commands:  # each is a command line the CLI takes
        words = shlex.split(unescape(command))[1:]
        args = build_parser(words[0]).parse_args(words)
        assert str(args.model if isinstance(args.model, str) else args.model[0]).startswith(str(root))
    (tmp_path / "runs" / "pretrain-gpt" / "model").mkdir(parents=True)
    finish(folder, STAGES)  # the run's last lines name the chat command too
    assert f"chat with the decoder:\n  lmforge chat --model {model}\n" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, device) -> Path:
    """One real `lmforge quickstart --minutes 1` (the slow part of this file, shared by the tests below), on the
    test device (``pytest --device cuda`` runs it as ``--device cuda``)."""
    out = tmp_path_factory.mktemp("quickstart") / "run"
    assert main(["quickstart", "--out", str(out), "--minutes", "1", "--device", device, "--no-progress"]) == 0
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.mark.slow
def test_quickstart_one_minute_report(finished_run):
    data = json.loads((finished_run / "report.json").read_text())
    assert data["complete"] and list(data["stages"]) == [s.name for s in STAGES]
    # every training run's price tag, and their sum
    tags = data["price_tags"]
    assert {"runs/pretrain-gpt", "runs/pretrain-bert"} <= {r["run"] for r in tags["runs"]}
    assert tags["total"]["total_flops"] == sum(r["total_flops"] for r in tags["runs"]) > 0
    stages = data["stages"]
    for name in ("pretrain-gpt", "pretrain-bert", "pretrain-t5"):
        r = stages[name]
        assert r["steps"] >= 4 and all(_finite(v) for v in r["curve"]["loss"])
        assert r["last_loss"] < r["first_loss"], f"{name}: loss did not decrease"
        assert _finite(r["eval_loss"])
    # bert-tiny pre-trains on the reviews alone, with an output matrix of its own (a tied one degenerates) and
    # rotary positions (learned ones keep a minutes-long masked LM at the unigram level).
    bert = stages["pretrain-bert"]
    assert bert["corpus"] == "reviews" and bert["tied_embeddings"] is False and bert["position"] == "rope"
    assert stages["pretrain-gpt"]["corpus"] == "english"
    for name in ("finetune-bert", "finetune-bert-scratch", "finetune-bert-lora", "finetune-minilm"):
        r = stages[name]
        if r.get("skipped"):
            continue
        assert 0.0 <= r["test"]["accuracy"] <= 1.0 and r["test_examples"] > 0
    assert 0 < stages["finetune-bert-lora"]["trainable_percent"] < 10  # LoRA + head: a small share
    # the pre-training comparison: the same fine-tuning steps from pre-trained and from random weights
    assert stages["finetune-bert-scratch"]["steps"] == stages["finetune-bert"]["steps"]
    assert all(0.0 <= a <= 1.0 for a in stages["prompting"]["accuracy"].values())
    assert stages["translation"]["test"]["bleu"] >= 0 and len(stages["translation"]["examples"]) == 3
    assert all(0.0 <= s["recall@1"] <= 1.0 for s in stages["retrieval"]["encoders"].values())
    assert stages["retrieval"]["answers"] and len(stages["generation"]["samples"]) >= 3
    assert all(0.0 <= a <= 1.0 for acc in stages["probing"]["layers"].values() for a in acc)
    assert data["timings"]["total_seconds"] > 0 and data["versions"]["torch"]
    page = (finished_run / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 6 and "</html>" in page
    decoder = finished_run.resolve() / stages["pretrain-gpt"]["model_dir"]  # the folder the chat section names
    assert f"lmforge chat --model {decoder}</pre>" in page and (decoder / "tokenizer.json").is_file()
    assert not (decoder / "chat_template.json").exists()  # so the page is right: not instruction-tuned


@pytest.mark.slow
def test_rerun_after_completion_only_rebuilds_the_report(finished_run, capsys, device):
    stamps = {p.name: p.stat().st_mtime_ns for p in (finished_run / "stages").glob("*.json")}
    assert main(["quickstart", "--out", str(finished_run), "--minutes", "1", "--device", device, "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("done earlier, skipped") == len(STAGES)
    assert {p.name: p.stat().st_mtime_ns for p in (finished_run / "stages").glob("*.json")} == stamps
    assert "report:" in captured.out and "total" in captured.out


@pytest.mark.slow
def test_ctrl_c_in_a_training_stage_resumes_from_its_checkpoint(finished_run, tmp_path, monkeypatch, device):
    """SIGINT during translation fine-tuning: the Trainer checkpoints, nothing is recorded, a re-run resumes."""
    from lmforge.tasks.finetune import FinetuneTrainer

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "stages" / "translation.json").unlink()  # as if the run had got that far (the later stages stay done)
    (run / "report.json").unlink()
    original = FinetuneTrainer.train_step

    def interrupted(self):
        record = original(self)
        if self.step == 3 and self.out.parent.name == "runs":  # the run itself, not its throughput probe
            signal.raise_signal(signal.SIGINT)  # what Ctrl-C delivers
        return record

    monkeypatch.setattr(FinetuneTrainer, "train_step", interrupted)
    args = ["quickstart", "--out", str(run), "--minutes", "1", "--device", device, "--no-progress"]
    assert main(args) == 130
    folder = RunFolder(run)
    assert not folder.done("translation") and folder.plan_file("translation").is_file()
    assert (run / "runs" / "translation" / "checkpoints").is_dir() and not (run / "report.json").exists()
    monkeypatch.setattr(FinetuneTrainer, "train_step", original)
    assert main(args) == 0
    data = json.loads((run / "report.json").read_text())
    assert data["complete"]
    plan = json.loads(folder.plan_file("translation").read_text())
    assert data["stages"]["translation"]["steps"] == plan["max_steps"]  # the same schedule, carried on
    assert not (run / "runs" / "translation" / "checkpoints").exists()
