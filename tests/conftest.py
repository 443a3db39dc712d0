"""Fixtures for tests/: where test data lives (seeding and thread count are set in ../conftest.py).

Tests read data shipped in the package (``lmforge.datasets``) or small files under ``tests/fixtures``, so a
fresh clone needs nothing beside it. WNUT-16 is not redistributed: the tests that need it read the folder
named by ``LMFORGE_WNUT16_DIR``, else ``../shared/data/ner`` beside the checkout (as in CI), and skip otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# CI keeps the project's shared data beside the checkout; a fresh clone has none and must not need it.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WNUT16_ENV = "LMFORGE_WNUT16_DIR"
WNUT16_FILES = ("wnut16_train.conll", "wnut16_dev.conll", "wnut16_test.conll")


@pytest.fixture
def gpt2_dir() -> Path:
    """OpenAI's GPT-2 byte-level BPE files (encoder.json, vocab.bpe; MIT, see tests/fixtures/README.md)."""
    return FIXTURES / "gpt2"


@pytest.fixture
def wnut16_dir() -> Path:
    """A folder holding wnut16_{train,dev,test}.conll; the test skips when there is none."""
    given = os.environ.get(WNUT16_ENV)
    folder = Path(given) if given else SHARED_DATA / "ner"
    if not all((folder / name).is_file() for name in WNUT16_FILES):
        if given:  # a folder the user named but that lacks the files is a mistake, not an absent data set
            pytest.fail(f"{WNUT16_ENV}={given} does not hold {', '.join(WNUT16_FILES)}")
        pytest.skip(f"WNUT-16 is not redistributed with lmforge: set {WNUT16_ENV} to a folder holding "
                    f"{', '.join(WNUT16_FILES)}")
    return folder
