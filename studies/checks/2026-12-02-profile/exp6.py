"""(exp6) Which of exp1's two L2 hints helps where: weights (B) evict_first alone (hintB),
activations (A) evict_last alone (hintA), both (hint). On top of nofence+spin, col order at 512+."""
import time
from statistics import median
import tuner.backends.gpu as gpu
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
import exp1

G = T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1)
V = [(), ("hint",), ("hintA",), ("hintB",)]
PLAN = [(256, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1), "row"), (256, 1, G, "row"),
        (128, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1), "row"),
        (512, 0, G, "col"), (512, 1, G, "col"), (2048, 0, G, "col"), (2048, 1, G, "col")]


def main():
    gpu.render = exp1.patched
    b = gpu.GpuBackend(seed=41)
    wl = get_workload("gpt3")
    for tok, j, t, order in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        c = Config((t,), "stream", order, "block", "serial")
        runners = {}
        for v in V:
            exp1.cur["v"] = {"nofence", "spin", *v}
            runner, m = b.load(a, c)
            if runner is None:
                print(a.label, v, "LOAD FAIL", m.message[:300], flush=True)
                continue
            err, why = b.verify(a, runner)
            if why:
                print(a.label, v, "VERIFY FAIL", why, err, flush=True)
                continue
            runners[v] = runner
        ts = {v: [] for v in runners}
        for _ in range(3):
            for v, runner in runners.items():
                time.sleep(0.3)
                ts[v].append(median(runner.time(5, 30)))
        for v, x in ts.items():
            print(f"{a.label:42s} {c.short():50s} {'+'.join(v) or 'ns':8s} "
                  f"{median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    main()
