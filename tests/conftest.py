"""Shared test setup: the ``gpu`` marker skips itself without a CUDA device; common fixtures."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from tuner.backends import gpu_visible

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "data" / "synthetic_measurements.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or gpu_visible():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: cupy is missing or sees no device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def synthetic_file() -> Path:
    """The synthetic recording (modelled figures, not measurements) made by tests/data/make_synthetic.py."""
    return SYNTHETIC


@pytest.fixture(scope="session")
def run_benchmark() -> Callable[..., subprocess.CompletedProcess]:
    """Runs ``benchmarks/NAME ARGS...`` from the repository root as a user would; returns the
    finished process, its output captured as text."""

    def run(name: str, *args: object, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, f"benchmarks/{name}", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def fast_dir(tmp_path_factory) -> Path:
    """A folder for the study databases, on tmpfs when there is one.

    Every Optuna write is an SQLite commit, which on a disk waits for fsync (about ten
    times the whole trial on some hosts). Nothing here depends on fsync: a process killed
    with SIGKILL loses nothing it handed to the kernel.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="tuner-tests-", dir=shm))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("fast")


@pytest.fixture
def storage(fast_dir: Path) -> str:
    """A fresh SQLite storage URL of the test's own, on tmpfs when there is one."""
    return f"sqlite:///{tempfile.mkdtemp(dir=fast_dir)}/tuner.db"
