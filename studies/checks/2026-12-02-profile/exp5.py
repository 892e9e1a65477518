"""(exp5) Is the weights' memory layout what holds the DRAM stream back? Each B box is BN rows of
128 bytes, each row 12-24 KB from the next. "packed" stores W chunk by chunk instead, as
[N/BN][K/64][BN][64], so every box is one contiguous BN*128-byte block; the kernel addresses it
as a (N*K/64) x 64 matrix. Everything else as exp1's nofence+spin (hint: exp1's L2 hints)."""
import dataclasses, hashlib, time
from statistics import median
import tuner.backends.gpu as gpu
import tuner.backends.tensormap as tm
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
import exp1

cur = {"v": set(), "bn": 0, "kc": 0}
packed = {}  # id of a weight array -> (weight, packed copy)


def patched(chain, config, fault="none"):
    v = cur["v"]
    exp1.cur["v"] = {"nofence", "spin"} | ({"hint"} if "hint" in v else set())
    r = exp1.patched(chain, config, fault)
    src = r.source
    if "packed" in v:
        n = 0
        for old in ("kc * T::BK + atom * 64, n0", ):
            n += src.count(old)
            src = src.replace(old, f"0, ((n0 / T::BN) * {cur['kc']} + kc) * T::BN")
        assert n >= 1, "B load not found"
        assert "static_assert(T::ATOMS == 1" not in src
        src = src.replace("  const int nk = kc_end - kc_begin;\n  constexpr int MMA_WARPS",
                          "  const int nk = kc_end - kc_begin;\n  static_assert(T::ATOMS == 1, \"packed: BK 64\");\n  constexpr int MMA_WARPS")
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


def pack_of(w, bn):
    import cupy as cp
    n, k = w.shape
    key = id(w)
    if key not in packed:
        packed[key] = (w, cp.empty((n * k // 64, 64), dtype=w.dtype), bn)
    _, p, _ = packed[key]
    p[...] = w.reshape(n // bn, bn, k // 64, 64).transpose(0, 2, 1, 3).reshape(n * k // 64, 64)
    return p


real_refresh = gpu.Problem.refresh


def refresh(self, seed):
    real_refresh(self, seed)
    for w, p, bn in packed.values():
        pack_of(w, bn)


real_pack = tm.pack


def pack(maps, buffers):
    if "packed" in cur["v"]:
        buffers = dict(buffers)
        out = []
        for m in maps:
            if m.operand.startswith("w"):
                buffers[m.operand] = pack_of(buffers[m.operand], cur["bn"])
                m = dataclasses.replace(m, rows=m.rows * m.cols // 64, cols=64)
            out.append(m)
        maps = out
    return real_pack(maps, buffers)


PLAN = [(256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), "row", [(), ("packed",)]),
        (256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 1, 1), "row", [(), ("packed",)]),
        (256, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1), "row", [(), ("hint",), ("packed",), ("hint", "packed")]),
        (256, 0, T(128, 96, 64, 2, 1, 7, 1, "wgmma_tma", 1, 2), "row", [(), ("packed",)]),
        (128, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 1, 2), "row", [(), ("packed",)]),
        (2048, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), "col", [(), ("packed",)])]


def main():
    gpu.render = patched
    gpu.Problem.refresh = refresh
    tm.pack = pack
    b = gpu.GpuBackend(seed=37)
    wl = get_workload("gpt3")
    for tok, j, t, order, variants in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        c = Config((t,), "stream", order, "block", "serial")
        cur["bn"], cur["kc"] = t.bn, a.stages[0].k // t.bk
        runners = {}
        for v in variants:
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
            print(f"{a.label:42s} {c.short():50s} {'+'.join(v) or 'ns':12s} "
                  f"{median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners
        packed.clear()


if __name__ == "__main__":
    main()
