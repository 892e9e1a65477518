"""Experiment: thread-block clusters with TMA multicast, stage alone and whole chain, one process.

Usage: python3 exp.py  (on the GPU host; writes $OUT/cluster.json and prints a table)."""
import json, os, sys, time
from pathlib import Path
from tuner.backends.gpu import GpuBackend
from tuner.bench import _precompile
from tuner.checker import check
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload

CL = ((1, 1), (2, 1), (1, 2), (2, 2))


def tiles(bm, bn, bk, st, sk=1):
    return [T(bm, bn, bk, bm // 64, 1, st, sk, "wgmma_tma", cm, cn) for cm, cn in CL]


PLAN = {  # tokens -> (gemm1 tilings, gemm2 tilings)
    256: (tiles(128, 96, 128, 4) + tiles(128, 96, 64, 6) + tiles(128, 192, 64, 4, 2) + tiles(128, 128, 64, 6),
          tiles(128, 192, 64, 4) + tiles(128, 96, 128, 4) + tiles(128, 128, 64, 6)),
    64: ([T(64, 48, 256, 1, 1, 4, 1, "wgmma_tma", 1, cn) for cn in (1, 2, 4)],
         [T(64, 96, 128, 1, 1, 4, 1, "wgmma_tma", 1, cn) for cn in (1, 2, 4)]),
    2048: (tiles(128, 192, 64, 4), tiles(128, 192, 64, 4)),
}


def main():
    OUT = Path(os.environ.get("OUT", "/tmp"))
    wl = get_workload("gpt3")
    b = GpuBackend(seed=5)
    dev = b.device_info()
    plan = []
    for tok, per_stage in PLAN.items():
        ch = wl.chain(tokens=tok)
        for j, ts in enumerate(per_stage):
            alone = ch.alone(j)
            for t in ts:
                c = Config((t,), "stream", "row", "block", "serial")
                if c.grids(alone)[0].mt % t.cm == 0 and c.grids(alone)[0].nt % t.cn == 0:
                    plan.append((alone, c))
        if tok == 256:
            for cl in CL:
                for combo in (("stream", "row", "block", "serial"), ("row", "row", "block", "two_stream")):
                    c = Config((T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", *cl), T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", *cl)), *combo)
                    if check(ch, c) is None:
                        plan.append((ch, c))
    t0 = time.time()
    _precompile(plan, dev.arch, os.cpu_count())
    print(f"compiled {len(plan)} in {time.time() - t0:.0f}s", flush=True)
    rows = []
    for ch, c in plan:
        m = b.measure(ch, c)
        rows.append(dict(label=ch.label, config=c.to_dict(), short=c.short(), ok=m.ok, us=m.median_us,
                         reason=m.reason, message=m.message[:300], resources=m.resources))
        print(f"{ch.label:48s} {c.short():70s} {'%.1f' % m.median_us if m.ok else 'FAIL ' + str(m.reason) + ' ' + m.message[:200]}", flush=True)
    (OUT / "cluster.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
