"""Split-K with partial sums in fragment order: verified timings of split and unsplit stage tilings."""
from tuner.backends.gpu import GpuBackend
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload


def main():
    b = GpuBackend(seed=13)
    wl = get_workload("gpt3")
    plan = {256: [(0, T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 2, 1)), (0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1)),
                  (0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 1, 1)), (0, T(128, 128, 64, 2, 1, 6, 2, "wgmma_tma", 2, 1)),
                  (1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1)), (1, T(128, 256, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1))],
            64: [(0, T(64, 48, 256, 1, 1, 4, 1, "wgmma_tma")), (0, T(64, 96, 256, 1, 1, 4, 2, "wgmma_tma")),
                 (0, T(64, 192, 128, 1, 1, 4, 4, "wgmma_tma")), (1, T(64, 96, 128, 1, 1, 4, 1, "wgmma_tma")),
                 (1, T(64, 192, 128, 1, 1, 4, 2, "wgmma_tma"))]}
    for tok, items in plan.items():
        ch = wl.chain(tokens=tok)
        for j, t in items:
            a = ch.alone(j)
            c = Config((t,), "stream", "row", "block", "serial")
            ms = [b.measure(a, c) for _ in range(2)]
            print(f"{a.label:45s} {c.short():55s} " + " ".join("%.1f" % m.median_us if m.ok else f"FAIL {m.reason} {m.message[:120]}" for m in ms), flush=True)


if __name__ == "__main__":
    main()
