"""Shared test fixtures: deterministic torch, fp32, tiny configs, and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test model is tiny: one intra-op thread is fastest, and with two, OpenMP workers spin-wait
    at barriers whenever another process holds a core (a 2 ms forward then takes a second)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def shared_data() -> Path:
    path = SHARED / "data"
    if not path.is_dir():
        pytest.fail(f"{path} is missing: tests expect ../shared beside the checkout")
    return path
