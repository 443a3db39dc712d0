"""A training job survives the death of one of its processes: two torchrun nodes (``--nnodes 2 --nproc-per-node 1``,
c10d rendezvous) of ``lmforge pretrain``, one rank killed with SIGKILL in the middle of the run.

* With ``--max-restarts 1`` torchrun restarts the job, which resumes from the newest complete checkpoint; its
  losses, learning rates and gradient norms equal an uninterrupted run's bit for bit (DDP, and FSDP2 with its DCP
  checkpoint, the rank killed in the middle of writing one).
* Without restarts the surviving rank prints one line and exits, well within the collective timeout
  (``--dist-timeout``), and no partial checkpoint is ever taken for one. A rank that hangs (SIGSTOP) instead of
  dying stops its peer at that timeout.

The two nodes are two network namespaces made by the test (a veth pair, 10.251.7.1/30 and .2, inside the
namespaces only), each running its own torchrun through ``ip netns exec``. Where namespaces cannot be made (not
root, no ``ip``), the two torchrun nodes run side by side on 127.0.0.1: only the network differs, every case runs.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lmforge.config import ConfigError
from lmforge.training import CheckpointManager, TrainConfig, distributed
from lmforge.training.state import verify_checkpoint
from helpers import rank_pid
from test_training_pretrain import data_root, pretrain_args, prepared  # noqa: F401

STEPS = 12
SAVE_EVERY = 3
TIMEOUT_S = 30  # --dist-timeout of the jobs that lose a rank
HANG_TIMEOUT_S = 12  # --dist-timeout of the job whose rank hangs: every wait is this long
JOB_S = 180  # bound on any one job, restarts included
COMPARED = ("step", "loss", "lr", "grad_norm", "tokens", "targets", "eval_loss")


# ---------------------------------------------------------------------------------- the two nodes
@dataclass
class Cluster:
    """Where the two torchrun nodes run: ``netns`` (a namespace each, joined by a veth pair) or ``loopback``."""

    mechanism: str
    addrs: tuple[str, str]
    ifnames: tuple[str, str]
    namespaces: tuple[str, str] | None = None
    launches: int = 0

    def command(self, node: int, port: int, max_restarts: int, logs: Path, program: list[str]) -> list[str]:
        """Node ``node``'s torchrun command line (node 0 hosts the rendezvous store); the ranks' own output goes
        to files under ``logs`` (``--redirects 3``), apart from torchrun's."""
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--log-dir", str(logs), "--redirects", "3",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.addrs[0]}:{port}", "--rdzv-id", f"job{port}",
               # c10d decides which agent hosts the store by its host name, which both nodes share here
               "--rdzv-conf", f"is_host={int(node == 0)},join_timeout=90", "--local-addr", self.addrs[node],
               "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", *program]
        return ["ip", "netns", "exec", self.namespaces[node], *run] if self.namespaces else run

    def port(self) -> int:
        self.launches += 1
        if self.namespaces:  # a fresh stack per namespace: any port is free
            return 29400 + self.launches
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def _remove_namespaces(names: tuple[str, str]) -> None:
    for name in names:  # deleting a namespace deletes its end of the veth pair, and so the pair
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=20)


def _namespaces(tag: str) -> Cluster | None:
    """Two namespaces joined by a veth pair, or None (and nothing left behind) where they cannot be made."""
    if shutil.which("ip") is None or os.geteuid() != 0 or os.environ.get("LMFORGE_TEST_LOOPBACK") == "1":
        return None  # (LMFORGE_TEST_LOOPBACK=1: try the fallback where namespaces would work)
    names, ifs = (f"lmf{tag}a", f"lmf{tag}b"), (f"lmf{tag}va", f"lmf{tag}vb")
    addrs = ("10.251.7.1", "10.251.7.2")
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1])
        for name, ifname, addr in zip(names, ifs, addrs):
            _ip("link", "set", ifname, "netns", name)
            _ip("-n", name, "addr", "add", f"{addr}/30", "dev", ifname)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "set", ifname, "up")
    except (OSError, subprocess.SubprocessError):
        _remove_namespaces(names)
        subprocess.run(["ip", "link", "delete", ifs[0]], capture_output=True, timeout=20)
        return None
    return Cluster("netns", addrs, ifs, names)


@pytest.fixture(scope="module")
def cluster():
    made = _namespaces(str(os.getpid() % 100000))
    try:
        yield made or Cluster("loopback", ("127.0.0.1", "127.0.0.1"), ("lo", "lo"))
    finally:
        if made is not None:
            _remove_namespaces(made.namespaces)


