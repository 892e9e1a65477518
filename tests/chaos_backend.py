"""A CPU-only backend for robustness tests: each measurement follows a script.

Its times are **synthetic**: a made-up function of the config, not a measurement of
anything. What it is for is failing on cue, the way a GPU trial can fail: crash the
process, raise a sticky CUDA error, hang past any deadline, or return a wrong answer.
It is meant to run inside :class:`tuner.backends.worker.WorkerBackend`, as
``WorkerBackend("chaos_backend:ChaosBackend", kwargs={...})``, whose child process it
takes down when told to.

The script maps the n-th measurement (1-based) to a behaviour. A crash restarts the
child, so the count is kept in a file (``counter``) when the script must outlive one.
A fault planted by the worker (``WorkerBackend(plant=...)``, ``--plant-fault``) names a
GPU fault from ``tuner.codegen.render.FAULTS``; it is played as the GPU would fail on it.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from tuner.backends.base import Backend, DeviceInfo, Measurement
from tuner.chain.workloads import Chain
from tuner.config import Config

DEVICE_NAME = "chaos test backend (synthetic times, not a device)"

# ok: a synthetic time. exit, abort: the process dies. sticky: a CUDA error raised out of
# measure(). sticky_reply: the launch failure the GPU backend returns after catching one,
# which leaves the context unusable. hang: never answers. spin_timeout: a semaphore wait hit
# its in-kernel bound. incorrect: verification found a wrong result.
BEHAVIOURS = ("ok", "exit", "abort", "sticky", "sticky_reply", "hang", "spin_timeout", "incorrect")

# A planted GPU fault, played as the GPU backend would report it.
FAULT_BEHAVIOUR = {"illegal_address": "sticky_reply", "hang": "hang", "missing_post": "spin_timeout"}

ILLEGAL_ADDRESS = "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"


class CUDADriverError(RuntimeError):
    """Looks like the error cupy raises for a failed driver call."""


def synthetic_us(config: Config) -> float:
    """A made-up, deterministic chain time for ``config``, in microseconds: not a measurement."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).digest()
    return 20.0 + int.from_bytes(digest[:4], "little") % 5000 / 100


class ChaosBackend(Backend):
    """Answers with synthetic times, or fails on the calls its script names."""

    name = "chaos"
    replayed = False
    synthetic = True

    def __init__(self, script: dict[int, str] | None = None, counter: str | None = None):
        self.script = dict(script or {})
        unknown = set(self.script.values()) - set(BEHAVIOURS)
        if unknown:
            raise ValueError(f"unknown behaviours {sorted(unknown)}; accepted: {', '.join(BEHAVIOURS)}")
        self.counter = Path(counter) if counter else None
        self.calls = 0
        self.poisoned = False

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(name=DEVICE_NAME, toolkit="none")

    def _next_call(self) -> int:
        if self.counter is None:
            self.calls += 1
            return self.calls
        n = int(self.counter.read_text()) + 1 if self.counter.exists() else 1
        self.counter.write_text(str(n))
        return n

    def measure(self, chain: Chain, config: Config, fault: str = "none") -> Measurement:
        n = self._next_call()
        behaviour = FAULT_BEHAVIOUR[fault] if fault != "none" else self.script.get(n, "ok")
        tag = f"call {n} (chaos backend)"
        source = hashlib.sha256(f"{chain.label}|{config.short()}".encode()).hexdigest()
        if self.poisoned:
            # A real context stays broken after a sticky error: only a fresh process recovers.
            return Measurement.failed("launch", f"{ILLEGAL_ADDRESS} (context poisoned earlier), {tag}")
        if behaviour == "exit":
            os._exit(1)
        if behaviour == "abort":
            import resource  # noqa: PLC0415 - POSIX only, and only needed here

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind by the test
            os.abort()
        if behaviour == "sticky":
            raise CUDADriverError(f"{ILLEGAL_ADDRESS}, {tag}")
        if behaviour == "sticky_reply":
            self.poisoned = True
            return Measurement.failed("launch", f"{ILLEGAL_ADDRESS}, {tag}", source_hash=source)
        if behaviour == "hang":
            time.sleep(10**6)
        if behaviour == "spin_timeout":
            return Measurement.failed("timeout", f"a semaphore wait timed out (bounded spin), {tag}",
                                      source_hash=source)
        if behaviour == "incorrect":
            return Measurement.failed("incorrect", f"relative error 0.5 (limit 0.01), {tag}", source_hash=source)
        t = synthetic_us(config)
        # The trial records its resources: the process and call that answered show whether a
        # fresh worker took over after a fault.
        return Measurement(ok=True, median_us=t, times_us=[t, t, t], source_hash=source,
                           resources={"pid": os.getpid(), "call": n})


class RoundsBackend(ChaosBackend):
    """Also times final rounds, synthetically: each config's time plus the sustained load it was
    asked for (``heat_s`` seconds become as many µs), so a test sees what crossed the process boundary."""

    features = frozenset({"time_rounds"})

    def time_rounds(self, chain: Chain, configs: list[Config], rounds: int, heat_s: float = 0.0) -> dict:
        return {c: [synthetic_us(c) + heat_s] * rounds for c in configs}
