"""A CPU run is billed the CPU seconds it used, not the wall time: a training on one thread, pinned to one core
that a busy-looping process shares, takes about twice its CPU time in wall time, and its price tag's device
seconds are its CPU seconds (checked against the process's own getrusage over the run), not the wall seconds.

Ratios only: on a loaded host the wall time grows further, which leaves every assertion true."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import json, os, resource, subprocess, sys, time
    core = int(sys.argv[2])
    os.sched_setaffinity(0, {core})
    import torch
    torch.set_num_threads(1)
    import lmforge
    from lmforge.objectives import build_objective
    from lmforge.training import TrainConfig, Trainer

    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=2, d_model=64, n_heads=2, d_ff=256, vocab_size=200)
    steps = 100
    data = [torch.randint(0, 200, (8, 65)) for _ in range(steps)]
    cfg = TrainConfig(max_steps=steps, lr=1e-3, eval_every=0, save_every=0, final_checkpoint="none",
                      progress=False, tensorboard=False, precision="fp32")
    trainer = Trainer(model, build_objective("clm", pad_token_id=0), data, cfg, out=sys.argv[1])
    # the burner shares the one core: the scheduler gives each about half of it
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    time.sleep(0.3)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, wall = usage.ru_utime + usage.ru_stime, time.monotonic()
    try:
        trainer.fit()
    finally:
        burner.kill()
        burner.wait()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime - before, "wall": time.monotonic() - wall}))
""")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_billed_time_is_cpu_time_under_a_burner_on_the_same_core(tmp_path):
    core = min(os.sched_getaffinity(0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "run"), str(core)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    tag = json.loads((tmp_path / "run" / "price_tag.json").read_text())
    assert tag["cpu_threads"] == 1 and tag["device_time"].startswith("cpu: process CPU seconds")
    # the tag's span is the training loop, inside fit(): its CPU seconds are never more than fit's, and most of
    # them (fit's own start and end, the model's save among them, took up to 40% of 40 steps' CPU on a loaded host)
    assert 0.5 * ref["cpu"] <= tag["cpu_s"] <= ref["cpu"] + 0.01
    assert tag["device_s"] == pytest.approx(tag["cpu_s"], rel=1e-3)  # one thread: device-seconds are CPU seconds
    # the burner had the core about half the time: the wall time is well above what is billed
    assert tag["wall_s"] > 1.5 * tag["device_s"]
    assert ref["wall"] > 1.5 * ref["cpu"]
