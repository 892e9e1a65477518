"""Shared test setup: the ``gpu`` marker skips itself without a CUDA device; common fixtures."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Callable

import pytest
import sqlalchemy as sa

from tuner.backends import gpu_visible
from tuner.storage.database import driver_url

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


@pytest.fixture
def postgres() -> str:
    """A fresh, empty database on the test PostgreSQL server: ``.ci/run`` starts one on loopback and
    passes its URL in ``TUNER_TEST_POSTGRES``; elsewhere the tests that need it are skipped, unless
    ``TUNER_REQUIRE_POSTGRES`` is set, which makes a missing server a failure."""
    base = os.environ.get("TUNER_TEST_POSTGRES")
    if not base:
        if os.environ.get("TUNER_REQUIRE_POSTGRES"):
            pytest.fail("TUNER_REQUIRE_POSTGRES is set but TUNER_TEST_POSTGRES names no server")
        pytest.skip("no PostgreSQL server (set TUNER_TEST_POSTGRES to a database URL; .ci/run starts one)")
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(driver_url(base), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    yield base.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.dispose()
