"""What a user gets without us, and the floor, measured in the same process as our kernels.

- cuBLAS chain as a CuPy user writes it (``x @ w1.T``, GeLU, ``@ w2.T``);
- PyTorch, where installed (not a dependency): eager, captured in a CUDA graph, and captured
  with cuBLASLt's GELU epilogue (``torch._addmm_activation``);
- the floor: the chain's fewest bytes over the measured read bandwidth, or its FLOPs over the
  measured fp16 GEMM rate, whichever is larger.
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any, Callable

from .workloads import Chain

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

    gelu = cp.ElementwiseKernel("T x", "T y", "float v = x; y = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))",
                                "tuner_gelu")

    def run():
        a = x
        for st, w in zip(chain.stages, ws):
            a = a @ w.T
            if st.epilogue == "gelu":
                a = gelu(a)
            elif st.epilogue == "silu_mul":
                g, u = a[:, 0::2], a[:, 1::2]
                a = (g / (1 + cp.exp(-g)) * u).astype(cp.float16)
        return a

    return run


def torch_chains(chain: Chain, x, ws) -> dict[str, Callable[[], Any]]:
    """PyTorch's chains as a PyTorch user writes them, eager and in a CUDA graph; for GeLU also with
    cuBLASLt's GELU epilogue, for SwiGLU with gate and up as one GEMM (their weights concatenated
    once, outside the timing) then ``silu(g) * u``. Empty when torch is absent."""
    try:
        import torch
    except Exception:
        return {}
    epilogues = [s.epilogue for s in chain.stages]
    if epilogues not in (["gelu", "none"], ["silu_mul", "none"]):
        return {}
    tx = torch.as_tensor(x, device="cuda")
    tw = [torch.as_tensor(w, device="cuda") for w in ws]
    F = torch.nn.functional
    variants: dict[str, Callable[[], Any]] = {}
    if epilogues[0] == "gelu":
        zero_bias = torch.zeros(tw[0].shape[0], dtype=torch.float16, device="cuda")

        def eager():
            return F.linear(F.gelu(F.linear(tx, tw[0]), approximate="tanh"), tw[1])

        def lt_gelu():
            return torch.mm(torch._addmm_activation(zero_bias, tx, tw[0].t(), use_gelu=True), tw[1].t())

        variants = {"torch eager": eager, "torch graph": eager, "torch graph+cublasLt gelu": lt_gelu}
    else:
        # Our weight interleaves gate and up rows; a PyTorch model holds them as [gate; up].
        w_gu = torch.cat([tw[0][0::2], tw[0][1::2]]).contiguous()

        def eager():
            g, u = F.linear(tx, w_gu).chunk(2, dim=-1)
            return F.linear(F.silu(g) * u, tw[1])

        variants = {"torch eager": eager, "torch graph": eager}
    out = {"torch eager": variants.pop("torch eager")}
    for name, fn in variants.items():
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            out[name] = g.replay
        except Exception:  # a torch build without the epilogue: that variant is just absent
            continue
    return out


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


def baseline_timers(chain: Chain, x, ws) -> dict[str, Callable[[int, int], list[float]]]:
    """Every baseline available here, by name, as ``timer(warmup, reps) -> per-call µs``."""
    cupy_fn = cupy_chain(chain, x, ws)
    out: dict[str, Callable[[int, int], list[float]]] = {"cupy cublas": lambda w, r: time_events(cupy_fn, w, r)}
    for name, fn in torch_chains(chain, x, ws).items():
        out[name] = lambda w, r, fn=fn: time_torch(fn, w, r)
    return out


def measure_baselines(chain: Chain, x, ws, warmup: int = 5, reps: int = 30) -> dict[str, float]:
    """Median µs of every baseline available here, by name."""
    out = {name: median(timer(warmup, reps)) for name, timer in baseline_timers(chain, x, ws).items()}
    return {k: round(v, 3) for k, v in out.items() if not math.isnan(v)}
