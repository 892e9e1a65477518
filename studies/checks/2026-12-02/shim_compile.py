"""Scratch stand-in for tuner.compile (NVRTC in-process, no cache) for the first GPU call."""
import re, sys, time, types, hashlib
from dataclasses import dataclass
from concurrent.futures import ProcessPoolExecutor
from cuda.bindings import nvrtc

class CompileError(Exception):
    pass

def toolkit_version():
    _, a, b = nvrtc.nvrtcVersion(); return f"{a}.{b}"

@dataclass
class Mod:
    cubin: bytes; kernels: dict; compile_s: float; toolkit: str; log: str

_cache = {}
def compile_source(source, arch="sm_90", cache_dir=None, accept_other_toolkit=True, **kw):
    h = hashlib.sha256(source.encode()).hexdigest()
    if h in _cache: return _cache[h]
    t = time.time()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"chain.cu", 0, [], [])
    opts = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v", b"-std=c++17"]
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    e, n = nvrtc.nvrtcGetProgramLogSize(prog); log = b" " * n; nvrtc.nvrtcGetProgramLog(prog, log); log = log.decode()
    if r[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(log)
    e, n = nvrtc.nvrtcGetCUBINSize(prog); cub = b" " * n; nvrtc.nvrtcGetCUBIN(prog, cub)
    kernels = {}; cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m: cur = m.group(1); kernels[cur] = {}
        m = re.search(r"Used (\d+) registers", line)
        if m and cur: kernels[cur]["registers"] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and cur: kernels[cur]["spills"] = int(m.group(1))
    mod = Mod(bytes(cub), kernels, time.time() - t, toolkit_version(), log)
    _cache[h] = mod
    return mod

def _one(item):
    k, src, arch = item
    try:
        return k, compile_source(src, arch)
    except CompileError as e:
        return k, e

def compile_many(items, arch, jobs):
    items = [(k, s, arch) for k, s in items]
    with ProcessPoolExecutor(jobs) as ex:
        for k, m in ex.map(_one, items, chunksize=2):
            if not isinstance(m, Exception):
                _cache[hashlib.sha256(dict((a, b) for a, b, _ in items)[k].encode()).hexdigest()] = m
            yield k, m

def install():
    mod = types.ModuleType("tuner.compile")
    for n in ("CompileError", "toolkit_version", "compile_source", "compile_many"):
        setattr(mod, n, globals()[n])
    sys.modules["tuner.compile"] = mod
