"""The documentation's measured tables (docs/lab/experiments/): each one's grid is unchanged since it was measured,
or a re-run note says why the change leaves its numbers standing; and the checker fails when a grid's settings
change. Nothing here runs a grid: the one regeneration below runs a stand-in for the runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from lmforge.errors import UserInputError
from lmforge.experiments import docs_tables
from lmforge.experiments.docs_tables import (MANIFEST, TABLES_DIR, check_tables, fingerprint, prepare_commands,
                                             prepare_data, read_manifest, regenerate)
from lmforge.experiments.runner import ExperimentRun

ROOT = Path(__file__).resolve().parents[1]
POSITIONS = ROOT / "experiments" / "positions.yaml"


def test_shipped_tables_are_current():
    """The gate: a grid changed without a re-run (or a note) fails here, naming the grid and the command."""
    assert check_tables(ROOT) == []


def test_every_manifest_table_exists_and_holds_a_report_table():
    entries = read_manifest(ROOT / TABLES_DIR / MANIFEST)
    assert entries, "the manifest lists no table"
    for entry in entries:
        assert (ROOT / entry["grid"]).is_file(), entry["grid"]
        text = (ROOT / TABLES_DIR / entry["table"]).read_text(encoding="utf-8")
        assert entry["table"] == docs_tables.table_name(entry["grid"], entry["size"])
        assert f"commit: `{entry['commit']}`" in text and f"`{entry['fingerprint'][:16]}`" in text
        assert "| cell |" in text and "Mean ± sample standard deviation over seeds" in text


def _repo(tmp_path: Path) -> Path:
    """A stand-in repository: positions.yaml and a manifest recording its fingerprint at size small."""
    (tmp_path / "experiments").mkdir(parents=True)
    shutil.copy(POSITIONS, tmp_path / "experiments" / "positions.yaml")
    (tmp_path / TABLES_DIR).mkdir(parents=True)
    (tmp_path / TABLES_DIR / "positions-small.md").write_text("| cell |\n", encoding="utf-8")
    docs_tables.write_manifest(tmp_path / TABLES_DIR / MANIFEST, [
        {"grid": "experiments/positions.yaml", "size": "small", "table": "positions-small.md",
         "fingerprint": fingerprint(tmp_path / "experiments" / "positions.yaml", "small"), "commit": "abc1234",
         "date": "2026-12-02", "rerun_notes": []}])
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_check_fails_when_a_grids_settings_change_and_a_rerun_note_accepts_it(tmp_path):
    root = _repo(tmp_path)
    grid = root / "experiments" / "positions.yaml"
    assert check_tables(root) == []
    _edit(grid, "  lr: 1.0e-3\n", "  lr: 3.0e-3\n")
    problems = check_tables(root)
    assert len(problems) == 1
    assert "experiments/positions.yaml (small): the grid changed since its table was measured at abc1234" in \
        problems[0]
    assert "make docs-tables GRIDS=experiments/positions.yaml SIZE=small" in problems[0]
    new = fingerprint(grid, "small")
    assert new[:12] in problems[0]
    manifest = root / TABLES_DIR / MANIFEST
    entries = read_manifest(manifest)
    entries[0]["rerun_notes"] = [{"fingerprint": new, "date": "2026-12-03", "note": "lr only moves the log"}]
    docs_tables.write_manifest(manifest, entries)
    assert check_tables(root) == []
    # a note for some other fingerprint accepts nothing
    entries[0]["rerun_notes"][0]["fingerprint"] = "0" * 64
    docs_tables.write_manifest(manifest, entries)
    assert len(check_tables(root)) == 1


def test_check_fails_on_a_changed_size_budget_or_seeds_and_on_a_missing_table(tmp_path):
    root = _repo(tmp_path)
    grid = root / "experiments" / "positions.yaml"
    _edit(grid, "    budget: {tokens: 500000}\n", "    budget: {tokens: 400000}\n")
    assert len(check_tables(root)) == 1
    _edit(grid, "    budget: {tokens: 400000}\n", "    budget: {tokens: 500000}\n")
    assert check_tables(root) == []
    _edit(grid, "    seeds: [0, 1, 2]\n", "    seeds: [0, 1]\n")
    assert len(check_tables(root)) == 1
    _edit(grid, "    seeds: [0, 1]\n", "    seeds: [0, 1, 2]\n")
    _edit(grid, "budget: {tokens: 20000000}", "budget: {tokens: 10000000}")  # the default size: not this table's
    assert check_tables(root) == []
    (root / TABLES_DIR / "positions-small.md").unlink()
    (problem,) = check_tables(root)
    assert "table" in problem and "positions-small.md is missing" in problem


def test_fingerprint_ignores_comments_description_claims_and_restated_defaults(tmp_path):
    base = fingerprint(POSITIONS, "small")
    copy = tmp_path / "positions.yaml"
    text = POSITIONS.read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    text = "# reworded header\n" + text.replace("# with Vaswani", "# after Vaswani")
    text = text.replace(f"description: {raw['description']}", "description: another wording")
    text += "claims:\n  - {text: relative beats learned, better: relative, than: learned, metric: eval_loss}\n"
    text = text.replace("  schedule: cosine\n", "  schedule: cosine\n  grad_accum: 1\n")  # TrainConfig's default
    copy.write_text(text, encoding="utf-8")
    assert fingerprint(copy, "small") == base
    # the copy lives elsewhere: the fingerprint holds no absolute path
    assert str(tmp_path) not in json.dumps(docs_tables.fingerprint_payload(docs_tables.measured_grid(copy, "small")))
    copy.write_text(text.replace("{name: rope, overrides: {position: rope}}",
                                 "{name: rotary, overrides: {position: rope}}"), encoding="utf-8")
    assert fingerprint(copy, "small") != base  # a renamed cell is another row of the table
    assert fingerprint(POSITIONS, None) != base


def test_a_malformed_rerun_note_is_one_line_naming_the_entry(tmp_path):
    root = _repo(tmp_path)
    manifest = root / TABLES_DIR / MANIFEST
    entries = read_manifest(manifest)
    entries[0]["rerun_notes"] = [{"fingerprint": "f" * 64, "date": "2026-12-03"}]
    docs_tables.write_manifest(manifest, entries)
    with pytest.raises(UserInputError, match=r"tables\[0\] \(experiments/positions.yaml\): rerun_notes\[0\]"):
        check_tables(root)


def test_the_grid_headers_preparation_commands_and_their_skip(tmp_path):
    from lmforge import datasets

    corpus = str(datasets.path("corpus"))
    assert prepare_commands(POSITIONS) == [
        ["lmforge", "tokenizer", "train", corpus, "--kind", "byte-bpe", "--family", "gpt", "--vocab-size", "4096",
         "--out", "data/tok-gpt"],
        ["lmforge", "data", "prepare", corpus, "--tokenizer", "data/tok-gpt", "--out", "data/austen-gpt"]]
    # lora_rank's header names a pip install and the run itself: nothing to prepare
    assert prepare_commands(ROOT / "experiments" / "lora_rank.yaml") == []
    (tmp_path / "data" / "tok-gpt").mkdir(parents=True)
    (tmp_path / "data" / "tok-gpt" / "tokenizer.json").write_text("{}")
    (tmp_path / "data" / "austen-gpt").mkdir()
    (tmp_path / "data" / "austen-gpt" / "manifest.json").write_text("{}")
    assert prepare_data(POSITIONS, tmp_path, log=lambda line: None) == 0


def test_regenerate_copies_the_report_table_and_records_the_manifest(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    grid = root / "experiments" / "positions.yaml"
    monkeypatch.setattr(docs_tables, "prepare_data", lambda *a, **k: 0)
    table = "| cell | position | seeds ok | eval_loss |\n|---|---|---|---|\n| rope | rope | 3/3 | **5.4 ± 0.01** |\n"
    seen = {}

    def fake_run_grid(path, out, *, size, workers, threads, extend, log):
        seen.update(path=path, size=size, workers=workers, extend=extend)
        ran = not out.is_dir()  # a second call finds every run finished
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table, encoding="utf-8")
        (out / "results.jsonl").write_text("".join(json.dumps({"status": "ok", "seconds": 30.0, "threads": 1}) + "\n"
                                                   for _ in range(3)), encoding="utf-8")
        return ExperimentRun(out, 3 if ran else 0, 0, 0 if ran else 3, 0, [{"failed": []}])

    monkeypatch.setattr("lmforge.experiments.runner.run_grid", fake_run_grid)
    _edit(grid, "  lr: 1.0e-3\n", "  lr: 3.0e-3\n")
    assert len(check_tables(root)) == 1
    (entry,) = regenerate(["experiments/positions.yaml"], "small", tmp_path / "runs", root=root, workers=2,
                          command="lmforge experiment docs experiments/positions.yaml --size small", log=lambda l: None)
    assert seen == {"path": grid, "size": "small", "workers": 2, "extend": True}
    assert check_tables(root) == []  # the manifest now records the changed grid
    assert entry["fingerprint"] == fingerprint(grid, "small") and entry["rerun_notes"] == []
    note = (root / TABLES_DIR / "positions-small.md").read_text(encoding="utf-8")
    assert note.endswith(table + "\n") or note.endswith(table)
    assert "- command: `lmforge experiment docs experiments/positions.yaml --size small`" in note
    assert "3 runs, 3 ok" in note and "90 cell-seconds" in note
    log = docs_tables.invocations_file(tmp_path / "runs" / "positions" / "small")
    (first,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert first["ran"] == 3
    # resumed with nothing left to run: the header still gives the invocation that did the work
    regenerate(["experiments/positions.yaml"], "small", tmp_path / "runs", root=root, log=lambda l: None)
    assert len(log.read_text().splitlines()) == 1
    again = (root / TABLES_DIR / "positions-small.md").read_text(encoding="utf-8")
    assert again.split("- commit")[0] == note.split("- commit")[0]  # same command line, same date span


def test_regenerate_refuses_a_grid_outside_the_repository(tmp_path):
    root = _repo(tmp_path / "repo")
    with pytest.raises(UserInputError, match="not a grid under"):
        regenerate([str(POSITIONS)], "small", tmp_path / "runs", root=root, log=lambda line: None)


def test_the_command_checks_and_names_what_to_run(tmp_path, monkeypatch, capsys):
    from lmforge.cli.main import main

    root = _repo(tmp_path)
    monkeypatch.chdir(root)
    assert main(["experiment", "docs", "--check"]) == 0
    _edit(root / "experiments" / "positions.yaml", "  lr: 1.0e-3\n", "  lr: 3.0e-3\n")
    assert main(["experiment", "docs", "--check"]) == 1
    assert "positions.yaml (small): the grid changed" in capsys.readouterr().out
    docs_tables.write_manifest(root / TABLES_DIR / MANIFEST, [])
    assert main(["experiment", "docs", "--size", "small"]) == 2  # nothing listed, no GRID named: nothing run
    assert "no GRID given and no table in docs/lab/experiments/tables.json at --size small" in \
        capsys.readouterr().err
    (root / TABLES_DIR / MANIFEST).unlink()
    monkeypatch.chdir(root / "experiments")  # not the repository root: one line, not "every table is current"
    assert main(["experiment", "docs", "--check"]) == 2
    assert "tables.json: no such manifest; run from the repository root" in capsys.readouterr().err


def test_a_grid_with_a_failed_run_keeps_its_old_table(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    monkeypatch.setattr(docs_tables, "prepare_data", lambda *a, **k: 0)
    before = (root / TABLES_DIR / MANIFEST).read_text(), (root / TABLES_DIR / "positions-small.md").read_text()

    def failing_run_grid(path, out, **kwargs):
        out.mkdir(parents=True)
        return ExperimentRun(out, 2, 1, 0, 0, [{"failed": [(1, "RuntimeError: boom")]}])

    monkeypatch.setattr("lmforge.experiments.runner.run_grid", failing_run_grid)
    lines = []
    assert regenerate(["experiments/positions.yaml"], "small", tmp_path / "runs", root=root, log=lines.append) == []
    assert "1 run(s) failed, 0 interrupted" in lines[-1] and "not copied into the docs" in lines[-1]
    assert ((root / TABLES_DIR / MANIFEST).read_text(), (root / TABLES_DIR / "positions-small.md").read_text()) \
        == before
