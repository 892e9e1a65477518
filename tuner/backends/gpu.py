"""The CUDA backend: compile (cached), check resources, verify, then time a config with CuPy.

Everything here runs in the process that owns the CUDA context; :mod:`tuner.backends.worker`
puts it in a child process so that a crashing or hanging kernel costs one trial, not the study.
"""
from __future__ import annotations

import functools
import math
import os
import random
import tempfile
import threading
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, Iterator, Sequence

from ..chain.epilogues import get_epilogue
from ..chain import length, norm, residual
from ..chain.kinds import kind_of
from ..chain.workloads import Chain
from ..codegen.render import Launch, Rendered, render
from ..config import Config
from . import tensormap
from .base import Backend, DeviceInfo, Measurement

VERIFY_TOL = 1e-2  # relative Frobenius error allowed for fp16 outputs against the float32 reference
POISON = 0xFFFF  # an fp16 NaN: an element still holding it was never written


def _cp():
    import cupy  # imported lazily: the base install has no CUDA

    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        return _cp().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def query_device(toolkit: str = "") -> DeviceInfo:
    cp = _cp()
    rt = cp.cuda.runtime
    dev = rt.getDevice()
    props = rt.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    drv = rt.driverGetVersion()
    return DeviceInfo(name=name, arch=f"sm_{props['major']}{props['minor']}", sms=props["multiProcessorCount"],
                      smem_per_block=props["sharedMemPerBlockOptin"], regs_per_block=props["regsPerBlock"],
                      l2_bytes=props["l2CacheSize"], driver=f"{drv // 1000}.{drv % 1000 // 10}", toolkit=toolkit)


@dataclass
class Problem:
    """Device buffers of one chain: input sets (rotated when they fit in L2), weights, outputs."""

    chain: Chain
    xs: list[Any]
    ws: list[list[Any]]  # per input set, per stage
    ys: list[Any]  # per stage outputs (shared by all sets)
    lens: Any = None  # the cache's run-time length (int32 [1]) where the chain reads one (tuner.chain.length)

    @classmethod
    def allocate(cls, chain: Chain, l2_bytes: int, seed: int) -> "Problem":
        cp = _cp()
        s0 = chain.stages[0]
        set_bytes = s0.input_bytes + sum(s.weight_bytes for s in chain.stages)
        # Rotate among enough sets that the working set is at least twice the L2.
        sets = max(1, min(8, math.ceil(2 * l2_bytes / set_bytes)))
        rng = cp.random.default_rng(seed)
        xs = [_rand(rng, s0.a_shape, 1.0) for _ in range(sets)]
        ws = [[norm.folded_test_weights(cp, _rand(rng, *kind_of(s).b_operand(s)), s) for s in chain.stages]
              for _ in range(sets)]
        ys = [cp.empty((s.m, s.n_out), dtype=cp.float16) for s in chain.stages]
        room = length.of(chain)
        return cls(chain, xs, ws, ys, None if room is None else cp.full(1, room, dtype=cp.int32))

    def refresh(self, seed: int) -> None:
        """Draw fresh random inputs into set 0 (verification never reuses a previous draw)."""
        cp = _cp()
        rng = cp.random.default_rng(seed)
        s0 = self.chain.stages[0]
        self.xs[0][...] = _rand(rng, s0.a_shape, 1.0)
        for i, s in enumerate(self.chain.stages):
            self.ws[0][i][...] = norm.folded_test_weights(cp, _rand(rng, *kind_of(s).b_operand(s)), s)


def _rand(rng, shape, scale):
    cp = _cp()
    # uniform in [-scale, scale), never exactly zero everywhere
    return (rng.random(shape, dtype=cp.float32) * (2 * scale) - scale).astype(cp.float16)


def reference(chain: Chain, x, ws) -> Any:
    """Float32 reference of the whole chain (cuBLAS on upcast inputs; each stage kind's own)."""
    return reference_outputs(chain, x, ws)[-1]


def reference_outputs(chain: Chain, x, ws, xp: Any = None, cache_len: int | None = None) -> list[Any]:
    """Float32 reference of each stage's output, in order, for arrays of module ``xp`` (default CuPy);
    ``cache_len``: the run-time cache length of a chain that reads one (None: its room)."""
    xp = _cp() if xp is None else xp
    chain = length.at(chain, cache_len)
    a, outs = x.astype(xp.float32), []
    for st, w in zip(chain.stages, ws):
        a = get_epilogue(st.epilogue).reference(xp, kind_of(st).reference(xp, a, w.astype(xp.float32), st))
        if residual.has(st):
            a = residual.reference(xp, a, residual.operand(st, x, outs))
        outs.append(a)
    return outs


