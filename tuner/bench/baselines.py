"""What a user gets without us, and the floor, measured in the same process as our kernels.

- cuBLAS chain as a CuPy user writes it (``x @ w1.T``, the epilogue, ``@ w2.T``);
- PyTorch, where installed (not a dependency): eager, captured in a CUDA graph, where
  cuBLASLt has the epilogue built in (GELU, ``torch._addmm_activation``) captured in that form,
  and on request ``torch.compile``'s form captured in a graph (``bench --compile``);
  each epilogue's forms come from :mod:`tuner.chain.epilogues`;
- every baseline's calls rotate over the input sets our chains rotate over (several when one
  set fits in L2), so both read their weights from memory, as a layer of a real model does;
- the floor: the chain's fewest bytes over the measured read bandwidth, or its FLOPs over the
  measured fp16 GEMM rate, whichever is larger.
"""
from __future__ import annotations

import functools
import itertools
from statistics import median
from typing import Any, Callable, Sequence

from ..chain.epilogues import get_epilogue
from ..chain import norm, residual
from ..chain.kinds import kind_of
from ..chain.workloads import Chain

_READ_SRC = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
  unsigned acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads alive; practically never stores
}
"""


def time_events(fn: Callable[[], Any], warmup: int = 5, reps: int = 30, stream=None) -> list[float]:
    """Per-call times in µs with CUDA events on the current stream, calls queued back to back."""
    import cupy as cp

    s = stream or cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for a, b in evs:
        a.record(s)
        fn()
        b.record(s)
    s.synchronize()
    return [cp.cuda.get_elapsed_time(a, b) * 1000.0 for a, b in evs]


def read_bandwidth(nbytes: int) -> float:
    """Bytes per second of a read-only streaming kernel over a buffer of ``nbytes`` (>= 64 MiB)."""
    import cupy as cp

    nbytes = max(nbytes, 64 << 20) // 16 * 16
    buf = cp.ones(nbytes // 4, dtype=cp.uint32)
    out = cp.zeros(1, dtype=cp.uint32)
    k = cp.RawKernel(_READ_SRC, "read_all")
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    n = nbytes // 16
    t = median(time_events(lambda: k((sms * 8,), (512,), (buf, cp.uint64(n), out)), 3, 20))
    return nbytes / (t * 1e-6)


def gemm_rate(n: int = 8192) -> float:
    """FLOP/s of an n x n x n fp16 GEMM through cuBLAS on random data."""
    import cupy as cp

    a = (cp.random.random((n, n), dtype=cp.float32) - 0.5).astype(cp.float16)
    b = (cp.random.random((n, n), dtype=cp.float32) - 0.5).astype(cp.float16)
    t = median(time_events(lambda: a @ b, 3, 10))
    return 2 * n ** 3 / (t * 1e-6)


def floor_us(chain: Chain, bandwidth: float, rate: float) -> float:
    return max(chain.min_bytes / bandwidth, chain.flops / rate) * 1e6


def cupy_chain(chain: Chain, x, ws) -> Callable[[], Any]:
    """The chain as a CuPy user writes it."""
    import cupy as cp

    steps = [(kind_of(st), st, get_epilogue(st.epilogue)) for st in chain.stages]

    def run():
        a, outs = x, []
        for (kind, st, e), w in zip(steps, ws):
            if (n := norm.of(st)) is not None:
                a = norm.cupy(cp, a, n)
            a = e.cupy(cp, kind.cupy_stage(cp, a, w, st))
            if residual.has(st):
                a = a + residual.operand(st, x, outs)
            outs.append(a)
        return a

    return run


def torch_chains(chain: Chain, x, ws, compiled: bool = False) -> dict[str, Callable[[], Any]]:
    """PyTorch's chains as a PyTorch user writes them, eager and in a CUDA graph, with the weights
    held as a PyTorch model holds them (for SwiGLU, gate and up as one GEMM, then ``silu(g) * u``);
    where an epilogue is built into cuBLASLt (GELU), also a graph of that form; with ``compiled``,
    ``torch.compile``'s form (its default mode, compiled once per chain) in a graph. Empty when
    torch is absent."""
    try:
        import torch
    except Exception:
        return {}
    F = torch.nn.functional
    stages = chain.stages
    kinds = [kind_of(st) for st in stages]
    epis = [get_epilogue(st.epilogue) for st in stages]
    tx = kinds[0].torch_input(torch, torch.as_tensor(x, device="cuda"), stages[0])
    tw = [e.torch_weight(k.torch_weight(torch, torch.as_tensor(w, device="cuda"), st))
          for k, st, e, w in zip(kinds, stages, epis, ws)]
    forward = _torch_forward(chain)

    def eager():
        return forward(tx, *tw)

    variants: dict[str, Callable[[], Any]] = {"torch eager": eager, "torch graph": eager}
    if compiled:
        fast = _torch_compiled(chain)
        variants["torch.compile graph"] = lambda: fast(tx, *tw)
    # cuBLASLt's built-in epilogues are GEMM epilogues.
    fused = [e.name for st, e in zip(stages, epis) if e.torch_fused is not None and kind_of(st).STORED_A]
    if fused and all(kind_of(st).STORED_A and not residual.has(st) and not norm.has(st) for st in stages):
        steps = [e.torch_fused(torch, w) if e.torch_fused is not None
                 else (lambda h, e=e, w=w: e.torch(F, torch.mm(h, w.t()))) for e, w in zip(epis, tw)]

        def lt():
            h = tx
            for step in steps:
                h = step(h)
            return h

        variants[f"torch graph+cublasLt {'+'.join(dict.fromkeys(fused))}"] = lt
    out = {"torch eager": variants.pop("torch eager")}
    for name, fn in variants.items():
        try:
            out[name] = torch_graph(fn)
        except Exception:  # a torch build without the epilogue: that variant is just absent
            continue
    return out


@functools.lru_cache(maxsize=8)
def _torch_forward(chain: Chain) -> Callable[..., Any]:
    """The chain as a PyTorch function of its input and weights (one per chain, so that every input
    set shares one compiled form)."""
    import torch

    F = torch.nn.functional
    stages = chain.stages
    kinds = [kind_of(st) for st in stages]
    epis = [get_epilogue(st.epilogue) for st in stages]
    # A normed stage's gain, as a model holds it beside its weights (ours are folded into them: ones).
    gains = [torch.ones(st.k, dtype=torch.float16, device="cuda") if norm.has(st) else None for st in stages]

    def forward(tx, *tw):
        h, outs = tx, []
        for k, st, e, w, g in zip(kinds, stages, epis, tw, gains):
            if g is not None:
                h = norm.torch(F, h, g, norm.of(st))
            h = e.torch(F, k.torch_stage(F, h, w, st))
            if residual.has(st):
                h = h + residual.operand(st, tx, outs)
            outs.append(h)
        return kinds[-1].torch_output(h, stages[-1])

    return forward


@functools.lru_cache(maxsize=8)
def _torch_compiled(chain: Chain) -> Callable[..., Any]:
    import torch

    return torch.compile(_torch_forward(chain))


def torch_graph(fn: Callable[[], Any], output: bool = False) -> Callable[[], Any]:
    """``fn`` (PyTorch work) warmed up on a side stream, captured in a CUDA graph: its replay, which
    with ``output`` returns the captured output (rewritten by each replay)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn()
    return (lambda: (g.replay(), y)[1]) if output else g.replay


