"""benchmarks/serve_load.py's --quick path runs at toy sizes and ends with its JSON line (what it measures is
not checked: seconds on a shared machine say nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[1]


def test_serve_load_quick_path_runs_and_reports_every_load():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_load.py"), "--quick", "--requests", "2",
                          "--new-tokens", "3", "--concurrency", "1", "2", "--threads", "1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = result["models"]["gpt-tiny"]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["tok_s"] > 0 and r["requests"] == 2 for r in rows)
    assert result["models"]["gpt-tiny"]["speedup_vs_one_at_a_time"] > 0
