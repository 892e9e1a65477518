"""One worker process per GPU on one study: ``python -m tuner study ... --gpus 0,1,2,3``.

Each worker is the same ``study`` command without ``--gpus``, run with ``CUDA_VISIBLE_DEVICES``
set to its GPU, so it sees that GPU alone. The workers share the study through its storage
(claims and trials, see :class:`tuner.storage.measurements.ClaimBoard`); the same command started on another
host with the same ``--storage`` URL joins them. Their output comes here, each line prefixed
with its GPU.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import IO, Sequence

from .. import UsageError


def strip_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--opt V`` or ``--opt=V``)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def check_gpus(gpus: Sequence[int], visible: int | None) -> None:
    """Refuse repeated GPUs and, where the GPUs can be counted, GPUs that do not exist."""
    repeated = sorted({g for g in gpus if list(gpus).count(g) > 1})
    if repeated:
        raise UsageError(f"--gpus {','.join(map(str, gpus))}: GPU {repeated[0]} is named twice; "
                         "accepted: distinct GPU indices")
    if visible is not None:
        missing = [g for g in gpus if g >= visible]
        if missing:
            raise UsageError(f"--gpus: no GPU {missing[0]}; accepted: indices 0 to {visible - 1} "
                             f"({visible} GPU{'s' if visible != 1 else ''} visible)")


def _forward(stream: IO[str], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            out.write(prefix + line)
            out.flush()


def run_workers(argv: Sequence[str], gpus: Sequence[int]) -> int:
    """Run ``python -m tuner argv`` once per GPU, at the same time; the first nonzero exit status
    of a worker, else 0. Ctrl-C reaches every worker, which each stop cleanly."""
    lock = threading.Lock()
    procs: list[tuple[int, subprocess.Popen[str]]] = []
    threads: list[threading.Thread] = []
    base = os.environ.copy()
    try:
        for g in gpus:
            env = {**base, "CUDA_VISIBLE_DEVICES": str(g), "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen([sys.executable, "-m", "tuner", *argv], env=env, text=True, bufsize=1,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append((g, proc))
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=_forward, args=(stream, f"[gpu {g}] ", out, lock), daemon=True)
                t.start()
                threads.append(t)
        print(f"workers: {len(procs)} started (GPUs {', '.join(str(g) for g, _ in procs)}), pids "
              f"{', '.join(str(p.pid) for _, p in procs)}", flush=True)
        codes = [p.wait() for _, p in procs]
    except KeyboardInterrupt:
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        codes = [p.wait() for _, p in procs]
    for t in threads:
        t.join(timeout=5)
    bad = [(g, c) for (g, _), c in zip(procs, codes) if c != 0]
    for g, c in bad:
        print(f"workers: the worker on GPU {g} exited with status {c}", file=sys.stderr)
    print(f"workers: {len(procs) - len(bad)} of {len(procs)} exited 0", flush=True)
    if not bad:
        return 0
    code = bad[0][1]
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention
