"""Shared test setup: the ``gpu`` marker skips itself without a CUDA device; common fixtures."""
from __future__ import annotations

from pathlib import Path

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


@pytest.fixture
def storage(tmp_path: Path) -> str:
    """A fresh SQLite storage URL in the test's own folder."""
    return f"sqlite:///{tmp_path / 'tuner.db'}"
