"""NVRTC on the CPU: cubins, ptxas resources, and the on-disk cache keyed by source hash."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

from tuner.codegen import compile as tc

try:
    tc.toolkit_version()
    HAVE_NVRTC = True
except tc.ToolchainMissing:
    HAVE_NVRTC = False
nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC is not installed (pip install -e '.[compile]')")

# One m16n8k16 tensor-core product per warp, fp16 in, fp32 out, in inline PTX (no headers).
MMA = r'''
extern "C" __global__ void mma_tile(const unsigned short* a, const unsigned short* b, float* d) {
  const unsigned lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const unsigned* a32 = reinterpret_cast<const unsigned*>(a);
  const unsigned* b32 = reinterpret_cast<const unsigned*>(b);
  const unsigned a0 = a32[g * 8 + q], a1 = a32[(g + 8) * 8 + q], a2 = a32[g * 8 + q + 4], a3 = a32[(g + 8) * 8 + q + 4];
  const unsigned b0 = b32[g * 8 + q], b1 = b32[g * 8 + q + 4];
  float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  d[g * 8 + q * 2] = c0;
  d[g * 8 + q * 2 + 1] = c1;
  d[(g + 8) * 8 + q * 2] = c2;
  d[(g + 8) * 8 + q * 2 + 1] = c3;
}
'''

# 48 values live across a loop while the launch bounds cap a thread at 32 registers: ptxas spills.
SPILL = r'''
extern "C" __global__ void __launch_bounds__(1024, 2) press(const float* __restrict__ x, float* y, int n, int reps) {
  float v[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) v[i] = x[threadIdx.x + i * n];
  for (int r = 0; r < reps; ++r) {
#pragma unroll
    for (int i = 0; i < 48; ++i) v[i] = v[i] * v[(i + r) % 48 == i ? i : (i + 1) % 48] + 1.0f;
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 48; ++i) acc += v[i];
  y[threadIdx.x] = acc;
}
'''

# An array indexed by values known only at run time: no spill, but the array lives in a stack frame.
LOCAL_ARRAY = r'''
extern "C" __global__ void pick(const float* __restrict__ x, float* y, int k) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = x[threadIdx.x + i * 32];
  v[k % 64] += 1.0f;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) acc += v[i] * v[(i * 7 + k) % 64];
  y[threadIdx.x] = acc;
}
'''

BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = 1.0f }\n'

# ptxas -v output of a two-stream chain (NVRTC 13.5, sm_90) followed by the spilling kernel above.
PTXAS_LOG = """\
chain.cu(283): warning #177-D: variable "n1" was declared but never referenced
ptxas info    : 129 bytes gmem
ptxas info    : Compiling entry function 'guard1_kernel' for 'sm_90'
ptxas info    : Function properties for guard1_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 0 barriers
ptxas info    : Compile time = 4.885 ms
ptxas info    : Function properties for _Z16tuner_spin_untilPKjjPj
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'stage1_kernel' for 'sm_90'
ptxas info    : Function properties for stage1_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes smem
ptxas info    : Compile time = 1317.712 ms
ptxas info    : Compiling entry function 'press' for 'sm_90'
ptxas info    : Function properties for press
ptxas         .     400 bytes stack frame, 372 bytes spill stores, 432 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 400 bytes cumulative stack size, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 60.087 ms
"""


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "kernels"


def built_elsewhere(cache, toolkit_here: str, other: str) -> None:
    """Turn this host's cache entries into ones an NVRTC of version ``other`` wrote (as if carried over)."""
    folder = cache / "sm_90" / other
    shutil.move(cache / "sm_90" / toolkit_here, folder)
    for record in folder.glob("*.json"):
        meta = json.loads(record.read_text())
        meta["toolkit"] = other
        record.write_text(json.dumps(meta))


def test_ptxas_report_is_read_per_entry_function():
    k = tc.parse_ptxas_log(PTXAS_LOG)
    assert set(k) == {"guard1_kernel", "stage1_kernel", "press"}  # the device function is not an entry
    assert k["guard1_kernel"] == dict(registers=14, smem=0, stack=0, spill_stores=0, spill_loads=0, barriers=0)
    assert k["stage1_kernel"]["registers"] == 128 and k["stage1_kernel"]["smem"] == 16
    assert k["stage1_kernel"]["barriers"] == 1 and k["stage1_kernel"]["spill_stores"] == 0
    assert k["press"] == dict(registers=32, smem=1024, stack=400, spill_stores=372, spill_loads=432, barriers=0,
                              cmem=372)


