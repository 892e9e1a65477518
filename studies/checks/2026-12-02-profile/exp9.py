"""(exp9) Where does a 256-token stage lose against cuBLAS: feed or math? For each config, the
product's mainloop as built, exp8's early slot release and retire-each-chunk variants, and two
measurement-only variants that do not compute the right answer and are never verified:
"nomma" (the TMA ring and its barriers with no MMAs: the operand feed alone) and "noload" (the
MMAs and barriers with no copies: the math alone), "nostore" (no output stores), against "direct" (stores straight from the fragments, as before
the epilogue went through shared memory; "as built" is the staged epilogue). Plus 128x96x64 tiles in clusters of two
along M (weights multicast), the shape cuBLAS runs for GEMM1 at 256 tokens (its 96x128, 2x1).
Verified variants are verified before and after 3 interleaved rounds of 30."""
import dataclasses, hashlib, time
from statistics import median
import tuner.backends.gpu as gpu
import tuner.render
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
from tuner.render import render as real_render
import exp8

MMA = """          wgmma_k16(acc[0], wgmma_desc(a + atom * T::BM * 128 + kk * 32),
                    wgmma_desc(b + atom * T::BN * 128 + kk * 32));
"""
STORE = "    if (col < N) *reinterpret_cast<u32*>(C + (size_t)row * N + col) = pack2(v0, v1);\n"
EXPECT = "        mbar_expect_tx(bar, T::TX_BYTES);\n"
LOADS = ("        if (rm == 0) {\n", "        if (rn == 0) {\n")


def patch(src: str, v: str) -> str:
    if v == "early":
        assert exp8.OLD in src and exp8.OLD2 in src
        return src.replace(exp8.OLD, exp8.NEW).replace(exp8.OLD2, exp8.NEW2)
    if v == "wait0":
        assert exp8.W1 in src
        return src.replace(exp8.W1, exp8.W0)
    if v == "wait2":  # two chunks' MMAs in flight: slot it-2 goes back
        assert exp8.W1 in src
        return src.replace(exp8.W1, exp8.W1.replace("wgmma_wait<1>", "wgmma_wait<2>").replace("it > 0", "it > 1")
                           .replace("(it - 1)", "(it - 2)"))
    if v == "nostore":  # the epilogue computes but (almost surely) stores nothing: its stores' cost
        assert STORE in src
        return src.replace(STORE, STORE.replace("if (col < N)", "if (col < N && v0 == -12345.678f)"))
    if v == "nomma":
        assert MMA in src
        return src.replace(MMA, "          (void)a; (void)b;\n")
    if v == "noload":
        assert EXPECT in src and all(x in src for x in LOADS)
        src = src.replace(EXPECT, "        mbar_expect_tx(bar, 0);\n")
        for x in LOADS:
            src = src.replace(x, x.replace("if (", "if (false && "))
        return src
    raise ValueError(v)


cur = {"v": ""}


def patched(chain, config, fault="none"):
    tuner.render.STAGED_EPILOGUE = cur["v"] not in ("direct", "nostore")
    r = real_render(chain, config, fault)
    if cur["v"] in ("", "direct"):
        return r
    src = patch(r.source, cur["v"])
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


VARIANTS = ("", "direct", "early", "wait0", "wait2", "nomma", "noload", "nostore")
UNVERIFIED = {"nomma", "noload", "nostore"}
PLAN = [(256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), VARIANTS),
        (256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 1, 1), ("", "direct", "early", "wait2")),
        (256, 1, T(128, 192, 64, 2, 1, 5, 1, "wgmma_tma", 2, 1), ("", "early", "nomma")),
        (256, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1), ("", "direct", "early", "nomma", "noload", "nostore")),
        (256, 0, T(128, 96, 64, 2, 1, 5, 1, "wgmma_tma", 2, 1), ("", "direct", "early", "wait2", "nomma", "noload")),
        (256, 0, T(128, 96, 64, 2, 1, 6, 1, "wgmma_tma", 2, 1), ("", "early")),
        (256, 0, T(128, 96, 64, 2, 1, 7, 1, "wgmma_tma", 2, 1), ("", "early", "wait2", "nomma")),
        (256, 0, T(128, 96, 64, 2, 1, 8, 1, "wgmma_tma", 2, 1), ("", "early")),
        (256, 0, T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 2, 1), ("", "early", "wait2", "nomma", "noload")),
        (256, 1, T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 2, 1), ("", "early", "wait2", "nomma")),
        (2048, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), ("", "direct", "early", "nomma"))]


def main():
    gpu.render = patched
    b = gpu.GpuBackend(seed=53)
    wl = get_workload("gpt3")
    for tok, j, t, variants in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        c = Config((t,), "stream", "col", "block", "serial")
        runners = {}
        for v in variants:
            cur["v"] = v
            runner, m = b.load(a, c)
            if runner is None:
                print(a.label, v, "LOAD FAIL", m.message[:300], flush=True)
                continue
            if v not in UNVERIFIED:
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
        for v, runner in runners.items():
            if v not in UNVERIFIED:
                err, why = b.verify(a, runner)
                if why:
                    print(a.label, v, "VERIFY FAIL AFTER TIMING", why, err, flush=True)
        for v, x in ts.items():
            tag = (v or "as built") + (" (not verified: measurement only)" if v in UNVERIFIED else "")
            print(f"{a.label:42s} {c.short():50s} {tag:42s} {median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})",
                  flush=True)
        del runners


if __name__ == "__main__":
    main()