def time_torch(fn: Callable[[], Any], warmup: int = 5, reps: int = 30) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1000.0 for a, b in evs]


def rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that runs ``fns`` in turn, call after call: a baseline over several input sets."""
    turn = itertools.cycle(fns)
    return lambda: next(turn)()


def cupy_graph(fns: Sequence[Callable[[], Any]]) -> Callable[[int, int], list[float]] | None:
    """Each of ``fns`` (CuPy work, one per input set) captured in a CUDA graph, replayed in turn,
    as ``timer(warmup, reps)``; None where a capture is refused (an allocation the memory pool
    cannot serve while capturing, say)."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    try:
        with stream:
            for fn in fns:
                fn()  # warm: the pool holds the sizes, cuBLAS its handle
                stream.synchronize()
                stream.begin_capture()
                try:
                    fn()
                finally:
                    graphs.append(stream.end_capture())
    except Exception:  # noqa: BLE001 - the variant is just absent
        return None
    replay = rotating([lambda g=g: g.launch(stream) for g in graphs])
    return lambda w, r: time_events(replay, w, r, stream=stream)


def baseline_timers(chain: Chain, sets: Sequence[tuple[Any, Sequence[Any]]], graphs: bool = False,
                    compiled: bool = False) -> dict[str, Callable[[int, int], list[float]]]:
    """Every baseline available here, by name, as ``timer(warmup, reps) -> per-call µs``; with
    ``graphs`` also the CuPy chain captured in a CUDA graph (PyTorch's graph variants are always in),
    with ``compiled`` also PyTorch's chain through ``torch.compile``, in a graph.
    ``sets``: the input sets ``(x, weights)`` our chains rotate over; each baseline's calls rotate
    over the same sets, so that no baseline reads from L2 what our chains read from memory."""
    cupy_fns = [cupy_chain(chain, x, ws) for x, ws in sets]
    out: dict[str, Callable[[int, int], list[float]]] = {
        "cupy cublas": lambda w, r: time_events(rotating(cupy_fns), w, r)}
    if graphs and (timer := cupy_graph(cupy_fns)) is not None:
        out["cupy cublas graph"] = timer
    per_set = [torch_chains(chain, x, ws, compiled) for x, ws in sets]
    for name in per_set[0]:
        if all(name in fns for fns in per_set):
            out[name] = lambda w, r, fns=[f[name] for f in per_set]: time_torch(rotating(fns), w, r)
    return out
