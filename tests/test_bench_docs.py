"""docs/lab/performance.md and the README's performance table are generated from one ``lmforge bench --json``
record (docs/lab/bench.json) by benchmarks/performance_doc.py: they say the same as the record, and nothing else."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmarks package lives in the checkout root, beside src/
    sys.path.insert(0, str(ROOT))

from benchmarks import common, performance_doc  # noqa: E402
LAB = ROOT / "docs" / "lab"
RECORD = json.loads((LAB / "bench.json").read_text(encoding="utf-8"))
GPU = json.loads((LAB / "bench-gpu.json").read_text(encoding="utf-8"))


def test_the_committed_page_and_readme_table_are_what_the_committed_record_renders_to():
    assert (LAB / "performance.md").read_text(encoding="utf-8") == performance_doc.page(
        RECORD, RECORD.get("note"), GPU)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert performance_doc.readme_block(RECORD) in readme
    assert readme.count(performance_doc.START) == 1 and readme.count(performance_doc.END) == 1


def test_the_record_names_its_run_and_machine():
    assert RECORD["command"].startswith("lmforge bench") and "--json" in RECORD["command"]
    assert RECORD["date"] and RECORD["seconds"] > 0
    machine = RECORD["machine"]
    for key in ("cpu", "cores", "torch_threads", "torch", "transformers", "bf16_matmul_gflops_start",
                "bf16_matmul_gflops_end"):
        assert machine.get(key) is not None, key
    assert all(not entry.get("error") for entry in RECORD["benchmarks"].values())
    for run, names in performance_doc.added_runs(RECORD):  # a later run of some benchmarks names its own
        # `lmforge bench --json --only ...`, or the benchmark's own script with flags `lmforge bench` has no way to pass
        script = len(names) == 1 and run["command"].startswith(f"python benchmarks/{names[0]}.py")
        assert script or (run["command"].startswith("lmforge bench") and "--json" in run["command"]), names
        assert run["date"] and run["seconds"] > 0 and run["machine"].get("cpu"), names


def test_every_summary_row_is_on_the_page_once_and_the_readme_shows_the_stable_rows_of_one_machine():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (LAB / "performance.md").read_text(encoding="utf-8")
    shown = set(performance_doc.README_ROWS)
    assert len(shown) == 5
    for name, entry in RECORD["benchmarks"].items():
        for row in entry["rows"]:
            line = f"| {row['benchmark']} | {row['case']} | {row['lmforge']} | {row['reference']} |"
            assert readme.count(line) == int((name, row["case"]) in shown) and page.count(line) == 1, line
            if (name, row["case"]) in shown:  # the record's own run: the machine the README's caption names
                assert "run" not in entry and "unsteady" not in row["case"], name
    block = readme[readme.index(performance_doc.START):readme.index(performance_doc.END)]
    assert block.count("Measured by") == 1 and RECORD["machine"]["cpu"] in block and "Xeon" not in block
    assert "(docs/lab/performance.md)" in block


def _train_step(record: dict, **changes) -> dict:
    data = {**record["benchmarks"]["train_step"]["result"], **changes}
    return {**record, "benchmarks": {**record["benchmarks"], "train_step": {
        **record["benchmarks"]["train_step"], "result": data}}}


def test_no_published_mfu_is_above_100_percent_and_every_peak_is_the_recorded_one():
    performance_doc.check(RECORD, GPU)  # the committed records pass
    assert all(r[k] <= 1 for r in RECORD["benchmarks"]["train_step"]["result"]["results"]
               for k in ("lmforge_mfu", "hf_mfu"))
    # the figures as first published: over the peak measured before the steps, on a disturbed machine
    data = RECORD["benchmarks"]["train_step"]["result"]
    first = [{**r, "lmforge_mfu": r["lmforge_mfu"] * data["mfu_peak_gflops"] / data["peak_gflops"]}
             for r in data["results"]]
    with pytest.raises(SystemExit, match=r"^train_step row gpt compile: lmforge MFU 147\.0% is above 100%: "
                                         r"re-measure that table$"):
        performance_doc.check(_train_step(RECORD, results=first))
    with pytest.raises(SystemExit, match=r"^train_step: matmul peak 227 GFLOP/s is 46% away from the run's "
                                         r"recorded 416: re-measure that table$"):
        performance_doc.check(_train_step(RECORD, mfu_peak_gflops=data["peak_gflops"]))
    with pytest.raises(SystemExit, match="re-measure that table"):
        performance_doc.page(_train_step(RECORD, results=first))
    row = {**GPU["runs"]["train"]["result"]["rows"][0], "mfu_measured": 1.2}
    bad = {**GPU, "runs": {"train": {**GPU["runs"]["train"], "result": {
        **GPU["runs"]["train"]["result"], "rows": [row]}}}}
    with pytest.raises(SystemExit, match=r"^GPU train row train gpt2-124M / lmforge eager: mfu_measured 120\.0%"):
        performance_doc.check(RECORD, bad)


def test_rendering_replaces_only_the_marked_block(tmp_path):
    record_file, doc, readme = tmp_path / "bench.json", tmp_path / "performance.md", tmp_path / "README.md"
    record_file.write_text("a line the benchmarks printed\n" + json.dumps(RECORD) + "\n", encoding="utf-8")
    readme.write_text(f"# title\n\n{performance_doc.START}\nold table\n{performance_doc.END}\n\nmore\n",
                      encoding="utf-8")
    assert performance_doc.main([str(record_file), "--doc", str(doc), "--readme", str(readme),
                                 "--note", "Nothing else ran."]) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# title\n\n") and text.endswith("\n\nmore\n") and "old table" not in text
    assert "Nothing else ran." in doc.read_text(encoding="utf-8")
    assert json.loads(record_file.read_text(encoding="utf-8"))["note"] == "Nothing else ran."


def test_a_later_run_of_some_benchmarks_is_added_with_its_own_date_and_command(tmp_path):
    record_file, added_file = tmp_path / "bench.json", tmp_path / "new.json"
    doc, readme = tmp_path / "performance.md", tmp_path / "README.md"
    record_file.write_text(json.dumps(RECORD), encoding="utf-8")
    name = next(iter(RECORD["benchmarks"]))
    later = {"command": f"lmforge bench --json --only {name}", "date": "2030-01-02T03:04:05+00:00", "seconds": 60.0,
             "machine": {"cpu": "Later CPU", "cores": 2, "torch_threads": 2},
             "benchmarks": {name: RECORD["benchmarks"][name]}}
    added_file.write_text("a line the benchmark printed\n" + json.dumps(later) + "\n", encoding="utf-8")
    readme.write_text(f"{performance_doc.START}\n{performance_doc.END}\n", encoding="utf-8")
    assert performance_doc.main([str(record_file), "--add", str(added_file), "--doc", str(doc), "--readme",
                                 str(readme), "--note", "Busy machine."]) == 0
    merged = json.loads(record_file.read_text(encoding="utf-8"))
    assert merged["date"] == RECORD["date"] and merged.get("note") == RECORD.get("note")  # the record's own run
    run = merged["benchmarks"][name]["run"]
    assert (run["date"], run["note"], run["machine"]["cpu"]) == ("2030-01-02T03:04:05+00:00", "Busy machine.",
                                                                 "Later CPU")
    page = doc.read_text(encoding="utf-8")
    assert f"except {name}, measured by a later run (`lmforge bench --json --only {name}` on 2030-01-02" in page
    assert "Measured by a later run" in page and "Later CPU" in page and "Busy machine." in page
    assert "2030-01-02" not in readme.read_text(encoding="utf-8")  # the README's rows are the record's own run


def test_docstring_examples_of_the_shared_modules():
    for module in (common, performance_doc):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__


def test_bench_json_record_has_the_date_the_command_and_the_machine_before_and_after(tmp_path, capsys):
    from lmforge.cli.main import main

    folder = tmp_path / "benchmarks"
    folder.mkdir()
    result = {"benchmark": "generate", "results": [
        {"batch": 1, "new_tokens": 4, "hf_tok_s": 10.0, "lmforge_tok_s": 12.0, "ratio": 1.2, "identical": True}]}
    (folder / "generate.py").write_text(f"print({json.dumps(json.dumps(result))})\n", encoding="utf-8")
    # A stand-in for benchmarks/common.py: its machine record, with a peak that drops on the second call.
    (folder / "common.py").write_text(
        "import json, pathlib\n"
        "p = pathlib.Path(__file__).with_suffix('.calls'); n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        "print(json.dumps({'cpu': 'Test CPU', 'cores': 2, 'torch_threads': 2, 'load_average': 0.5 + n,\n"
        "                  'bf16_matmul_gflops': 400.0 if n == 0 else 200.0}))\n", encoding="utf-8")
    assert main(["bench", "--dir", str(folder), "--json", "--only", "generate", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["command"] == "lmforge bench --json --only generate" and record["date"][:2] == "20"
    machine = record["machine"]
    assert machine["cpu"] == "Test CPU" and machine["torch_threads"] == 2
    assert (machine["bf16_matmul_gflops_start"], machine["bf16_matmul_gflops_end"]) == (400.0, 200.0)
    assert (machine["load_average_start"], machine["load_average_end"]) == (0.5, 1.5)
    assert machine["steady"] is False and "bf16_matmul_gflops" not in machine
    assert record["benchmarks"]["generate"]["rows"][0]["ratio"] == 1.2


def test_the_gpu_records_name_their_commands_and_the_gpu_section_shows_them():
    page = performance_doc.page(RECORD, RECORD.get("note"), GPU)
    assert f"## GPU: {GPU['device']}" in page
    for run in GPU["runs"].values():
        assert run["command"].startswith(("python benchmarks/gpu.py", "python benchmarks/serve_load.py"))
        assert run["date"].startswith("20")
        assert f"`{run['command']}`" in page
    assert "## GPU" not in performance_doc.page(RECORD, RECORD.get("note"))  # no records: no section
