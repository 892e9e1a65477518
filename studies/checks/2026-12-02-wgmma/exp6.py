"""Experiment: wgmma tilings (model-ranked, diversified) vs our previous best vs cuBLAS/PyTorch, one process."""
# Ran against the working tree between commits 64bbd26 and a3e8c22; the model helpers it imports
# (_tilings, SEED_COMBOS) have since left tuner/model.py, so it does not run at later commits.
import json, os, sys, time
from pathlib import Path
from tuner.backends.gpu import GpuBackend
from tuner.backends.replay import write_recording
from tuner.baselines import measure_baselines, read_bandwidth, gemm_rate, floor_us
from tuner.bench import _precompile
from tuner.checker import check
from tuner.config import Config, StageGrid
from tuner.model import _tilings, stage_seconds, SEED_COMBOS
from tuner.space import load_space
from tuner.workloads import get_workload


def main():
    global b, dev, per, space, old, kinds
    OUT = Path(os.environ.get("OUT", "/tmp"))
    tokens = [int(x) for x in sys.argv[1].split(",")]
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else ["wgmma_tma"]
    wl = get_workload("gpt3")
    if os.environ.get("DRY"):
        from tuner.backends.base import DeviceInfo
        dev = DeviceInfo("H200 (dry)")
    else:
        b = GpuBackend(seed=3)
        dev = b.device_info()
    space = load_space("search_spaces/gpt3.toml")
    old = {r["tokens"]: r for r in json.load(open("studies/gpt3.bench.json"))["rows"]} if Path("studies/gpt3.bench.json").exists() else {}

    def diverse(chain, feas, kind):
        out = []
        for st in chain.stages:
            grids = [StageGrid(st, t) for t in _tilings(st.m, kind)]
            grids = [g for g in grids if feas._stage_reason(g) is None]
            grids.sort(key=lambda g: stage_seconds(g, dev))
            seen, pick = set(), []
            for g in grids:
                t = g.tiles
                key = (t.bm, t.bn, t.bk, t.split_k, t.wn)
                if key in seen: continue
                seen.add(key); pick.append(t)
                if len(pick) == per: break
            out.append(pick)
        return out

    plan = []
    for t in tokens:
        ch = wl.chain(tokens=t)
        feas = space.feasible(ch, dev)
        cfgs = []
        for kind in kinds:
            ranked = diverse(ch, feas, kind)
            for k in range(min(per, len(ranked[0]), len(ranked[1]))):
                for combo in SEED_COMBOS:
                    c = Config((ranked[0][k], ranked[1][k]), *combo)
                    if feas.contains(c) is None and check(ch, c) is None and c not in cfgs:
                        cfgs.append(c)
        for key in ("stream_config", "tile_config"):
            if old.get(t, {}).get(key):
                cfgs.append(Config.from_dict(old[t][key]))
        plan += [(ch, c) for c in cfgs]
    print({ch.label: sum(1 for c2, _ in plan if c2 is ch) for ch, _ in plan})
    if os.environ.get("DRY"):
        for ch, c in plan[:: max(1, len(plan) // 12)]: print(ch.label, c.short())
        sys.exit(0)
    t0 = time.time()
    _precompile(plan, dev.arch, os.cpu_count())
    print(f"compiled {len(plan)} in {time.time()-t0:.0f}s", flush=True)
    bw = read_bandwidth(302 * 2**20); rate = gemm_rate()
    print(f"bw {bw/1e12:.2f} TB/s, gemm {rate/1e12:.0f} TF", flush=True)
    records, summary = [], []
    for t in tokens:
        ch = wl.chain(tokens=t)
        res = []
        for c2, c in plan:
            if c2 is not ch and c2.label != ch.label: continue
            m = b.measure(ch, c)
            records.append({"label": ch.label, "config": c.to_dict(), "measurement": m.to_dict()})
            res.append((m.median_us if m.ok else float("inf"), c.short(), m.reason, m.message[:120], m.error))
        p = b.problem(ch)
        base = measure_baselines(ch, p.xs[0], p.ws[0])
        res.sort(key=lambda r: r[0])
        fails = [r for r in res if r[0] == float("inf")]
        line = f"== tokens {t}: floor {floor_us(ch, bw, rate):.1f}  " + "  ".join(f"{k} {v:.1f}" for k, v in base.items())
        print(line, flush=True)
        for r in res[:8]: print(f"   {r[0]:8.1f}  {r[1]}  err={r[4]}", flush=True)
        print(f"   failures {len(fails)}: " + "; ".join(f"{r[1]} {r[2]} {r[3]}" for r in fails[:4]), flush=True)
        summary.append(line)
        write_recording(OUT / "exp6.measurements.json", dev, records, "scratch/exp5.py")


if __name__ == "__main__":
    main()
