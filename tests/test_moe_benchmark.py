"""benchmarks/moe_vs_dense.py runs its real --quick path (toy models, a few steps) in its own process and ends
with a JSON line holding both runs: this checks that the script runs, not what it measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_moe_vs_dense_quick_path_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_vs_dense.py"), "--quick", "--steps", "2",
                          "--work", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "moe_vs_dense"
    dense, moe = result["runs"]
    assert (dense["preset"], moe["preset"]) == ("gpt-tiny", "gpt-tiny-moe")
    # equal steps of equal batches at (almost) equal FLOPs per token: the MoE model adds only its routers
    assert dense["tokens"] == moe["tokens"] and 1 <= moe["flops_per_token"] / dense["flops_per_token"] < 1.01
    assert len(moe["moe_load"]) == 8 and "moe_load" not in dense
    assert result["moe_over_dense_tokens_per_s"] > 0 and moe["eval_curve"]
