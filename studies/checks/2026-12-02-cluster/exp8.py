"""Split-K with the bulk-copy reduction: verified stage timings (two, each after idle) of split
tilings against the unsplit ones the bench picked."""
import time
from tuner.backends.gpu import GpuBackend
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload

W = "wgmma_tma"
PLAN = {256: [(0, T(128, 96, 128, 2, 1, 4, 1, W, 2, 1)), (0, T(128, 192, 64, 2, 1, 4, 2, W, 2, 1)),
              (0, T(128, 192, 64, 2, 1, 4, 2, W)), (1, T(128, 192, 64, 2, 1, 4, 1, W, 2, 1))],
        64: [(0, T(64, 48, 256, 1, 1, 4, 1, W)), (0, T(64, 96, 256, 1, 1, 3, 2, W)), (0, T(64, 128, 128, 1, 1, 4, 2, W)),
             (0, T(64, 192, 64, 1, 1, 6, 2, W)), (1, T(64, 96, 128, 1, 1, 4, 1, W)), (1, T(64, 192, 64, 1, 1, 6, 2, W)),
             (1, T(64, 96, 128, 1, 1, 4, 2, W))],
        1: [(0, T(64, 48, 256, 1, 1, 4, 1, W)), (0, T(64, 96, 128, 1, 1, 4, 2, W)), (0, T(64, 192, 64, 1, 1, 6, 4, W)),
            (1, T(64, 96, 64, 1, 1, 7, 1, W)), (1, T(64, 192, 64, 1, 1, 6, 2, W))]}


def main():
    b = GpuBackend(seed=19)
    wl = get_workload("gpt3")
    for tok, items in PLAN.items():
        ch = wl.chain(tokens=tok)
        for j, t in items:
            a = ch.alone(j)
            c = Config((t,), "stream", "row", "block", "serial")
            out = []
            for _ in range(2):
                time.sleep(0.3)
                m = b.measure(a, c)
                out.append("%.1f" % m.median_us if m.ok else f"FAIL {m.reason} {m.message[:150]}")
            print(f"{a.label:45s} {c.short():55s} {' '.join(out)}", flush=True)


if __name__ == "__main__":
    main()
