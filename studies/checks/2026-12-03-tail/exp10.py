"""(exp10) Two changes to the ends of a stage, on the bench's picks at 1-256 tokens, each chain
timed against the CuPy cuBLAS chain and PyTorch's best in the same interleaved rounds.

* The split-K tail as built (splits take arrival numbers first; only the non-last ones store
  partials) against "oldtail" (every split stores, the last to arrive adds the others': the
  template before, kept in old/chain.cu.j2).
* "pfP": once its last copy is issued, each GEMM1 block's producer thread prefetches into L2 its
  share of the first P 128-byte pieces of every GEMM2 weight row (TMA tensor prefetches of
  GEMM2's own boxes), so the DRAM time of GEMM1's tail, its split-K reduction and the launch
  gap is spent on the weights GEMM2 reads first. P=8/16/24 is 12.6/25/38 MB of the 151 MB.
Every variant is verified (fresh inputs, poisoned output, float32 reference) before and after
3 interleaved rounds of 30 runs, each after 0.3 s idle."""
import dataclasses, hashlib, pathlib, sys, time
from statistics import median
import jinja2
import tuner.backends.gpu as gpu
import tuner.render
from tuner.baselines import baseline_timers
from tuner.config import Config, StageTiles as T, cdiv
from tuner.workloads import get_workload
from tuner.render import render as real_render

HERE = pathlib.Path(__file__).resolve().parent
OLD_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "old")), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
END = "          }\n        }\n      }\n    }\n  } else {\n    const int wg"
CALL = "TUNER_ERR, wait_one);"


def add_prefetch(r, config: Config, chain, P: int) -> str:
    src = r.source
    assert src.count(END) == 1 and src.count(CALL) == 2
    src = src.replace("template <class T, bool B_ONCE, class WaitOne>", "template <class T, bool B_ONCE, class WaitOne, class After>")
    src = src.replace("u32* err, WaitOne wait_one) {", "u32* err, WaitOne wait_one, After after) {")
    src = src.replace(END, END.replace("      }\n    }\n  } else", "      }\n      after();\n    }\n  } else"))
    wmap = next(m for m in r.tensor_maps if m.operand == "w1")
    nt2, p = cdiv(wmap.rows, wmap.box_rows), min(P, cdiv(wmap.cols, 64))
    blocks0 = config.grids(chain)[0].blocks
    pf = (f"[&]() {{\n    for (u32 j = t; j < {nt2 * p}u; j += {blocks0}u) {{\n"
          f"      const u32 n = j % {nt2}u, k = j / {nt2}u;\n"
          f'      asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {{%1, %2}}];" '
          f':: "l"(tmaps + {16 * wmap.slot}), "r"(k * 64u), "r"(n * {wmap.box_rows}u) : "memory");\n    }}\n  }}')
    cut = src.index("__device__ __forceinline__ void stage1_tile(")
    head, tail = src[:cut], src[cut:]
    return head.replace(CALL, f"TUNER_ERR, wait_one, {pf});") + tail.replace(CALL, "TUNER_ERR, wait_one, []() {});")


cur = {"v": ""}


def patched(chain, config, fault="none"):
    v = cur["v"]
    if v == "oldtail":
        saved = tuner.render._env
        tuner.render._env = lambda: OLD_ENV
        try:
            return real_render(chain, config, fault)
        finally:
            tuner.render._env = saved
    r = real_render(chain, config, fault)
    if not v:
        return r
    assert v.startswith("pf")
    src = add_prefetch(r, config, chain, int(v[2:]))
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


TMA = "wgmma_tma"
C256 = (T(128, 192, 64, 2, 1, 4, 2, TMA, 2, 1), T(128, 192, 64, 2, 1, 4, 1, TMA, 2, 1))
PLAN = [
    (256, Config((T(128, 192, 64, 2, 1, 4, 2, TMA), T(128, 192, 64, 2, 1, 4, 1, TMA)), "stream", "col", "block", "serial"),
     ("", "oldtail", "pf8", "pf16", "pf24")),
    (256, Config(C256, "stream", "col", "block", "serial"), ("", "oldtail", "pf8", "pf16", "pf24")),
    (256, Config(C256, "row", "col", "block", "two_stream"), ("", "pf16")),
    (128, Config((T(128, 96, 128, 2, 1, 4, 2, TMA), T(128, 96, 128, 2, 1, 4, 1, TMA)), "row", "row", "block", "two_stream"),
     ("", "oldtail", "pf8", "pf16", "pf24")),
    (64, Config((T(64, 48, 256, 1, 1, 4, 1, TMA), T(64, 96, 128, 1, 1, 5, 1, TMA)), "row", "row", "block", "two_stream"),
     ("", "pf8", "pf16", "pf24")),
    (1, Config((T(64, 48, 128, 1, 1, 6, 1, TMA), T(64, 96, 128, 1, 1, 4, 1, TMA)), "row", "row", "ticket", "fused"),
     ("", "pf8", "pf16", "pf24")),
]
BASELINES = ("cupy cublas", "torch graph+cublasLt gelu")


def compile_all(arch: str = "sm_90a") -> None:
    """CPU side: fill the cache with every variant's cubin."""
    from tuner.compile import compile_source
    wl = get_workload("gpt3")
    for tok, c, variants in PLAN:
        ch = wl.chain(tokens=tok)
        for v in variants:
            cur["v"] = v
            compile_source(patched(ch, c).source, arch)
            print("compiled", tok, c.short(), v or "as built", flush=True)


def main():
    gpu.render = patched
    b = gpu.GpuBackend(seed=61)
    wl = get_workload("gpt3")
    for tok, c, variants in PLAN:
        ch = wl.chain(tokens=tok)
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
            runners[v] = runner
            timers[v or "as built"] = lambda w, n, runner=runner: runner.time(w, n)
        p = b.problem(ch)
        timers.update({k: f for k, f in baseline_timers(ch, p.xs[0], p.ws[0]).items() if k in BASELINES})
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
        cub = median(ts["cupy cublas"])
        for k, x in ts.items():
            print(f"{ch.label:36s} {c.short():64s} {k:26s} {median(x):7.1f}  x{cub / median(x):.3f} vs cuBLAS"
                  f"  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    compile_all() if sys.argv[1:] == ["compile"] else main()
