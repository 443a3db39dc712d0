"""pytest setup shared by everything `make test` collects: tests/ and the docstring examples in src/lmforge."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

DEVICE_ENV = "LMFORGE_TEST_DEVICE"


def pytest_addoption(parser):
    parser.addoption(
        "--device", default=None, choices=("cpu", "cuda"),
        help=f"where device-relevant tests (those taking the `device` fixture, marked `device`) run; "
             f"default: ${DEVICE_ENV}, else cpu. Select only them with -m device.")


def pytest_configure(config):
    config.addinivalue_line("markers", "device: runs on the device chosen by --device (the `device` fixture)")
    config.addinivalue_line("markers", "cuda_only: meaningful on a GPU only; skipped on the CPU")


def _test_device(config) -> str:
    return config.getoption("--device") or os.environ.get(DEVICE_ENV) or "cpu"


def pytest_collection_modifyitems(config, items):
    """Every test that takes the `device` fixture is marked `device`, so ``-m device`` selects the suite's
    device-relevant part; asking for CUDA on a machine without one fails the run at once instead of testing
    the CPU twice."""
    device = _test_device(config)
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device here")
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)
        if item.get_closest_marker("cuda_only") and device != "cuda":
            item.add_marker(pytest.mark.skip(reason="CUDA only: run with --device cuda on a GPU machine"))


@pytest.fixture(scope="session")
def device(request) -> str:
    """The torch device of device-relevant tests: "cpu" (``make test``) or "cuda" (``pytest --device cuda``)."""
    return _test_device(request.config)


# Compiled decoding packages its layer in a background process for later processes (lmforge.generation.compiled):
# under tests those would outlive the test that started them. The test of packaging turns it on for itself.
os.environ.setdefault("LMFORGE_COMPILE_PACKAGE", "off")


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


@pytest.fixture(autouse=True)
def _doctest_in_its_own_folder(request, monkeypatch):
    """Docstring examples make their folders with ``tempfile.mkdtemp()``, as a user would. Under pytest those
    folders, and anything written to a relative path, land in the example's own ``tmp_path``, which pytest
    prunes, so a run leaves nothing in /tmp or in the working directory.

    Only ``mkdtemp`` moves, not ``tempfile.tempdir``: torch.compile keeps its kernel cache under the
    temporary folder, and examples that compile should keep reusing it."""
    if type(request.node).__name__ != "DoctestItem":
        yield
        return
    folder = str(request.getfixturevalue("tmp_path"))
    make = tempfile.mkdtemp

    def mkdtemp(suffix=None, prefix=None, dir=None):
        return make(suffix, prefix, folder if dir is None else dir)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.chdir(folder)
    yield


@pytest.fixture(autouse=True, scope="session")
def _compile_cache_in_a_temporary_folder(tmp_path_factory):
    """Compiled decoding keeps a persistent cache (``LMFORGE_COMPILE_CACHE``, by default under the user's home);
    a test run keeps its own in pytest's temporary folder, for every test and every process it starts."""
    if "LMFORGE_COMPILE_CACHE" in os.environ:
        yield
        return
    os.environ["LMFORGE_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compile-cache"))
    yield
    os.environ.pop("LMFORGE_COMPILE_CACHE", None)
