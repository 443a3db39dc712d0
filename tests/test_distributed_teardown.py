"""Leaving a gloo process group must not deadlock.

A gloo worker thread frees a finished collective's tensors after the caller has moved on, and freeing a tensor
made in Python takes the GIL; the group's destructor joins those threads while holding the GIL. Without
``teardown``'s drain, a finished torchrun job hung at exit (CI, on a loaded host). The race is narrow, so the
script widens it: a long switch interval keeps the GIL with the main thread until it blocks, and the group is
opened and left many times. Before the fix this script hung in 4 of 8 runs (40 rounds each).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from lmforge.training import distributed

    torch.set_num_threads(1)
    sys.setswitchinterval(1.0)  # the GIL changes hands only when its holder blocks: the worker waits longest
    for i in range(40):
        with distributed.session("ddp", "cpu"):  # a group of one on a free local port
            model = DistributedDataParallel(torch.nn.Linear(8, 8))  # its reducer holds the group too
            model(torch.randn(2, 8)).sum().backward()
            out = [torch.zeros(1, dtype=torch.int64)]
            dist.all_gather(out, torch.tensor([i]))  # a collective whose tensors were made in Python
            dist.barrier()
        model = None  # the group's last holder: its destructor joins gloo's worker threads here
    print("left", i + 1)
""")


def test_leaving_a_gloo_group_right_after_collectives_does_not_hang(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(SCRIPT)
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("leaving a gloo group hung (the destructor and a gloo worker waited for each other)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["left", "40"]