@nvrtc
def test_an_mma_kernel_compiles_for_sm90_on_the_cpu(cache):
    mod = tc.compile_source(MMA, "sm_90", cache_dir=cache)
    assert mod.cubin[:4] == b"\x7fELF" and not mod.cached
    assert mod.arch == "sm_90" and mod.toolkit == tc.toolkit_version()
    assert mod.source_hash == hashlib.sha256(MMA.encode()).hexdigest()
    res = mod.kernels["mma_tile"]
    assert 0 < res["registers"] <= 255 and res["spill_stores"] == 0 and not mod.spills
    assert "Compiling entry function 'mma_tile' for 'sm_90'" in mod.log and mod.compile_s > 0


@nvrtc
def test_sm90a_is_accepted_and_a_non_sm_target_is_refused(cache):
    assert tc.compile_source(MMA, "sm_90a", cache_dir=cache).arch == "sm_90a"
    with pytest.raises(ValueError, match="sm_XY"):
        tc.compile_source(MMA, "compute_90", cache_dir=cache)


@nvrtc
def test_a_spilling_kernel_reports_its_spills(cache):
    mod = tc.compile_source(SPILL, cache_dir=cache)
    assert mod.spills and mod.kernels["press"]["spill_stores"] > 0 and mod.kernels["press"]["stack"] > 0


@nvrtc
def test_an_array_in_local_memory_counts_as_a_spill(cache):
    mod = tc.compile_source(LOCAL_ARRAY, cache_dir=cache)
    k = mod.kernels["pick"]
    assert k["spill_stores"] == k["spill_loads"] == 0 and k["stack"] > 0 and mod.spills


@nvrtc
def test_the_second_compile_is_a_cache_hit_without_nvrtc(cache, monkeypatch):
    first = tc.compile_source(MMA, cache_dir=cache)
    hits = tc.cache_stats["hits"]

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(tc, "_nvrtc_compile", no_compiler)
    again = tc.compile_source(MMA, cache_dir=cache)
    assert again.cached and again.cubin == first.cubin and again.kernels == first.kernels
    assert tc.cache_stats["hits"] == hits + 1
    digest = first.source_hash
    assert (cache / "sm_90" / first.toolkit / f"{digest}.cubin").is_file()
    assert (cache / "sm_90" / first.toolkit / f"{digest}.json").is_file()


@nvrtc
def test_a_cubin_from_another_nvrtc_version_is_used_when_accepted(cache, monkeypatch):
    here = tc.compile_source(MMA, cache_dir=cache)
    built_elsewhere(cache, here.toolkit, "12.8")
    monkeypatch.setattr(tc, "_nvrtc_compile", lambda *a, **k: pytest.fail("compiled although a cubin was cached"))
    other = tc.compile_source(MMA, cache_dir=cache, accept_other_toolkit=True)
    assert other.cached and other.toolkit == "12.8" and other.cubin == here.cubin
    assert tc.cache_stats["other_toolkit_hits"] >= 1

    # Without NVRTC at all (a GPU host without the compiler) the carried cache still serves.
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # makes the import fail
    assert tc.compile_source(MMA, cache_dir=cache, accept_other_toolkit=True).toolkit == "12.8"
    with pytest.raises(tc.ToolchainMissing, match=r"pip install -e '\.\[compile\]'"):
        tc.compile_source(MMA, cache_dir=cache)


@nvrtc
def test_a_different_toolkit_is_not_used_unless_accepted(cache):
    here = tc.compile_source(MMA, cache_dir=cache)
    built_elsewhere(cache, here.toolkit, "12.8")
    assert not tc.compile_source(MMA, cache_dir=cache).cached  # compiled afresh for this toolkit


@nvrtc
def test_a_syntax_error_raises_compile_error_with_the_log(cache):
    with pytest.raises(tc.CompileError) as err:
        tc.compile_source(BROKEN, cache_dir=cache)
    assert "error" in str(err.value) and 'expected a ";"' in err.value.log
    copy = pickle.loads(pickle.dumps(err.value))  # how it comes back from a worker process
    assert str(copy) == str(err.value) and copy.log == err.value.log
    assert not any(cache.rglob("*.cubin"))