def written_checks(chain: Chain, x, ws, outs: list[Any], cache_len: int | None = None) -> list[tuple[Any, Any]]:
    """(what a stage writes into its second operand, its float32 reference) for each stage that writes
    one (an attention stage's cache append), from the reference outputs ``outs``."""
    cp = _cp()
    chain = length.at(chain, cache_len)
    checks = []
    for st, w in zip(chain.stages, ws):
        view = kind_of(st).b_written(cp, w, st)
        if view is not None:
            a = x.astype(cp.float32) if st.a_from is None else outs[st.a_from]
            checks.append((view, kind_of(st).b_expected(cp, a, st)))
    return checks


def rel_error(out, ref) -> float:
    cp = _cp()
    o = out.astype(cp.float32)
    if bool(cp.isnan(o).any()):
        return float("nan")
    return float(cp.linalg.norm(o - ref) / max(float(cp.linalg.norm(ref)), 1e-30))


def load_functions(module: Any, launches: Sequence[Launch]) -> dict[str, Any]:
    """The kernels of ``launches`` from a loaded CuPy module, each allowed the dynamic shared
    memory its launch asks for (past 48 KiB a kernel must opt in)."""
    funcs = {}
    for l in launches:
        f = module.get_function(l.kernel)
        if l.smem > 48 * 1024:
            f.max_dynamic_shared_size_bytes = l.smem
        funcs[l.kernel] = f
    return funcs


def launch_dependent(func: Any, l: Launch, args: tuple, stream: Any) -> None:
    """Launch ``func`` (a CuPy kernel) on ``stream`` as a programmatic dependent launch
    (``cuLaunchKernelEx`` with programmatic stream serialization): it may start before the kernel
    ahead of it on the stream has finished, and its blocks wait for that kernel themselves
    (``griddepcontrol.wait``). CuPy's kernel calls take no launch attributes, hence the driver API;
    the arguments are the chain's: CuPy arrays (their device pointers) and the u32 epoch."""
    handle = getattr(func, "kernel", func).ptr  # a RawModule's RawKernel holds the loaded Function
    pointers = [_pointer(a) for a in args]
    _dependent(handle, l, stream.ptr, tuple(p is not None for p in pointers))(
        [int(a) if p is None else p for p, a in zip(pointers, args)])


def _pointer(a: Any) -> int | None:
    """A CuPy array's device pointer; None for a scalar."""
    return getattr(getattr(a, "data", None), "ptr", None)


class _DependentLaunch:
    """One kernel's dependent launch on one stream: its configuration and its parameter block
    (a slot per argument, and the array of their addresses the driver reads), built once; a
    launch only writes this run's values into the slots. Building them per launch through
    cuda-bindings' argument marshalling costs more host time than a short kernel runs. The
    instances are shared (cached by kernel, launch and stream), so a lock keeps two threads from
    writing the slots between another's writes and its launch (the driver copies them at launch)."""

    def __init__(self, handle: int, l: Launch, stream_ptr: int, pointers: tuple[bool, ...]):
        import ctypes

        from cuda.bindings import driver as cu

        self.cu, self.name = cu, l.kernel
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = l.grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = l.threads, 1, 1
        cfg.sharedMemBytes = l.smem
        cfg.hStream = cu.CUstream(stream_ptr)
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        self.cfg, self.function = cfg, cu.CUfunction(handle)
        self.slots = [ctypes.c_uint64() if p else ctypes.c_uint32() for p in pointers]
        self.block = (ctypes.c_void_p * len(self.slots))(*(ctypes.addressof(s) for s in self.slots))
        self.block_address = ctypes.addressof(self.block)
        self.lock = threading.Lock()

    def __call__(self, values: Sequence[int]) -> None:
        """Launch with these argument values (device pointers and the epoch, as integers)."""
        with self.lock:
            for slot, v in zip(self.slots, values):
                slot.value = v
            err, = self.cu.cuLaunchKernelEx(self.cfg, self.function, self.block_address, 0)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx({self.name}): {self.cu.cuGetErrorString(err)[1]}")


_dependent = functools.lru_cache(maxsize=256)(_DependentLaunch)


