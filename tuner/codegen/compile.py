"""Compile CUDA sources to cubins with NVRTC, on any host, cached on disk by source hash.

NVRTC (the ``cuda-bindings`` and ``nvidia-cuda-nvrtc`` wheels) needs no GPU, so the
cache can be filled on a CPU host and carried to the GPU host: the cubin for
``sm_90`` from a newer NVRTC loads on an older driver, which is why the GPU host's
loader accepts a cached cubin from another NVRTC version.

Cache layout, under ``$TUNER_CACHE`` or ``~/.cache/tuner/kernels``::

    <arch>/<toolkit>/<sha256 of the source>.cubin
    <arch>/<toolkit>/<sha256 of the source>.json   (resources, log, compile time)

Both files are written to a temporary name and renamed into place, and the JSON
(written last) records the cubin's digest, so an interrupted write is never read
back as an entry.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Hashable, Iterable, Iterator, Sequence, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v")
_ARCH = re.compile(r"sm_\d+a?")

def target_arch(device_arch: str) -> str:
    """What to compile for a device: its arch-specific variant where it has one (sm_90 -> sm_90a,
    which adds wgmma). An ``sm_90a`` cubin runs on exactly the devices an ``sm_90`` cubin runs on."""
    return "sm_90a" if device_arch == "sm_90" else device_arch


# Cache lookups in this process: "hits" (exact toolkit), "other_toolkit_hits", "misses".
cache_stats: Counter[str] = Counter()


class CompileError(Exception):
    """NVRTC rejected a source; ``log`` holds the compiler's output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.message = message
        self.log = log

    def __reduce__(self) -> tuple[Any, ...]:  # keep the log when crossing a process boundary
        return (type(self), (self.message, self.log))


class ToolchainMissing(RuntimeError):
    """NVRTC cannot be imported here."""


@dataclass(frozen=True)
class CompiledModule:
    """A cubin and what ptxas reported about each of its kernels."""

    cubin: bytes
    arch: str
    toolkit: str  # NVRTC version that produced the cubin, e.g. "13.5"
    source_hash: str
    kernels: dict[str, dict[str, int]]  # entry name -> registers, smem, stack, spill_stores, spill_loads, barriers
    log: str
    compile_s: float
    cached: bool

    @property
    def spills(self) -> bool:
        """Whether any kernel spills registers to local memory, or keeps a stack frame there (an
        array indexed by values unknown at compile time, the accumulators of a loop left rolled,
        which ptxas does not count as spills but which costs as much)."""
        return any(k.get("spill_stores", 0) or k.get("spill_loads", 0) or k.get("stack", 0)
                   for k in self.kernels.values())


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise ToolchainMissing(f"NVRTC is not available ({exc}); install it with: pip install -e '.[compile]'") \
            from None
    return nvrtc


def toolkit_version() -> str:
    """The NVRTC version here, like ``"13.5"``; raises ToolchainMissing without NVRTC."""
    nvrtc = _nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def default_cache_dir() -> Path:
    env = os.environ.get("TUNER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tuner" / "kernels"


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


# ---------------------------------------------------------------------------
# ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_FIELDS = {"barriers": re.compile(r"used (\d+) barriers"), "smem": re.compile(r"(\d+) bytes smem"),
           "cmem": re.compile(r"(\d+) bytes cmem\[0\]")}


def parse_ptxas_log(text: str) -> dict[str, dict[str, int]]:
    """Per entry function: ``registers``, ``smem`` (static), ``stack``, ``spill_stores``, ``spill_loads``, ``barriers``.

    Only entry functions are reported; the frame of a non-inlined device function it
    calls is listed by ptxas under that function's own name and is left out here.
    """
    kernels: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry = props = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            kernels[entry] = {"registers": 0, "smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
                              "barriers": 0}
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry is not None:
            res = kernels[entry]
            res["registers"] = int(m.group(1))
            for key, pattern in _FIELDS.items():
                if f := pattern.search(line):
                    res[key] = int(f.group(1))
    for name, res in kernels.items():
        if name in frames:
            res["stack"], res["spill_stores"], res["spill_loads"] = frames[name]
    return kernels


# ---------------------------------------------------------------------------
# Cache


