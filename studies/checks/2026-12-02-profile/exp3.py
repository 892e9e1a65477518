"""(exp3) Split each multicast operand between the cluster's blocks ("coop"): with CM blocks sharing
B, block rm loads rows [rm*BN/CM, (rm+1)*BN/CM) of every B slab and multicasts them to its column,
instead of block 0 loading all of it; the same for A across CN. Each block still expects the whole
stage's bytes. Variants on top of exp1's nofence+spin (ns), with and without exp1's L2 hints."""
import dataclasses, hashlib, time
from statistics import median
import tuner.backends.gpu as gpu
import tuner.backends.tensormap as tm
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
import exp1

OLD_B = """        if (rm == 0) {
#pragma unroll
          for (int atom = 0; atom < T::ATOMS; ++atom) {
            const u32 dst = sB + slot * T::B_BYTES + atom * T::BN * 128;
            if constexpr (T::CM > 1) tma_load_2d_multicast(dst, mapB, bar, kc * T::BK + atom * 64, n0, b_mask);
            else tma_load_2d(dst, mapB, bar, kc * T::BK + atom * 64, n0);
          }
        }
        if (rn == 0) {
          wait_one(kc, it == 0);
#pragma unroll
          for (int atom = 0; atom < T::ATOMS; ++atom) {
            const u32 dst = sA + slot * T::A_BYTES + atom * T::BM * 128;
            if constexpr (T::CN > 1) tma_load_2d_multicast(dst, mapA, bar, kc * T::BK + atom * 64, m0, a_mask);
            else tma_load_2d(dst, mapA, bar, kc * T::BK + atom * 64, m0);
          }
        }
"""
NEW_B = """        {
          constexpr int BR = T::BN / T::CM;
#pragma unroll
          for (int atom = 0; atom < T::ATOMS; ++atom) {
            const u32 dst = sB + slot * T::B_BYTES + atom * T::BN * 128 + rm * BR * 128;
            if constexpr (T::CM > 1) LOADBM(dst, mapB, bar, kc * T::BK + atom * 64, n0 + rm * BR, b_mask HB);
            else LOADB(dst, mapB, bar, kc * T::BK + atom * 64, n0 HB);
          }
        }
        {
          constexpr int AR = T::A_ROWS / T::CN;
          wait_one(kc, it == 0);
#pragma unroll
          for (int atom = 0; atom < T::ATOMS; ++atom) {
            const u32 dst = sA + slot * T::A_BYTES + atom * T::BM * 128 + rn * AR * 128;
            if constexpr (T::CN > 1) LOADAM(dst, mapA, bar, kc * T::BK + atom * 64, m0 + rn * AR, a_mask HA);
            else LOADA(dst, mapA, bar, kc * T::BK + atom * 64, m0 HA);
          }
        }
"""
cur = {"v": set(), "cm": 1, "cn": 1}


def patched(chain, config, fault="none"):
    v = cur["v"]
    exp1.cur["v"] = {"nofence", "spin"} | ({"hint"} if "hint" in v else set()) if "ns" in v else set()
    r = exp1.patched(chain, config, fault)
    src = r.source
    if "coop" in v:
        old = OLD_B
        if "hint" in v:
            old = (old.replace(exp1.LB, "tma_h(dst, mapB, bar, kc * T::BK + atom * 64, n0, l2_policy(true));")
                   .replace(exp1.LBM, "tma_hm(dst, mapB, bar, kc * T::BK + atom * 64, n0, b_mask, l2_policy(true));")
                   .replace(exp1.LA, "tma_h(dst, mapA, bar, kc * T::BK + atom * 64, m0, l2_policy(false));")
                   .replace(exp1.LAM, "tma_hm(dst, mapA, bar, kc * T::BK + atom * 64, m0, a_mask, l2_policy(false));"))
            new = (NEW_B.replace("LOADBM", "tma_hm").replace("LOADB", "tma_h").replace("LOADAM", "tma_hm")
                   .replace("LOADA", "tma_h").replace(" HB", ", l2_policy(true)").replace(" HA", ", l2_policy(false)"))
        else:
            new = (NEW_B.replace("LOADBM", "tma_load_2d_multicast").replace("LOADB", "tma_load_2d")
                   .replace("LOADAM", "tma_load_2d_multicast").replace("LOADA", "tma_load_2d")
                   .replace(" HB", "").replace(" HA", ""))
        assert old in src, "producer block not found"
        src = src.replace(old, new)
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


real_pack = tm.pack


def pack(maps, buffers):
    if "coop" in cur["v"]:
        maps = [dataclasses.replace(m, box_rows=m.box_rows // (cur["cm"] if m.operand.startswith("w") else cur["cn"]))
                for m in maps]
    return real_pack(maps, buffers)


VARIANTS = [(), ("ns",), ("ns", "coop"), ("ns", "hint"), ("ns", "hint", "coop")]
PLAN = [(256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1)),
        (256, 1, T(128, 192, 64, 2, 1, 5, 1, "wgmma_tma", 2, 1)),
        (256, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1)),
        (256, 0, T(128, 96, 64, 2, 1, 7, 1, "wgmma_tma", 1, 2)),
        (256, 0, T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 1, 2)),
        (128, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 1, 2)),
        (2048, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1)),
        (2048, 0, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 1, 2))]


def main():
    gpu.render = patched
    tm.pack = pack
    b = gpu.GpuBackend(seed=29)
    wl = get_workload("gpt3")
    for tok, j, t in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        c = Config((t,), "stream", "row", "block", "serial")
        cur["cm"], cur["cn"] = t.cm, t.cn
        runners = {}
        for v in VARIANTS:
            cur["v"] = set(v)
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
            print(f"{a.label:42s} {c.short():50s} {'+'.join(v) or 'as built':16s} "
                  f"{median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    main()
