"""(exp7) Pipeline depth: does a shallower ring go faster (fewer loads in flight per SM)? Stage-alone
configs as the product builds them, verified, 3 interleaved rounds of 30 after 0.3 s idle."""
import time
from statistics import median
import tuner.backends.gpu as gpu
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload

PLAN = [(256, 1, [T(128, 192, 64, 2, 1, s, 1, "wgmma_tma", 2, 1) for s in (3, 4, 5)]),
        (256, 0, [T(128, 192, 64, 2, 1, s, 2, "wgmma_tma", 2, 1) for s in (3, 4, 5)]),
        (256, 0, [T(128, 96, 64, 2, 1, s, 1, "wgmma_tma", 1, 2) for s in (3, 4, 5, 6, 7, 8)]),
        (256, 0, [T(128, 96, 128, 2, 1, s, 1, "wgmma_tma", 1, 2) for s in (3, 4)])]


def main():
    b = gpu.GpuBackend(seed=43)
    wl = get_workload("gpt3")
    for tok, j, tiles in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        runners = {}
        for t in tiles:
            c = Config((t,), "stream", "col", "block", "serial")
            runner, m = b.load(a, c)
            if runner is None:
                print(a.label, c.short(), "LOAD FAIL", m.message[:200], flush=True)
                continue
            err, why = b.verify(a, runner)
            if why:
                print(a.label, c.short(), "VERIFY FAIL", why, flush=True)
                continue
            runners[c.short()] = runner
        ts = {k: [] for k in runners}
        for _ in range(3):
            for k, runner in runners.items():
                time.sleep(0.3)
                ts[k].append(median(runner.time(5, 30)))
        for k, x in ts.items():
            print(f"{a.label:42s} {k:52s} {median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    main()
