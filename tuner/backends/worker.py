"""Trial isolation: a backend that runs another backend in a child process.

The child owns the CUDA context and stays warm between trials. A sticky CUDA error or a
crash kills only the child: the trial is a ``launch`` failure and a fresh child starts for
the next one. A trial that does not answer by its deadline (a kernel that ignores the
in-kernel spin bound, say) gets the child killed and is a ``timeout`` failure.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Iterator, Sequence

from ..chain.workloads import Chain
from ..config import Config
from .base import Backend, DeviceInfo, Measurement

STICKY_MARKERS = ("illegal", "launch failure", "unspecified launch", "misaligned", "exception", "ECC")


def poisons(m: Measurement) -> bool:
    """Whether a failure leaves the CUDA context unusable, so the process that saw it must go."""
    return not m.ok and m.reason == "launch" and any(k in m.message for k in STICKY_MARKERS)


def _load(factory: str):
    mod, _, name = factory.partition(":")
    return getattr(importlib.import_module(mod), name)


def _serve(conn, factory: str, kwargs: dict[str, Any]) -> None:
    """Child process: build the backend, answer requests until told to stop or poisoned."""
    try:
        backend = _load(factory)(**kwargs)
        conn.send(("ready", backend.device_info()))
    except Exception as exc:  # the parent reports it; nothing else can be done here
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            backend.close()
            return
        if msg[0] == "rounds":
            _, chain, configs, rounds, heat_s = msg
            try:
                conn.send(("done", backend.time_rounds(chain, configs, rounds, heat_s=heat_s)))
            except Exception as exc:
                conn.send(("crash", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
                _exit_poisoned(conn)
            continue
        _, chain, config, fault, screen = msg
        kw = {"screen": True} if screen else {}
        try:
            m = backend.measure(chain, config, fault, **kw) if fault != "none" else backend.measure(chain, config, **kw)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            conn.send(("crash", text, traceback.format_exc()))
            _exit_poisoned(conn)
        conn.send(("done", m))
        if poisons(m):
            _exit_poisoned(conn)


def _exit_poisoned(conn) -> None:
    """Leave at once: with a poisoned context, every CuPy destructor would print a traceback."""
    conn.close()
    os._exit(3)


class WorkerBackend(Backend):
    """Runs ``factory`` (``"module:Class"``) in a child process with a per-trial deadline."""

    name = "worker"

    def __init__(self, factory: str = "tuner.backends.gpu:GpuBackend", kwargs: dict[str, Any] | None = None,
                 *, deadline_s: float = 60.0, start_timeout_s: float = 300.0, plant: dict[int, str] | None = None):
        self.factory, self.kwargs = factory, dict(kwargs or {})
        self.floor_s, self.start_timeout_s = deadline_s, start_timeout_s
        self.deadline_s = deadline_s
        # Testing hook: plant a fault (see tuner.codegen.render.FAULTS) in the N-th measured config (1-based).
        self.plant = dict(plant or {})
        self.calls = 0
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._device: DeviceInfo | None = None
        self.restarts = 0
        child = _load(factory)  # the class the child runs: what it is and offers, read once here
        self.replayed = bool(getattr(child, "replayed", False))
        self.name = getattr(child, "name", "worker")
        self.features = frozenset(getattr(child, "features", frozenset()))

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.factory, self.kwargs), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(self.start_timeout_s):
            self._kill()
            raise RuntimeError(f"backend worker did not start within {self.start_timeout_s:.0f}s")
        kind, payload = parent.recv()
        if kind != "ready":
            self._kill()
            raise RuntimeError(f"backend worker failed to start: {payload}")
        self._device = payload

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def device_info(self) -> DeviceInfo:
        if self._device is None:
            self._start()
        assert self._device is not None
        return self._device

    def set_reference_time(self, us: float, runs: int = 40) -> None:
        """Derive the per-trial deadline from the baseline's time: the floor plus 100 times the runs."""
        self.deadline_s = self.floor_s + 100 * runs * us * 1e-6

    @property
    def graphs(self) -> bool:  # type: ignore[override]
        """Whether the child times CUDA graph replays (its backend built with ``graphs=True``)."""
        return bool(self.kwargs.get("graphs", False))

    def prepare(self, targets: Sequence[tuple[Chain, Config]]) -> Iterator[int]:
        """Compile ahead here, on every core, into the cache the child loads from."""
        if not hasattr(_load(self.factory), "prepare") or self.plant:
            return iter(range(len(targets)))
        from .gpu import compile_ahead  # noqa: PLC0415

        return compile_ahead(targets, self.device_info().arch, self.kwargs.get("cache_dir"), device_epoch=self.graphs)

    def time_rounds(self, chain: Chain, configs: Sequence[Config], rounds: int,
                    heat_s: float = 0.0) -> dict[Config, list[float] | str]:
        """The child's interleaved final rounds (see GpuBackend.time_rounds, and its ``heat_s``); {} if
        it cannot answer."""
        if not self.supports("time_rounds"):
            return {}
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self._start()
        assert self._conn is not None
        try:
            self._conn.send(("rounds", chain, list(configs), rounds, heat_s))
            wait = self.deadline_s * (1 + len(configs)) + rounds * len(configs) * (2 + 1.5 * heat_s)
            reply = self._conn.recv() if self._conn.poll(wait) else None
        except (EOFError, OSError, BrokenPipeError):
            reply = None
        if reply is None or reply[0] != "done":
            self._kill()
            return {}
        return reply[1]

    def measure(self, chain: Chain, config: Config, fault: str = "none", screen: bool = False) -> Measurement:
        self.calls += 1
        fault = self.plant.get(self.calls, fault)
        if self._proc is None or not self._proc.is_alive():
            if self._device is not None:  # a child ran before: this one replaces it
                self.restarts += 1
            self._kill()
            self._start()
        assert self._conn is not None
        t0 = time.monotonic()
        try:
            self._conn.send(("measure", chain, config, fault, screen))
            ready = self._conn.poll(self.deadline_s)
            reply = self._conn.recv() if ready else None
        except (EOFError, OSError, BrokenPipeError):
            reply = ("died",)
        if reply is None:
            self._kill()
            return Measurement.failed("timeout", f"no answer within {self.deadline_s:.0f}s: worker killed, "
                                                 "the next trial gets a fresh one")
        if reply[0] == "done":
            if poisons(reply[1]):
                # The child exits by itself, but may still be alive when the next trial is sent,
                # which would then fail for nothing: retire it now.
                self._kill()
            return reply[1]
        if self._proc is not None:
            self._proc.join(5)  # the pipe closes before the child is reaped: wait for its exit code
        code = self._proc.exitcode if self._proc is not None else None
        self._kill()
        if reply[0] == "crash":
            return Measurement.failed("launch", reply[1][:500])
        return Measurement.failed("launch", f"worker died after {time.monotonic() - t0:.1f}s (exit code {code})")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
            if self._proc is not None:
                self._proc.join(10)
        self._kill()
