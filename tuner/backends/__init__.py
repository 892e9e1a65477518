"""Backends measure configs: on a GPU, or replayed from recordings. ``get_backend`` picks one."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .. import UsageError
from ..paths import home
from .base import FAIL_REASONS, Backend, DeviceInfo, Measurement

BACKENDS = ("auto", "gpu", "replay")

__all__ = ["BACKENDS", "FAIL_REASONS", "Backend", "DeviceInfo", "Measurement", "default_recordings",
           "get_backend", "gpu_count", "gpu_visible", "synthetic_recording"]


def gpu_count() -> int | None:
    """How many CUDA devices the runtime sees, or None when it cannot tell (no cupy, no driver)."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency, only on GPU hosts

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # any failure (no cupy, no driver) means: cannot count
        return None


def gpu_visible() -> bool:
    """True when cupy imports and the CUDA runtime sees at least one device."""
    return bool(gpu_count())


def synthetic_recording() -> Path:
    """The synthetic recording made by ``tests/data/make_synthetic.py``: modelled figures, not measurements."""
    return home() / "tests" / "data" / "synthetic_measurements.json"


def default_recordings() -> list[Path]:
    """Every recording kept under ``studies/``."""
    return sorted((home() / "studies").glob("*.measurements.json"))


def get_backend(name: str = "auto", replay_files: Sequence[str | Path] | None = None,
                announce: Callable[[str], None] = print, plant: dict[int, str] | None = None,
                deadline_s: float = 60.0, graphs: bool = False) -> Backend:
    """The backend called ``name`` (auto, gpu or replay).

    ``auto`` measures on the GPU when one is visible and replays recordings otherwise. The GPU
    backend runs in a worker process (see :mod:`tuner.backends.worker`); ``plant`` maps a trial
    number to a fault planted in that trial's kernels, for testing the isolation; with ``graphs``
    it times every config as CUDA graph replays. A replay answers as its recording was timed.
    Without ``replay_files`` the replay backend reads every ``studies/*.measurements.json``,
    or, when there is none, the synthetic recording, announced as such.
    """
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; accepted: {', '.join(BACKENDS)}")
    if name == "gpu" or (name == "auto" and not replay_files and gpu_visible()):
        if not gpu_visible():
            raise UsageError("no CUDA device visible for --backend gpu (cupy finds none); "
                             "accepted without a GPU: --backend replay")
        try:
            from .gpu import GpuBackend  # noqa: PLC0415,F401 - needs cupy, imported only when asked for
        except ImportError as exc:
            raise UsageError(f"the GPU backend cannot load ({exc}); install it with pip install -e '.[gpu]'") from None
        from .worker import WorkerBackend  # noqa: PLC0415

        return WorkerBackend("tuner.backends.gpu:GpuBackend", kwargs={"graphs": True} if graphs else None,
                             plant=plant, deadline_s=deadline_s)

    from .replay import ReplayBackend  # noqa: PLC0415

    if replay_files:
        return ReplayBackend(list(replay_files))
    files = default_recordings()
    note = ""
    if not files:
        files = [synthetic_recording()]
        note = " (no recording in studies/ yet)"
    if name == "auto":
        # One short line: the files are many, and the first thing a newcomer reads.
        shown = _shown(files[0]) if len(files) == 1 else f"{len(files)} recordings in {_shown(files[0].parent)}/"
        announce(f"no CUDA device visible: replaying recorded measurements from {shown}{note} "
                 "(--replay-file F to choose)")
    return ReplayBackend(files)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(home()))
    except ValueError:
        return str(path)
