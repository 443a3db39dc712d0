"""docs/performance.md and the README's performance table are generated from one ``lmforge bench --json`` record
(docs/bench.json) by benchmarks/performance_doc.py: they say the same as the record, and nothing else."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmarks package lives in the checkout root, beside src/
    sys.path.insert(0, str(ROOT))

from benchmarks import common, performance_doc  # noqa: E402
RECORD = json.loads((ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))


def test_the_committed_page_and_readme_table_are_what_the_committed_record_renders_to():
    assert (ROOT / "docs" / "performance.md").read_text(encoding="utf-8") == performance_doc.page(
        RECORD, RECORD.get("note"))
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
    for name, run in performance_doc.separate_runs(RECORD):  # merged from runs of their own: named as fully
        assert run["command"].startswith("lmforge bench") and f"--only {name}" in run["command"], name
        assert run["date"] and run["seconds"] > 0 and run["machine"].get("cpu") and run.get("note"), name


def test_every_summary_row_appears_in_the_readme_once():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for entry in RECORD["benchmarks"].values():
        for row in entry["rows"]:
            line = f"| {row['benchmark']} | {row['case']} | {row['lmforge']} | {row['reference']} |"
            assert readme.count(line) == 1, line


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


def test_a_benchmark_measured_on_its_own_joins_the_record_with_its_run(tmp_path):
    entry = {k: v for k, v in RECORD["benchmarks"]["verify_cost"].items() if k != "run"}
    new = {"quick": False, "command": "lmforge bench --json --only verify_cost", "date": "2030-01-02T03:04:05+00:00",
           "seconds": 60.0, "machine": {"cpu": "Other CPU", "cores": 2, "torch_threads": 1, "load_average_start": 3.0,
                                        "load_average_end": 4.0}, "benchmarks": {"verify_cost": entry}}
    merged = performance_doc.merge(RECORD, new, "A test suite ran beside it.")
    assert (merged["command"], merged["date"]) == (RECORD["command"], RECORD["date"])
    assert merged["benchmarks"]["verify_cost"]["run"]["machine"]["cpu"] == "Other CPU"
    page = performance_doc.page(merged, merged.get("note"))
    assert "verify_cost" in page.split("except those of ", 1)[1].split(", whose sections name", 1)[0]
    assert ("Measured in a run of its own: `lmforge bench --json --only verify_cost` on 2030-01-02T03:04:05+00:00 "
            "(1.0 minutes) on Other CPU, 2 cores, 1 torch threads; 1-minute load average 3.0 at the start, 4.0 at the "
            "end. A test suite ran beside it.") in page
    block = performance_doc.readme_block(merged)
    assert "verify_cost by `lmforge bench --json --only verify_cost` on 2030-01-02" in block
    # through the command line, into files
    record_file, new_file = tmp_path / "bench.json", tmp_path / "new.json"
    record_file.write_text(json.dumps(RECORD), encoding="utf-8")
    new_file.write_text("lmforge bench: verify_cost.py\n" + json.dumps(new) + "\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(f"{performance_doc.START}\n{performance_doc.END}\n", encoding="utf-8")
    assert performance_doc.main([str(record_file), "--merge", str(new_file), "--note", "A test suite ran beside it.",
                                 "--doc", str(tmp_path / "performance.md"), "--readme", str(readme)]) == 0
    assert json.loads(record_file.read_text(encoding="utf-8")) == merged


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