def enqueue_launches(funcs: dict[str, Any], launches: Sequence[Launch], args: tuple, stream: Any, side: Any,
                     fork: Any, join: Any) -> None:
    """Enqueue a chain's launches with ``args`` on ``stream``; those of stream 1 go to ``side``,
    which forks from ``stream`` before them and joins into it after (events ``fork``, ``join``)."""
    two = any(l.stream == 1 for l in launches)
    if two:
        fork.record(stream)
        side.wait_event(fork)
    for l in launches:
        if l.pdl:
            launch_dependent(funcs[l.kernel], l, args, stream)
        else:
            funcs[l.kernel]((l.grid,), (l.threads,), args, shared_mem=l.smem, stream=side if l.stream == 1 else stream)
    if two:
        join.record(side)
        stream.wait_event(join)


class Runner:
    """A loaded, allocated config, runnable any number of times (one epoch per run)."""

    def __init__(self, rendered: Rendered, module, problem: Problem):
        cp = _cp()
        self.r = rendered
        self.problem = problem
        self.state = cp.zeros(rendered.state_words, dtype=cp.uint32)  # zeroed once, never reset
        self.wsbuf = cp.empty(rendered.ws_floats, dtype=cp.float32)
        self.funcs = load_functions(module, rendered.launches)
        # TMA descriptors name buffers, so each input set has its own (a null array when unused).
        self.tmaps = [tensormap.pack(rendered.tensor_maps, self.buffers(s)) if rendered.tensor_maps
                      else cp.zeros(1, dtype=cp.uint64) for s in range(len(problem.xs))]
        self.epoch = 0
        self.graphs: list[Any] = []  # one captured run per input set, for time_graphs
        self.streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
        self.fork = cp.cuda.Event(disable_timing=True)
        self.join = cp.cuda.Event(disable_timing=True)
        cp.cuda.Device().synchronize()  # the zeroed state must land before the first run

    def buffers(self, s: int) -> dict[str, Any]:
        """Input set ``s``'s buffers by the names kernels and tensor maps use: x, w<i>, y<i>."""
        p = self.problem
        out = {"x": p.xs[s]}
        for i, (w, y) in enumerate(zip(p.ws[s], p.ys)):
            out[f"w{i}"], out[f"y{i}"] = w, y
        return out

    def args(self, s: int) -> tuple:
        cp = _cp()
        b = self.buffers(s)
        out: list[Any] = [b["x"]]
        for i in range(len(self.problem.ys)):
            out += [b[f"w{i}"], b[f"y{i}"]]
        lens = () if self.r.room is None else (self.problem.lens,)
        return (*out, self.wsbuf, self.state, cp.uint32(self.epoch), self.tmaps[s], *lens)

    def enqueue(self, s: int = 0) -> None:
        """Enqueue one run of the chain on stream 0 (stream 1 forks from and joins into it)."""
        self.epoch += 1
        enqueue_launches(self.funcs, self.r.launches, self.args(s), *self.streams, self.fork, self.join)

    def capture(self) -> None:
        """Capture one run per input set into a CUDA graph (the source must number its runs on the
        device: ``render(..., device_epoch=True)``), for :meth:`time_graphs`."""
        if not self.r.device_epoch:
            raise ValueError("a chain whose epoch is a kernel argument cannot be replayed from a graph")
        s0 = self.streams[0]
        self.graphs = []
        for s in range(len(self.problem.xs)):
            s0.begin_capture()
            self.enqueue(s)
            self.graphs.append(s0.end_capture())

    def time_graphs(self, warmup: int, reps: int, hold: bool = False) -> list[float]:
        """Per-run times in µs of graph replays, each bracketed by events, back to back (behind a
        hold: see :func:`_time_runs`)."""
        s0 = self.streams[0]
        return _time_runs(lambda i: self.graphs[i % len(self.graphs)].launch(s0), s0, warmup, reps, hold)

    def error_flag(self) -> int:
        return int(self.state[self.r.err_word].get())

    def time(self, warmup: int, reps: int, hold: bool = False) -> list[float]:
        """Per-run times in µs, each run bracketed by events; runs are queued back to back (behind
        a hold: see :func:`_time_runs`)."""
        sets = len(self.problem.xs)
        return _time_runs(lambda i: self.enqueue(i % sets), self.streams[0], warmup, reps, hold)


def _capture(runner: Runner) -> str | None:
    """Capture the runner's graphs; why the driver refused, or None."""
    try:
        runner.capture()
    except Exception as exc:  # noqa: BLE001 - a capture the driver refuses leaves the config out
        return f"graph capture: {exc}"
    return None


