"""Tiny model folders, and a live ``lmforge serve`` on a free loopback port (a subprocess, or uvicorn in a thread),
for the serve tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import embedding_helpers as eh

import lmforge
from lmforge.prompting.instruct import ChatTemplate

SRC = Path(__file__).resolve().parents[1] / "src"


def gpt_folder(root: Path, max_seq_len: int = 256, **overrides) -> Path:
    """A random gpt-tiny (1 layer, d_model 32 unless overridden) with a byte-BPE tokenizer and a chat template."""
    root.mkdir(parents=True, exist_ok=True)
    tok = eh.tokenizer(root, "gpt")
    settings = {"n_layers": 1, "max_seq_len": max_seq_len, **overrides}
    folder = lmforge.save(eh.model(tok, "gpt", **settings), root / "gpt", tokenizer=tok)
    ChatTemplate().save(folder)
    return folder


def encoder_folder(root: Path) -> Path:
    """A random bert-tiny sentence encoder folder, as ``lmforge embed --model`` takes."""
    root.mkdir(parents=True, exist_ok=True)
    return eh.model_folder(root, "bert")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


class ThreadServer:
    """``lmforge serve``'s app on uvicorn in a thread of this process (no process start-up to wait for)."""

    def __init__(self, models: dict[str, Path], **limits):
        import uvicorn

        from lmforge.serve.app import create_app
        from lmforge.serve.limits import Limits
        from lmforge.serve.served import load_served

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        lim = Limits(**limits)
        self.served = {name: load_served(name, folder, lim) for name, folder in models.items()}
        config = uvicorn.Config(create_app(self.served, lim), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        for m in self.served.values():
            m.close()


class Server:
    """``lmforge serve ARGS`` on a free port; ``url`` once /health answers."""

    def __init__(self, *args: str, extra_env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", "serve", "--port", str(self.port),
                                      *args], env={**env(), **(extra_env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmforge serve exited: {self.proc.stdout.read()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("lmforge serve did not start in 90 s")

    def metric(self, name: str) -> float:
        """The sum of a metric's samples in /metrics."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stdout.read() if self.proc.stdout else ""
