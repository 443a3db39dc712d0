"""Tiny configs for fast model tests."""

from __future__ import annotations

from pathlib import Path

from lmforge.config import ModelConfig
from lmforge.nn import attention


def tiny_config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=97, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64, dropout=0.0,
        relative_k=3, t5_num_buckets=8, t5_max_distance=16, position_buckets=8, max_relative_positions=16,
        pad_token_id=0, decoder_start_token_id=0,
    )
    base.update(overrides)
    return ModelConfig(**base)


def count_causal_halves(monkeypatch) -> list:
    """Record each call of ``Attention._causal_in_halves`` (which still runs): one entry per call."""
    calls, original = [], attention.Attention._causal_in_halves

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(attention.Attention, "_causal_in_halves", counted)
    return calls


def command_args(command: list[str], options: dict, overrides: dict | None = None) -> list[str]:
    """``command`` followed by ``--key value`` for each option (underscores as dashes) and ``--override k=v`` for
    each model override: a test's CLI call built from a settings dict."""
    args = list(command)
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    for key, value in (overrides or {}).items():
        args += ["--override", f"{key}={value}"]
    return args


def rank_pid(launchers: set[int], rank: int) -> int | None:
    """The pid of the worker process running ``rank`` that one of the torchrun processes ``launchers`` started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid in launchers and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None
