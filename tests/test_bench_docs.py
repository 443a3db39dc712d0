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


def test_docstring_examples_of_the_shared_modules():
    for module in (common, performance_doc):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__