def _key_name(digest: str, options: Sequence[str]) -> str:
    # Extra options change the cubin, so they are part of the file name; the default has none.
    if not options:
        return digest
    return f"{digest}-{hashlib.sha256(' '.join(options).encode()).hexdigest()[:16]}"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _store(folder: Path, name: str, mod: CompiledModule, options: Sequence[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"source_hash": mod.source_hash, "arch": mod.arch, "toolkit": mod.toolkit, "options": list(options),
            "kernels": mod.kernels, "log": mod.log, "compile_s": mod.compile_s,
            "cubin_sha256": hashlib.sha256(mod.cubin).hexdigest()}
    _write_atomic(folder / f"{name}.cubin", mod.cubin)
    _write_atomic(folder / f"{name}.json", json.dumps(meta, indent=1, sort_keys=True).encode())


def _load(folder: Path, name: str) -> CompiledModule | None:
    meta_path, cubin_path = folder / f"{name}.json", folder / f"{name}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        log.warning("ignoring cache entry %s: the cubin does not match its record", cubin_path)
        return None
    return CompiledModule(cubin, meta["arch"], meta["toolkit"], meta["source_hash"], meta["kernels"], meta["log"],
                          float(meta["compile_s"]), cached=True)


def _version_key(toolkit: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", toolkit))


def lookup(digest: str, arch: str, toolkit: str | None, *, cache_dir: Path | None = None,
           options: Sequence[str] = (), accept_other_toolkit: bool = False) -> CompiledModule | None:
    """A cached module for this source hash and arch: same toolkit first, else (if accepted) the newest other one."""
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / arch
    name = _key_name(digest, options)
    if toolkit is not None:
        mod = _load(root / toolkit, name)
        if mod is not None:
            cache_stats["hits"] += 1
            log.debug("kernel cache hit: %s for %s, NVRTC %s", digest[:12], arch, toolkit)
            return mod
    if accept_other_toolkit and root.is_dir():
        others = sorted((p.name for p in root.iterdir() if p.is_dir() and p.name != toolkit), key=_version_key,
                        reverse=True)
        for other in others:
            mod = _load(root / other, name)
            if mod is not None:
                cache_stats["other_toolkit_hits"] += 1
                log.debug("kernel cache hit: %s for %s from NVRTC %s (here: %s)", digest[:12], arch, other, toolkit)
                return mod
    cache_stats["misses"] += 1
    return None


# ---------------------------------------------------------------------------
# Compiling


def _nvrtc_compile(source: str, arch: str, name: str, options: Sequence[str]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        raise CompileError(f"nvrtcCreateProgram failed: {err.name}")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in (*BASE_OPTIONS, *options))]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = buf.rstrip(b"\0").decode(errors="replace")
        if result != ok:
            first = next((ln.strip() for ln in text.splitlines() if "error" in ln), result.name)
            raise CompileError(f"{name}: NVRTC could not compile for {arch}: {first}", text)
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        (result,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if result != ok:
            raise CompileError(f"{name}: NVRTC produced no cubin for {arch}: {result.name}", text)
        return bytes(cubin), text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_source(source: str, arch: str = "sm_90", *, name: str = "chain.cu", cache_dir: Path | None = None,
                   options: Sequence[str] = (), accept_other_toolkit: bool = False) -> CompiledModule:
    """A cubin for ``arch`` (``sm_90``, ``sm_90a``...), from the cache or freshly compiled and then cached.

    Without NVRTC here, a cached cubin from another toolkit is still served when
    ``accept_other_toolkit`` is set; otherwise ToolchainMissing is raised.
    """
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"architecture {arch!r} is not of the form sm_XY or sm_XYa (e.g. sm_90, sm_90a)")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = source_hash(source)
    try:
        toolkit: str | None = toolkit_version()
    except ToolchainMissing:
        if not accept_other_toolkit:
            raise
        toolkit = None
    mod = lookup(digest, arch, toolkit, cache_dir=cache, options=options, accept_other_toolkit=accept_other_toolkit)
    if mod is not None:
        return mod
    if toolkit is None:
        raise ToolchainMissing(f"no cached cubin for {digest[:12]} ({arch}) and NVRTC is not available to build one; "
                               "install it with: pip install -e '.[compile]'")
    return _build(source, arch, toolkit, cache, name, options)


def _build(source: str, arch: str, toolkit: str, cache: Path, name: str, options: Sequence[str]) -> CompiledModule:
    start = time.perf_counter()
    cubin, text = _nvrtc_compile(source, arch, name, options)
    digest = source_hash(source)
    mod = CompiledModule(cubin, arch, toolkit, digest, parse_ptxas_log(text), text, time.perf_counter() - start,
                         cached=False)
    _store(cache / arch / toolkit, _key_name(digest, options), mod, options)
    return mod


def _exit_with_parent(parent: int) -> None:
    """In a compile worker: end when the process that started it is gone. A parent killed with
    kill -9 leaves its workers blocked on the pool's queue, whose pipe their siblings keep open,
    so without this they would wait there for ever."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tuner-exit-with-parent", daemon=True).start()


def _compile_job(source: str, arch: str, toolkit: str, cache: Path, options: Sequence[str]
                 ) -> CompiledModule | CompileError:
    try:
        return _build(source, arch, toolkit, cache, "chain.cu", options)
    except CompileError as exc:
        return exc


def compile_many(sources: Iterable[tuple[K, str]], arch: str = "sm_90", jobs: int | None = None, *,
                 cache_dir: Path | None = None, options: Sequence[str] = (), accept_other_toolkit: bool = False
                 ) -> Iterator[tuple[K, CompiledModule | CompileError]]:
    """Compile ``(key, source)`` pairs over ``jobs`` processes; yields ``(key, module or CompileError)`` as each ends.
    With ``accept_other_toolkit`` a cubin another NVRTC built (a cache carried from another host)
    answers too, as it does for :func:`compile_source`.

    Cached sources are answered here without a worker, and a source that appears under
    several keys is compiled once.
    """
    try:
        toolkit: str | None = toolkit_version()
    except ToolchainMissing:
        if not accept_other_toolkit:
            raise
        toolkit = None  # a host without NVRTC: the carried cache serves what it holds
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    pending: dict[str, tuple[str, list[K]]] = {}
    for key, source in sources:
        digest = source_hash(source)
        if digest in pending:
            pending[digest][1].append(key)
            continue
        mod = lookup(digest, arch, toolkit, cache_dir=cache, options=options, accept_other_toolkit=accept_other_toolkit)
        if mod is not None:
            yield key, mod
        else:
            pending[digest] = (source, [key])
    if not pending:
        return
    if toolkit is None:
        toolkit = toolkit_version()  # something is not cached: now NVRTC's absence is the error
    workers = max(1, min(jobs or os.cpu_count() or 1, len(pending)))
    if workers == 1:
        for source, keys in pending.values():
            out = _compile_job(source, arch, toolkit, cache, options)
            for key in keys:
                yield key, out
        return
    # spawn, not fork: the parent may hold a CUDA context, which a forked child must not inherit.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_exit_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(_compile_job, source, arch, toolkit, cache, options): keys
                   for source, keys in pending.values()}
        for fut in as_completed(futures):
            out = fut.result()
            for key in futures[fut]:
                yield key, out


# ---------------------------------------------------------------------------
# python -m tuner compile


def main(args: argparse.Namespace) -> int:
    """Render the feasible configs of a workload and compile them (``python -m tuner compile``).

    ``args``: ``workload``, ``arch``, the size flags of the workload (lists; default: its sweep),
    ``jobs``, ``limit`` (configs per size). Configs the sync checker rejects are skipped.
    Exit status 1 when a source fails to compile.
    """
    from tqdm import tqdm  # noqa: PLC0415

    from .. import UsageError  # noqa: PLC0415
    from ..chain.workloads import get_workload  # noqa: PLC0415
    from ..checker.checks import check  # noqa: PLC0415
    from ..device import DeviceInfo  # noqa: PLC0415
    from ..paths import home  # noqa: PLC0415
    from ..search.space import load_space  # noqa: PLC0415
    from .render import render  # noqa: PLC0415

    if not _ARCH.fullmatch(args.arch):
        raise UsageError(f"--arch {args.arch!r} is not an architecture; accepted: sm_XY or sm_XYa, e.g. sm_90")
    wl = get_workload(args.workload)
    sizes = wl.requested_sizes(vars(args))
    device = DeviceInfo(name=f"{args.arch} (compile only)", arch=args.arch.rstrip("a"))
    target = target_arch(device.arch)
    space = load_space(home() / "search_spaces" / f"{wl.name}.toml")
    cache = default_cache_dir()
    start = time.perf_counter()

    todo: list[tuple[tuple[str, str], str]] = []
    rejected = 0
    for size in sizes:
        chain = wl.chain(**size)
        for cfg in islice(space.feasible(chain, device).grid(seed=0), args.limit):
            if check(chain, cfg, sms=device.sms):
                rejected += 1
                continue
            todo.append(((chain.label, cfg.short()), render(chain, cfg).source))

    done = failed = spilled = hits = 0
    first_failure = ""
    with tqdm(total=len(todo), desc=f"compile {wl.name} ({target})", unit="src", file=sys.stderr) as bar:
        for (label, short), out in compile_many(todo, target, args.jobs, cache_dir=cache):
            bar.update()
            if isinstance(out, CompileError):
                failed += 1
                first_failure = first_failure or f"{label} {short}: {out}"
                continue
            done += 1
            hits += out.cached
            spilled += out.spills
    print(f"{wl.name} for {target} with NVRTC {toolkit_version()}: {len(todo)} configs over {len(sizes)} "
          f"size(s); {done} compiled ({hits} from the cache), {failed} failed, {spilled} spill registers to "
          f"local memory; {rejected} rejected by the sync checker; {time.perf_counter() - start:.1f} s wall; "
          f"cache: {cache}")
    if first_failure:
        print(f"first failure: {first_failure}", file=sys.stderr)
    return 1 if failed else 0