# ---------------------------------------------------------------------------------- jobs
class Job:
    """One two-node torchrun job of ``lmforge pretrain``; every process of it is killed by :meth:`close`."""

    def __init__(self, cluster: Cluster, args: list[str], logs: Path, max_restarts: int = 0) -> None:
        port = cluster.port()
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = [logs / f"node{n}.log" for n in (0, 1)]
        self.rank_logs = [logs / f"node{n}" for n in (0, 1)]
        self.started = time.monotonic()
        self.nodes: list[subprocess.Popen] = []
        for node in (0, 1):
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "GLOO_SOCKET_IFNAME": cluster.ifnames[node]}
            if max_restarts:  # a store per attempt (see lmforge.training.distributed._warn_shared_store)
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            with open(self.logs[node], "w") as log:
                self.nodes.append(subprocess.Popen(
                    cluster.command(node, port, max_restarts, self.rank_logs[node], ["-m", "lmforge.cli.main", *args]),
                    env=env,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def output(self, node: int) -> str:
        """What torchrun printed on ``node``."""
        return self.logs[node].read_text(errors="replace")

    def rank_output(self, node: int) -> str:
        """What the ranks of ``node`` printed (stdout, then stderr), every attempt in order."""
        files = sorted(self.rank_logs[node].glob("*/attempt_*/*/std*.log"),
                       key=lambda f: (f.parent.parent.name, f.parent.name, f.name != "stdout.log"))
        return "".join(f.read_text(errors="replace") for f in files)

    def outputs(self) -> str:
        return "\n".join(f"--- node {n}: torchrun ---\n{self.output(n)[-4000:]}\n--- node {n}: ranks ---\n"
                         f"{self.rank_output(n)[-4000:]}" for n in (0, 1))

    def worker(self, rank: int) -> int | None:
        """The pid of the worker process that runs ``rank`` (a child of one of the two torchrun agents)."""
        return rank_pid({p.pid for p in self.nodes}, rank)

    def wait_for(self, condition, what: str, timeout: float = JOB_S, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if any(p.poll() is not None for p in self.nodes):
                pytest.fail(f"the job ended before {what}:\n{self.outputs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n{self.outputs()}")
            time.sleep(poll)

    def finish(self, timeout: float = JOB_S) -> list[int]:
        """Both nodes' exit codes; fails the test if either still runs after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for p in self.nodes:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the job still ran after {timeout:.0f} s:\n{self.outputs()}")
        return [p.returncode for p in self.nodes]

    def close(self) -> None:
        for p in self.nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the agent and its workers: each node is its own session
                p.wait(timeout=30)
        for p in self.nodes:  # a worker left behind by an agent killed above
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_args(data: Path, out: Path, strategy: str, timeout: float = TIMEOUT_S) -> list[str]:
    """One command for every launch and relaunch: ``--resume`` continues the run wherever it stands."""
    return [*pretrain_args("clm", data, out, max_steps=STEPS, save_every=SAVE_EVERY, eval_every=4, strategy=strategy,
                           device="cpu", dist_timeout=timeout), "--resume", "--no-tensorboard"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def compared(out: Path) -> list[tuple]:
    return [tuple(r.get(k) for k in COMPARED) for r in records(out)]


def logged_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def latest(out: Path) -> str | None:
    path = out / "checkpoints" / "latest"
    return path.read_text().strip() if path.is_file() else None


@pytest.fixture(scope="module")
def data(data_root) -> Path:  # noqa: F811
    return prepared(data_root, "gpt")


@pytest.fixture(scope="module")
def reference(cluster, data, tmp_path_factory):
    """The uninterrupted two-node runs, one per strategy. Both start at once, beside the first test's job (the
    jobs spend much of their time waiting on one another, so they overlap well even on two cores)."""
    jobs, outs, checked = {}, {}, {}
    try:
        for strategy in ("ddp", "fsdp"):
            outs[strategy] = tmp_path_factory.mktemp(f"reference-{strategy}") / "run"
            jobs[strategy] = Job(cluster, run_args(data, outs[strategy], strategy), outs[strategy].parent / "logs")

        def get(strategy: str) -> Path:
            if strategy not in checked:
                job, out = jobs[strategy], outs[strategy]
                rcs = job.finish()
                assert rcs == [0, 0], job.outputs()
                assert [r["step"] for r in records(out)] == list(range(1, STEPS + 1))
                checked[strategy] = out
            return checked[strategy]

        yield get
    finally:
        for job in jobs.values():
            job.close()


def assert_checkpoints_sound(out: Path) -> tuple[Path, dict]:
    """Every visible checkpoint folder is complete, ``latest`` names the newest, and that is what a resume takes
    (no warning: no fallback past a damaged one). Returns the newest and its state."""
    manager = CheckpointManager(out / "checkpoints")
    steps = manager.steps()
    assert steps, "no checkpoint at all"
    for step in steps:
        verify_checkpoint(manager.path(step))  # raises on a missing or half-written file
    assert latest(out) == manager.path(steps[-1]).name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folder, state = manager.latest_valid()
    assert folder == manager.path(steps[-1]) and state["step"] == steps[-1]
    return folder, state


# ---------------------------------------------------------------------------------- restart: exact resume
def _killed_and_restarted(cluster: Cluster, data: Path, out: Path, strategy: str, victim: int,
                          mid_save: bool) -> tuple[Job, str, dict[int, str]]:
    """Run with ``--max-restarts 1``; SIGKILL rank ``victim`` after the first checkpoint (``mid_save``: while the
    next one is being written). Returns the finished job, the checkpoint newest at the kill and the metrics lines
    logged by then."""
    job = Job(cluster, run_args(data, out, strategy), out.parent / "logs", max_restarts=1)
    try:
        job.wait_for(lambda: latest(out) is not None and logged_steps(out) > SAVE_EVERY, "the first checkpoint")
        if mid_save:
            root = out / "checkpoints"
            job.wait_for(lambda: any(p.name.startswith(".step-") and p.name.endswith(".tmp")
                                     for p in root.iterdir()), "a checkpoint being written", poll=0.002)
        pid = job.worker(victim)
        assert pid is not None, f"rank {victim}'s worker not found"
        newest = latest(out)
        os.kill(pid, signal.SIGKILL)
        logged = {json.loads(line)["step"]: line for line in (out / "metrics.jsonl").read_text().splitlines()}
        rcs = job.finish()
    finally:
        job.close()
    assert rcs == [0, 0], job.outputs()
    return job, newest, logged


def _assert_exact_resume(out: Path, ref: Path, newest: str, logged: dict[int, str]) -> None:
    assert compared(out) == compared(ref)  # every step, bit for bit: the float values compare exactly
    lines = (out / "metrics.jsonl").read_text().splitlines()
    # The steps up to the checkpoint it resumed were not trained again: their lines (wall-clock fields included)
    # are the first attempt's. The later ones were: their lines were replaced. A checkpoint published while the
    # kill landed may be the one resumed, never an older one.
    kept = 0
    while kept < len(logged) and lines[kept] == logged[kept + 1]:
        kept += 1
    assert kept % SAVE_EVERY == 0 and kept >= int(newest.split("-")[1]), (kept, newest)
    assert all(lines[s - 1] != logged[s] for s in logged if s > kept)
    assert_checkpoints_sound(out)
    assert latest(out) == f"step-{STEPS:08d}" and (out / "model" / "model.safetensors").is_file()


def test_ddp_rank_killed_restarts_and_resumes_bit_for_bit(cluster, data, reference, tmp_path):
    out = tmp_path / "run"
    job, newest, logged = _killed_and_restarted(cluster, data, out, "ddp", victim=1, mid_save=False)
    _assert_exact_resume(out, reference("ddp"), newest, logged)
    assert "exitcode: -9" in job.output(0) + job.output(1), job.outputs()  # torchrun saw the kill, and restarted


def test_fsdp_rank_killed_while_writing_a_checkpoint_resumes_bit_for_bit(cluster, data, reference, tmp_path):
    # Rank 0 (the one that names, finishes and publishes the sharded checkpoint) dies mid-save: the half-written
    # folder is never published, and the relaunch resumes the checkpoint before it.
    out = tmp_path / "run"
    job, newest, logged = _killed_and_restarted(cluster, data, out, "fsdp", victim=0, mid_save=True)
    _assert_exact_resume(out, reference("fsdp"), newest, logged)
    assert (out / "checkpoints" / latest(out) / "dcp").is_dir()
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.endswith(".tmp")]  # cleaned on resume


# ---------------------------------------------------------------------------------- no restart
def _survivor(job: Job, node: int) -> list[str]:
    """The non-empty lines the surviving rank's process printed (it ran on ``node``)."""
    return [line for line in job.rank_output(node).splitlines() if line.strip()]


def _started(job: Job, out: Path) -> tuple[int, int]:
    """Wait for the run's first checkpoint and one more step; return the nodes of rank 0 and rank 1."""
    job.wait_for(lambda: latest(out) is not None and logged_steps(out) > SAVE_EVERY, "the first checkpoint")
    agents = [p.pid for p in job.nodes]
    nodes = []
    for rank in (0, 1):
        pid = job.worker(rank)
        assert pid is not None, f"rank {rank}'s worker not found"
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        nodes.append(agents.index(ppid))
    return nodes[0], nodes[1]


def test_without_restarts_the_survivor_exits_with_one_line(cluster, data, tmp_path):
    out = tmp_path / "run"
    job = Job(cluster, run_args(data, out, "ddp"), tmp_path / "logs")
    try:
        survivor, _ = _started(job, out)
        os.kill(job.worker(1), signal.SIGKILL)
        killed = time.monotonic()
        rcs = job.finish(timeout=TIMEOUT_S + 30)
        took = time.monotonic() - killed
    finally:
        job.close()
    assert all(rc != 0 for rc in rcs), job.outputs()
    assert took < TIMEOUT_S, (took, job.outputs())  # a closed connection is seen at once: no timeout is waited
    lines = _survivor(job, survivor)
    # One line says what happened, and it is the rank's last: no traceback, no second report.
    assert sum("lost contact" in line for line in lines) == 1, job.outputs()
    assert re.match(r"rank 0: lost contact with another rank \(.*(closed|reset) by peer", lines[-1], re.I), lines[-1]
    assert not any("Traceback" in line for line in lines), job.outputs()
    assert "exitcode  : -9" in job.output(1 - survivor)  # torchrun's summary names the killed rank
    _, state = assert_checkpoints_sound(out)
    assert state["step"] >= SAVE_EVERY


def test_a_hung_rank_stops_its_peer_at_the_collective_timeout(cluster, data, tmp_path):
    # SIGSTOP: the rank's sockets stay open and silent (as with a lost node), so only the timeout can end the wait.
    out = tmp_path / "run"
    job = Job(cluster, run_args(data, out, "ddp", timeout=HANG_TIMEOUT_S), tmp_path / "logs")
    hung = None
    try:
        survivor, _ = _started(job, out)
        hung = job.worker(1)
        os.kill(hung, signal.SIGSTOP)
        stopped = time.monotonic()
        job.wait_for(lambda: "lost contact" in job.rank_output(survivor) or time.monotonic() - stopped > JOB_S,
                     "the survivor's report", poll=0.1)
        said_after = time.monotonic() - stopped
        rc = job.nodes[survivor].wait(timeout=60)  # it leaves by itself; the hung rank's node stays up
    finally:
        if hung is not None:
            os.kill(hung, signal.SIGKILL)
        job.close()
    lines = _survivor(job, survivor)
    assert rc != 0 and sum("lost contact" in line for line in lines) == 1, job.outputs()
    assert re.match(r"rank 0: lost contact with another rank \(.*timed out", lines[-1], re.I), lines[-1]
    assert not any("Traceback" in line for line in lines), job.outputs()
    # It waited for the timeout (the peer never answered), and not much longer.
    assert HANG_TIMEOUT_S - 1 < said_after < HANG_TIMEOUT_S + 20, (said_after, job.outputs())
    assert_checkpoints_sound(out)


# ---------------------------------------------------------------------------------- the settings, in one process
def test_dist_timeout_bounds_the_collectives_of_the_group():
    assert TrainConfig.from_dict({"dist_timeout": 20}).dist_timeout == 20 and TrainConfig().dist_timeout is None
    with pytest.raises(ConfigError, match=r"run.yaml: dist_timeout=0.0 must be > 0 seconds"):
        TrainConfig.from_dict({"dist_timeout": 0}, source="run.yaml")
    with distributed.session("ddp", "cpu", timeout=7):  # a group of one
        backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == datetime.timedelta(seconds=7)


@pytest.mark.parametrize("shared, restarts, warned", [("True", "1", True), ("True", "0", False),
                                                      ("False", "1", False)])
def test_restarts_onto_a_shared_store_are_warned_about(monkeypatch, shared, restarts, warned):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", shared)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", restarts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distributed._warn_shared_store()
    assert [str(w.message) for w in caught if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in str(w.message)] != [] \
        if warned else not caught