# A hold long enough for the host to queue a run of a few kernels and its two events (Python
# calls of tens of µs each) ahead of the GPU, capped for long series.
HOLD_NS_PER_RUN = 60_000
HOLD_MAX_NS = 20_000_000
_HOLD_SRC = r"""
extern "C" __global__ void tuner_hold(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""


def hold_ns(runs: int) -> int:
    """How long a hold keeps the stream back for ``runs`` queued runs."""
    return min(HOLD_MAX_NS, HOLD_NS_PER_RUN * runs)


@functools.lru_cache(maxsize=1)
def _hold_kernel() -> Any:
    return _cp().RawKernel(_HOLD_SRC, "tuner_hold")


def _time_runs(run: Callable[[int], Any], stream: Any, warmup: int, reps: int, hold: bool = False) -> list[float]:
    """``run(i)`` for i below ``warmup``, then again for i below ``reps``, each timed between two
    events on ``stream``, all queued back to back; µs per timed run.

    With ``hold`` a one-warp kernel first keeps the stream busy while the host queues every run,
    so that the events time what the GPU does: without it a run of short kernels that the host
    launches more slowly than the GPU runs them waits for the host between kernels, and its time
    is the host's (a search ranks configs by their kernels; a caller's own time, host included,
    is what the final rounds measure)."""
    cp = _cp()
    if hold:
        _hold_kernel()((1,), (32,), (cp.uint64(hold_ns(warmup + reps)),), stream=stream)
    for i in range(warmup):
        run(i)
    evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for i, (a, b) in enumerate(evs):
        a.record(stream)
        run(i)
        b.record(stream)
    stream.synchronize()
    return [cp.cuda.get_elapsed_time(a, b) * 1000.0 for a, b in evs]


class GpuBackend(Backend):
    """Measures configs on the first visible CUDA device."""

    name = "gpu"
    features = frozenset({"screens", "time_rounds"})
    SCREEN_REPS = 10
    IDLE_S = 0.3  # idle before each final-round timing: the clock drops under sustained load

    def __init__(self, *, warmup: int = 5, reps: int = 30, seed: int = 0, cache_dir: str | None = None,
                 graphs: bool = False, persistent_blocks: int | None = None):
        """``graphs``: every config runs from CUDA graphs, in the search as in the final rounds (its
        source numbering its runs on the device), as a graph-captured baseline does; else as launches.
        ``persistent_blocks``: the blocks a persistent stage launches, for tests that make each block
        loop over many tiles (default: the device's SMs)."""
        from ..codegen.compile import toolkit_version

        cp = _cp()
        cp.cuda.Device(0).use()
        self.warmup, self.reps, self.seed = warmup, reps, seed
        self.graphs = graphs
        self.cache_dir = cache_dir
        self._device = query_device(toolkit_version())
        self._persistent_blocks = persistent_blocks or self._device.sms
        self._problems: dict[str, Problem] = {}
        self._refs: dict[str, Any] = {}
        self._draws = 0

    def device_info(self) -> DeviceInfo:
        return self._device

    def problem(self, chain: Chain) -> Problem:
        if chain.label not in self._problems:
            self._problems.clear()  # one chain's buffers at a time: the weights are large
            self._refs.clear()
            self._problems[chain.label] = Problem.allocate(chain, self._device.l2_bytes, self.seed)
        return self._problems[chain.label]

    def load(self, chain: Chain, config: Config, fault: str = "none", device_epoch: bool = False
             ) -> tuple[Runner | None, Measurement]:
        """Render, compile and load; on failure the Measurement says why (and the runner is None).
        ``device_epoch``: the source that numbers its runs on the device, for CUDA graphs."""
        from ..codegen.compile import CompileError, compile_source, target_arch

        rendered = render(chain, config, fault, device_epoch=device_epoch, sms=self._persistent_blocks)
        base = dict(source_hash=rendered.hash)
        try:
            mod = compile_source(rendered.source, target_arch(self._device.arch), cache_dir=self.cache_dir,
                                 accept_other_toolkit=True)
        except CompileError as exc:
            return None, Measurement.failed("compile", str(exc).splitlines()[0][:500], **base)
        base.update(compile_s=mod.compile_s, resources=mod.kernels)
        cannot = rendered.launch_problems(mod.kernels, self._device)
        if cannot:
            return None, Measurement.failed("resources", "cannot launch: " + "; ".join(cannot), **base)
        cp = _cp()
        try:
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
                fh.write(mod.cubin)
            try:
                module = cp.RawModule(path=fh.name)
                runner = Runner(rendered, module, self.problem(chain))
            finally:
                os.unlink(fh.name)
        except (cp.cuda.driver.CUDADriverError, RuntimeError, ValueError) as exc:  # incl. a TMA descriptor refused
            return None, Measurement.failed("launch", f"load: {exc}", **base)
        return runner, Measurement(ok=True, **base)

    def verify(self, chain: Chain, runner: Runner) -> tuple[float, str | None]:
        """Fresh inputs, poisoned outputs, one run; returns (error, failure reason or None). A chain
        that reads the cache's length at run time runs twice: at a random length below its room, then
        at its room (what is timed), the cache past the length poisoned too, so a read beyond it shows."""
        p = runner.problem
        self._draws += 1
        p.refresh(self.seed * 1000003 + self._draws)
        room = length.of(chain)
        lengths = [None] if room is None else [random.Random(self.seed * 7919 + self._draws).randrange(room), room]
        caches = [(w, w.copy()) for st, w in zip(chain.stages, p.ws[0]) if getattr(st, "dynamic", False)]
        for cache_len in lengths:
            for w, drawn in caches:  # each run starts from the drawn cache (the one before poisoned it)
                w[...] = drawn
            err, why = self._verify_once(chain, runner, cache_len)
            if why:
                return err, why
        return err, None

    def _verify_once(self, chain: Chain, runner: Runner, cache_len: int | None) -> tuple[float, str | None]:
        cp = _cp()
        p = runner.problem
        outs = reference_outputs(chain, p.xs[0], p.ws[0], cache_len=cache_len)
        ref = outs[-1]
        written = written_checks(chain, p.xs[0], p.ws[0], outs, cache_len)
        for y in p.ys:
            y.view(cp.uint16).fill(POISON)
        for view, _ in written:  # what a stage writes besides its output (a cache append), poisoned too
            view[...] = cp.nan
        if cache_len is not None:
            p.lens.fill(cache_len)
            for st, w in zip(chain.stages, p.ws[0]):  # and the room past this run's length: never read
                if getattr(st, "dynamic", False):
                    w.reshape(st.kv_heads, 2, st.cache_rows, st.head_dim)[:, :, cache_len:] = cp.nan
        # Fresh inputs, reference and poison were queued on the default stream; the chain runs on
        # its own non-blocking streams, which do not wait for it.
        cp.cuda.Device().synchronize()
        runner.enqueue(0)
        runner.streams[0].synchronize()
        if runner.error_flag():
            return float("nan"), "timeout"
        err = rel_error(p.ys[-1], ref)
        if not err < VERIFY_TOL:  # NaN (an unwritten element) fails too
            return err, "incorrect"
        for view, want in written:
            err_w = rel_error(view, want)
            if not err_w < VERIFY_TOL:
                return err_w, "incorrect"
        self._refs[chain.label] = ref
        return err, None

    def prepare(self, targets: Sequence[tuple[Chain, Config]]) -> Iterator[int]:
        """Compile ahead on every core; yields each target's index as its compile ends."""
        return compile_ahead(targets, self._device.arch, self.cache_dir, device_epoch=self.graphs)

    def ready(self, chain: Chain, config: Config, graphs: bool, verify: bool = True
              ) -> tuple[Runner | None, str | None]:
        """Loaded, verified (fresh inputs, poisoned outputs) and, with ``graphs``, captured in CUDA
        graphs: the runner to time, or None and why not. ``verify=False`` skips the check, for
        timing-only experiments whose sources skip work by design (never for a recorded figure)."""
        runner, m = self.load(chain, config, device_epoch=graphs)
        if runner is None:
            why = m.message
        else:
            why = self.verify(chain, runner)[1] if verify else None
        if not why and graphs:
            why = _capture(runner)
        return (None, why) if why else (runner, None)

    def time_rounds(self, chain: Chain, configs: Sequence[Config], rounds: int,
                    extra: dict[str, Any] | None = None, idle_s: float | None = None, graphs: bool | None = None,
                    heat_s: float = 0.0) -> dict[Any, list[float] | str]:
        """Per config (and per name of ``extra``'s timers, ``timer(warmup, reps) -> µs list``), the
        median µs of each of ``rounds`` interleaved rounds, each timing after ``idle_s`` of idle.
        Configs are verified before and after (fresh inputs, poisoned outputs); one that fails
        gets the reason instead of times. With ``graphs`` (default: the backend's) each config runs
        from CUDA graphs (its source numbering its runs on the device), as a graph-captured baseline does.

        With ``heat_s``, each timing instead follows about ``heat_s`` of the same source's own runs,
        queued back to back with it (no idle): the clock that the power cap leaves under that
        source's sustained load, where one that draws more power runs slower. A short probe of
        each source first sets its number of runs."""
        import time

        graphs = self.graphs if graphs is None else graphs
        idle = self.IDLE_S if idle_s is None else idle_s
        out: dict[Any, list[float] | str] = {}
        timers: dict[Any, Any] = {}
        runners = {}
        for cfg in configs:
            runner, why = self.ready(chain, cfg, graphs)
            if why:
                out[cfg] = why
                continue
            runners[cfg] = runner
            timers[cfg] = runner.time_graphs if graphs else runner.time
        timers.update(extra or {})
        got: dict[Any, list[float]] = {k: [] for k in timers}
        warmups = {k: self.warmup for k in timers}
        if heat_s:
            for k, timer in timers.items():
                warmups[k] = max(self.warmup, round(heat_s * 1e6 / max(median(timer(1, 5)), 1e-3)))
        for _ in range(rounds):
            for k, timer in timers.items():
                if not heat_s:
                    time.sleep(idle)
                got[k].append(round(median(timer(warmups[k], self.reps)), 3))
        for cfg, runner in runners.items():
            why = self.verify(chain, runner)[1]
            if why:
                out[cfg] = f"{why} after the timed rounds"
                got.pop(cfg)
        out.update(got)
        return out

    def measure(self, chain: Chain, config: Config, fault: str = "none", screen: bool = False) -> Measurement:
        cp = _cp()
        runner, m = self.load(chain, config, fault, device_epoch=self.graphs)
        if runner is None:
            return m
        try:
            err, why = self.verify(chain, runner)
            m.error = None if math.isnan(err) else err
            if why:
                msg = "a semaphore wait timed out (bounded spin)" if why == "timeout" else \
                    f"relative error {err:.3g} (limit {VERIFY_TOL}), or unwritten elements"
                return Measurement.failed(why, msg, **{k: getattr(m, k) for k in ("source_hash", "compile_s",
                                                                                  "resources", "error")})
            reps = self.SCREEN_REPS if screen else self.reps
            if self.graphs:
                if (why := _capture(runner)) is not None:
                    return Measurement.failed("launch", why, source_hash=m.source_hash, compile_s=m.compile_s,
                                              resources=m.resources)
                times = runner.time_graphs(self.warmup, reps, hold=True)
            else:
                times = runner.time(self.warmup, reps, hold=True)
            if runner.error_flag():
                return Measurement.failed("timeout", "a semaphore wait timed out while timing",
                                          source_hash=m.source_hash, compile_s=m.compile_s, resources=m.resources)
            if len(runner.problem.xs) == 1:
                # The last timed run saw the verified inputs again: semaphores many epochs on
                # must still order the chain, so its output must still match.
                err2 = rel_error(runner.problem.ys[-1], self._refs[chain.label])
                if not err2 < VERIFY_TOL:
                    return Measurement.failed("incorrect", f"wrong after repeated runs: relative error {err2:.3g}",
                                              source_hash=m.source_hash, compile_s=m.compile_s, resources=m.resources)
            m.times_us = [round(t, 3) for t in times]
            m.median_us = round(median(times), 3)
            m.graphs = self.graphs
            return m
        except cp.cuda.driver.CUDADriverError as exc:
            return Measurement.failed("launch", str(exc)[:500], source_hash=m.source_hash, compile_s=m.compile_s,
                                      resources=m.resources)


def compile_ahead(targets: Sequence[tuple[Chain, Config]], arch: str, cache_dir: str | None = None,
                  jobs: int | None = None, device_epoch: bool = False) -> Iterator[int]:
    """Render and compile ``targets`` into the kernel cache over every core; yields each index as
    its compile ends (a failure too: measuring it reports the compile error). ``device_epoch``:
    the sources that number their runs on the device, which a backend timing graphs runs."""
    from ..codegen.compile import compile_many, target_arch

    sources = []
    for i, (chain, cfg) in enumerate(targets):
        try:
            sources.append((i, render(chain, cfg, device_epoch=device_epoch).source))
        except Exception:  # a config the templates refuse fails in measure(), with its reason
            continue
    done = set()
    for i, _ in compile_many(sources, target_arch(arch), jobs, cache_dir=cache_dir, accept_other_toolkit=True):
        done.add(i)
        yield i
    yield from (i for i in range(len(targets)) if i not in done)
