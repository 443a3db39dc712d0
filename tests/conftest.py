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


@pytest.fixture
def shared_data() -> Path:
    path = SHARED / "data"
    if not path.is_dir():
        pytest.fail(f"{path} is missing: tests expect ../shared beside the checkout")
    return path
