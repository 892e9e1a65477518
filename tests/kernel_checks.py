"""What the kernel tests share: rendered chains compiled with NVRTC, and configs verified on a GPU."""
from __future__ import annotations

from typing import Sequence

import pytest


def compile_errors(rendered: Sequence, cache_dir) -> list[str]:
    """Each rendered source compiled for sm_90; what failed, a line each (skips where NVRTC is absent)."""
    from tuner.codegen import compile as tc

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:  # pragma: no cover - the CI install has NVRTC
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    out = []
    mods = tc.compile_many([(r.hash, r.source) for r in rendered], tc.target_arch("sm_90"), cache_dir=cache_dir)
    for r, (_, mod) in zip(rendered, mods):
        if isinstance(mod, tc.CompileError):
            out.append(str(mod)[:2000])
        elif not set(r.kernels) <= set(mod.kernels):
            out.append(f"kernels {sorted(set(r.kernels) - set(mod.kernels))} missing from the module")
    return out


def gpu_failures(pairs: Sequence) -> list[str]:
    """Each ``(chain, config)`` measured on the GPU, verified first; what failed, a line each."""
    from tuner.backends.gpu import GpuBackend

    backend = GpuBackend(warmup=1, reps=3)
    try:
        list(backend.prepare(list(pairs)))
        return [f"{chain.workload} {cfg.short()}: {m.reason}: {m.message}" for chain, cfg in pairs
                if not (m := backend.measure(chain, cfg)).ok]
    finally:
        backend.close()