@nvrtc
def test_a_write_interrupted_before_the_record_leaves_no_entry(cache, monkeypatch):
    real_replace = os.replace

    def crash_on_record(src, dst):
        if str(dst).endswith(".json"):
            raise KeyboardInterrupt  # the process dies between the cubin and its record
        real_replace(src, dst)

    monkeypatch.setattr(tc.os, "replace", crash_on_record)
    with pytest.raises(KeyboardInterrupt):
        tc.compile_source(MMA, cache_dir=cache)
    monkeypatch.setattr(tc.os, "replace", real_replace)
    assert not any(p.name.endswith(".tmp") for p in cache.rglob("*"))  # no stray temporary file
    assert tc.lookup(tc.source_hash(MMA), "sm_90", tc.toolkit_version(), cache_dir=cache) is None
    assert not tc.compile_source(MMA, cache_dir=cache).cached  # rebuilt, then stored whole
    assert tc.compile_source(MMA, cache_dir=cache).cached


@nvrtc
def test_a_cubin_that_does_not_match_its_record_is_ignored(cache):
    mod = tc.compile_source(MMA, cache_dir=cache)
    path = cache / "sm_90" / mod.toolkit / f"{mod.source_hash}.cubin"
    path.write_bytes(mod.cubin[: len(mod.cubin) // 2])
    assert tc.lookup(mod.source_hash, "sm_90", mod.toolkit, cache_dir=cache) is None


@nvrtc
def test_compile_many_compiles_in_parallel_and_returns_failures(cache):
    items = [("mma", MMA), ("mma again", MMA), ("spill", SPILL), ("broken", BROKEN)]
    out = dict(tc.compile_many(items, "sm_90", jobs=2, cache_dir=cache))
    assert set(out) == {"mma", "mma again", "spill", "broken"}
    assert isinstance(out["broken"], tc.CompileError) and "error" in out["broken"].log
    assert out["mma"] is out["mma again"] or out["mma"].cubin == out["mma again"].cubin
    assert out["spill"].spills and not out["mma"].cached
    cached = dict(tc.compile_many(items[:3], "sm_90", jobs=2, cache_dir=cache))
    assert all(m.cached for m in cached.values())


@nvrtc
def test_the_compile_command_renders_and_compiles_a_workload(cache, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CACHE", str(cache))
    args = argparse.Namespace(workload="gpt3", arch="sm_90", tokens=[1], jobs=1, limit=1)
    assert tc.main(args) == 0
    out = capsys.readouterr().out
    assert "1 configs over 1 size(s); 1 compiled (0 from the cache), 0 failed" in out
    assert any(cache.rglob("*.cubin"))


@nvrtc
def test_compiling_ahead_takes_a_carried_cache_of_another_nvrtc_and_needs_none_for_it(cache, monkeypatch):
    here = tc.compile_source(MMA, cache_dir=cache)
    built_elsewhere(cache, here.toolkit, "12.8")  # only another toolkit's cubin is left
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # no NVRTC on this host
    got = dict(tc.compile_many([("k", MMA)], "sm_90", cache_dir=cache, accept_other_toolkit=True))
    assert got["k"].toolkit == "12.8" and got["k"].cached
    with pytest.raises(tc.ToolchainMissing):
        dict(tc.compile_many([("k", MMA)], "sm_90", cache_dir=cache))


def _state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent (Linux /proc); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state[0] != "Z"  # a zombie has ended, its parent has not reaped it yet


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if (state := _state(int(p.name))) is not None and state[1] == pid and _alive(int(p.name))]


@nvrtc
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_compile_workers_end_when_their_parent_is_killed(tmp_path):
    """kill -9 of a process compiling over several workers leaves none of them behind: they would
    otherwise wait on the pool's queue for ever."""
    import signal
    import subprocess
    import time

    script = tmp_path / "compile.py"
    script.write_text(
        "import os, sys\n"
        "from tuner.codegen.compile import compile_many\n"
        "if __name__ == '__main__':\n"
        f"    src = {MMA!r}\n"
        "    sources = [(i, src.replace('mma_tile', f'mma_tile{i}')) for i in range(400)]\n"
        "    for _ in compile_many(sources, 'sm_90', 2, cache_dir=sys.argv[1]):\n"
        "        pass\n")
    cache = tmp_path / "kernels"
    proc = subprocess.Popen([sys.executable, str(script), str(cache)])
    try:
        deadline = time.monotonic() + 60
        while len(list(cache.rglob("*.cubin"))) < 4:  # the workers are compiling
            assert proc.poll() is None and time.monotonic() < deadline, "the compile ended before it could be killed"
            time.sleep(0.1)
        workers = [p for p in _children(proc.pid) if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) >= 2, workers
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in workers):
            assert time.monotonic() < deadline, f"compile workers {workers} outlived their parent"
            time.sleep(0.2)
    finally:
        proc.kill()
