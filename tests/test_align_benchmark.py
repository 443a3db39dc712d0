"""benchmarks/alignment_sentiment.py runs its real ``--quick`` path (a toy policy and reward trained on the
shipped rt-sentiment, then PPO, make-pairs + DPO, GRPO and the arithmetic GRPO) and ends with its JSON line.
Seconds: this checks that the pipeline runs, not what it measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_alignment_benchmark_runs_every_method(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "alignment_sentiment.py"), "--quick", "--out",
                          str(tmp_path), "--pretrain-steps", "4", "--reward-steps", "4", "--steps", "2",
                          "--arithmetic"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "alignment_sentiment"
    for stage in ("before", "ppo", "dpo", "grpo"):
        for strategy in ("greedy", "sample"):
            numbers = result[stage][strategy]
            assert 0 <= numbers["reward"] <= 1 and numbers["ppl_ref"] > 1 and len(numbers["samples"]) == 3
    assert result["before"]["sample"]["kl"] == 0  # the reference against itself
    assert result["pairs"]["pairs"] > 0 and 0 <= result["arithmetic"]["accuracy_after"] <= 1
    assert {"train_ppo", "train_dpo", "train_grpo", "make_pairs"} <= set(result["cpu_seconds"])
