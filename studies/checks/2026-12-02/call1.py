"""First GPU call: correctness of every combination, then quick timings against baselines."""
import os, sys, time, json, traceback
sys.path.insert(0, os.path.dirname(__file__))
import shim_compile; shim_compile.install()
from statistics import median
import pytest
OUT = os.environ.get("OUT", "/tmp")
rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py", "-k", sys.argv[1] if len(sys.argv) > 1 else ""])
print("pytest rc", rc, flush=True)
from tuner.backends.gpu import GpuBackend
from tuner.baselines import measure_baselines, floor_us, gemm_rate, read_bandwidth
from tuner.cases import coverage, tiles_for
from tuner.config import Config, StageTiles
from tuner.workloads import get_workload
b = GpuBackend(warmup=5, reps=30)
print(b.device_info(), flush=True)
rate = gemm_rate(); bw = read_bandwidth(302 << 20)
print(f"bw {bw/1e12:.2f} TB/s gemm {rate/1e12:.0f} TFLOP/s", flush=True)
rows = []
extra = {
  1: [((16,64,64,1,4,4,4),(16,64,64,1,4,4,4)), ((16,128,64,1,4,4,8),(16,128,64,1,4,4,4)), ((16,128,128,1,4,3,2),(16,128,128,1,4,3,2)), ((16,128,64,1,4,6,4),(16,128,64,1,4,6,2))],
  64: [((64,64,64,2,2,4,2),(64,64,64,2,2,4,2)), ((64,128,64,2,2,4,2),(64,128,64,2,2,4,1)), ((32,128,64,1,4,4,2),(32,128,64,1,4,4,2))],
  256: [((128,128,32,2,2,4,1),(128,128,32,2,2,4,1)), ((64,128,64,2,2,4,1),(64,128,64,2,2,4,1)), ((128,128,64,2,2,3,1),(64,128,64,2,2,4,2))],
  2048: [((128,128,32,2,2,4,1),(128,128,32,2,2,4,1)), ((128,256,32,2,4,3,1),(128,256,32,2,4,3,1)), ((128,128,64,2,2,3,1),(128,128,64,2,2,3,1))],
}
for tok in [1, 64, 256, 2048]:
    ch = get_workload("gpt3").chain(tokens=tok)
    cfgs = list(coverage(ch))
    for t1, t2 in extra[tok]:
        for pol, launch, disp in [("stream","serial","block"),("tile","fused","ticket"),("row","fused","ticket"),("tile","two_stream","block")]:
            cfgs.append(Config((StageTiles(*t1), StageTiles(*t2)), pol, "row", disp, launch))
    res = []
    for c in cfgs:
        try:
            m = b.measure(ch, c)
        except Exception as e:
            traceback.print_exc(); continue
        res.append((m.median_us if m.ok else float("inf"), c.short(), m.reason, m.error))
        print(tok, c.short(), m.ok, m.reason, m.median_us, m.error, m.message[:200], flush=True)
    p = b.problem(ch)
    base = measure_baselines(ch, p.xs[0], p.ws[0])
    fl = floor_us(ch, bw, rate)
    res.sort()
    best_stream = min((r for r in res if r[1].startswith("stream")), default=None)
    best_tile = min((r for r in res if not r[1].startswith("stream")), default=None)
    rows.append((tok, fl, base, best_stream, best_tile))
print("\nSUMMARY")
for tok, fl, base, bs, bt in rows:
    print(f"tokens={tok} floor={fl:.1f} base={base}\n   stream={bs}\n   tile={bt}")
