"""Where cells run: local child processes (``--workers N``) or Ray tasks (``--backend ray``).

Either way a cell runs as ``python -m lmforge.experiments.cell RUN`` in a process of its own (see
:mod:`lmforge.experiments.cell`), with its torch threads fixed, so the two backends run the same code and give the
same results. A Ray task only starts that process on the node Ray picked, with the cell's ``num_cpus`` and
``num_gpus`` reserved; the run folders must be on storage that every node sees (see docs/experiments.md).

Example:
    >>> threads_per_cell(workers=2, cores=16), threads_per_cell(workers=4, cores=2)
    (8, 1)
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

import lmforge
from lmforge.errors import UserInputError
from lmforge.experiments.cell import LOG_FILE

BACKENDS = ("local", "ray")
Done = Callable[[Path, int], None]  # (run folder, exit code of its process)


def available_cores() -> int:
    """The cores this process may use (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_cell(workers: int, cores: int | None = None) -> int:
    """Torch threads of each of ``workers`` cells running at once: the cores shared out, at least one."""
    return max(1, (cores or available_cores()) // workers)


def run_cell_process(run: str, threads: int) -> int:
    """Run the cell in the folder ``run`` in a child process with ``threads`` threads; its exit code. Output goes
    to ``run/cell.log``."""
    package_root = str(Path(lmforge.__file__).resolve().parents[1])  # the child imports the same lmforge
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with open(Path(run) / LOG_FILE, "ab") as log:
        return subprocess.run([sys.executable, "-m", "lmforge.experiments.cell", str(run)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode


def run_local(runs: list[Path], workers: int, threads: int, done: Done) -> None:
    """Run the cells in ``runs`` in ``workers`` processes at a time; ``done`` is called as each one ends."""
    # One thread per running cell waits on its process; the child's death signal is tied to that thread, which
    # lives until the pool closes, after every cell has ended.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_cell_process, str(run), threads): run for run in runs}
        for future in as_completed(futures):
            done(futures[future], future.result())


def run_ray(runs: list[tuple[Path, float, float, int]], address: str | None, done: Done) -> None:
    """Run the cells ``runs`` (run folder, num_cpus, num_gpus, torch threads) as Ray tasks reserving those
    resources, on the cluster at ``address`` (None: the one this process is connected to, else a new local one)."""
    try:
        import ray
    except ImportError:
        raise UserInputError("--backend ray: ray is not installed; pip install 'lmforge[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(max_retries=0)(run_cell_process)
    pending = {task.options(num_cpus=cpus, num_gpus=gpus).remote(str(run), threads): run
               for run, cpus, gpus, threads in runs}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            done(pending.pop(ref), ray.get(ref))
