"""(exp11) The split-K reduction's loads in flight. The last split reads the others' partial sums
float4 by float4 with a warp barrier after every 4 (so ptxas keeps at most 4 loads outstanding
and the accumulators never spill): 6 dependent round trips to L2 for a 128x192 tile. Variants
"rN" put the barrier after every N loads instead ("r24": none at all for that tile). The
compiler's spill counts are printed with each. Stage-alone GEMM1 and whole chains at 128 and 256
tokens, timed against the CuPy cuBLAS chain in the same interleaved rounds (3 x 30 runs, 0.3 s
idle before each), every variant verified before and after."""
import dataclasses, hashlib, sys, time
from statistics import median
import tuner.backends.gpu as gpu
from tuner.baselines import baseline_timers
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
from tuner.render import render as real_render

LINE = "        if (j % 4 == 3) __syncwarp();"
cur = {"v": ""}


def patched(chain, config, fault="none"):
    r = real_render(chain, config, fault)
    if not cur["v"]:
        return r
    n = int(cur["v"][1:])
    assert r.source.count(LINE) == 1
    src = r.source.replace(LINE, f"        if (j % {n} == {n - 1}) __syncwarp();")
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


TMA = "wgmma_tma"
G1 = T(128, 192, 64, 2, 1, 4, 2, TMA)
PLAN = [
    (256, 0, Config((G1,), "stream", "col", "block", "serial"), ("", "r8", "r12", "r24")),
    (256, 0, Config((dataclasses.replace(G1, cm=2),), "stream", "col", "block", "serial"), ("", "r8", "r12")),
    (256, None, Config((G1, T(128, 192, 64, 2, 1, 4, 1, TMA)), "stream", "col", "block", "serial"), ("", "r8", "r12", "r24")),
    (128, None, Config((T(128, 96, 128, 2, 1, 4, 2, TMA), T(128, 96, 128, 2, 1, 4, 1, TMA)), "row", "row", "ticket", "fused"),
     ("", "r6", "r12")),
]


def chain_of(tok, j):
    ch = get_workload("gpt3").chain(tokens=tok)
    return ch if j is None else ch.alone(j)


def compile_all(arch: str = "sm_90a") -> None:
    from tuner.compile import compile_source
    for tok, j, c, variants in PLAN:
        for v in variants:
            cur["v"] = v
            compile_source(patched(chain_of(tok, j), c).source, arch)


def main():
    gpu.render = patched
    b = gpu.GpuBackend(seed=67)
    for tok, j, c, variants in PLAN:
        ch = chain_of(tok, j)
        timers, runners = {}, {}
        for v in variants:
            cur["v"] = v
            runner, m = b.load(ch, c)
            if runner is None:
                print(ch.label, v, "LOAD FAIL", m.message[:300], flush=True)
                continue
            err, why = b.verify(ch, runner)
            if why:
                print(ch.label, v, "VERIFY FAIL", why, err, flush=True)
                continue
            spills = {k: (r.get("registers"), r.get("spill_stores")) for k, r in (m.resources or {}).items()}
            print(ch.label, v or "as built", "registers/spill stores", spills, flush=True)
            runners[v] = runner
            timers[v or "as built"] = lambda w, n, runner=runner: runner.time(w, n)
        if j is None:
            p = b.problem(ch)
            timers.update({k: f for k, f in baseline_timers(ch, p.xs[0], p.ws[0]).items() if k == "cupy cublas"})
        ts = {k: [] for k in timers}
        for _ in range(3):
            for k, f in timers.items():
                time.sleep(0.3)
                ts[k].append(median(f(5, 30)))
        for v, runner in runners.items():
            err, why = b.verify(ch, runner)
            if why:
                print(ch.label, v, "VERIFY FAIL AFTER TIMING", why, err, flush=True)
                ts.pop(v or "as built", None)
        for k, x in ts.items():
            print(f"{ch.label:42s} {c.short():64s} {k:14s} {median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    compile_all() if sys.argv[1:] == ["compile"] else main()
