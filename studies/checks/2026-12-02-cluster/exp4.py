"""Where does split-K's time go (gemm1, 256 tokens)? Timing only, variants with parts of the
split-K tail cut out (their answers are wrong on purpose, so they are not verified); then the
clocks and power under a sustained run of our chain and of the cuBLAS chain."""
import dataclasses, hashlib, json, os, subprocess, time
from pathlib import Path
from statistics import median
import tuner.backends.gpu as gpu
from tuner.render import render as real_render
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload

HEAD = "  // Split-K: store this split's partial sums"
CUTS = {
    "full": None,
    "no split-K tail": (HEAD, "  // Epilogue and store."),
    "store+arrive, no reduce": ("    if (!is_last) return;\n", "    if (!is_last) return;\n"),  # handled below
}
current = {"cut": None}


def patched(chain, config, fault="none"):
    r = real_render(chain, config, fault)
    src = r.source
    cut = current["cut"]
    if cut == "no split-K tail":
        i, j = src.index(HEAD), src.index("  // Epilogue and store.")
        src = src[:i] + src[j:]
    elif cut == "store+arrive, no reduce":
        a = src.index("    __threadfence();\n    for_each_pair<T>(m0, n0, [&](int i, int j, int e, int row, int col) {\n      if (row < M) {\n#pragma unroll 1")
        b = src.index("  // Epilogue and store.")
        src = src[:a] + "  }\n" + src[b:]
    elif cut == "epilogue only, no partial store":
        a = src.index("    float* part =")
        b = src.index("    __threadfence();\n    __syncthreads();\n    __shared__ u32 is_last;")
        src = src[:a] + src[b:]
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


def main():
    OUT = Path(os.environ.get("OUT", "/tmp"))
    gpu.render = patched
    b = gpu.GpuBackend(seed=11)
    wl = get_workload("gpt3")
    a = wl.chain(tokens=256).alone(0)
    cfgs = {"128x96 k1": Config((T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 2, 1),), "stream", "row", "block", "serial"),
            "128x192 k2": Config((T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1),), "stream", "row", "block", "serial"),
            "128x192 k1 (64 blocks)": Config((T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1),), "stream", "row", "block", "serial")}
    for name, c in cfgs.items():
        cuts = ["full"] if "k2" not in name else ["full", "no split-K tail", "store+arrive, no reduce", "epilogue only, no partial store"]
        for cut in cuts:
            current["cut"] = None if cut == "full" else cut
            runner, m = b.load(a, c)
            if runner is None:
                print(name, cut, "LOAD FAIL", m.message[:300]); continue
            ts = [median(runner.time(5, 30)) for _ in range(3)]
            print(f"{name:24s} {cut:34s} {' '.join('%.1f' % t for t in ts)}", flush=True)
    current["cut"] = None
    # Clocks and power, sustained: 1.5 s of back-to-back chains each, ours then cuBLAS then torch.
    from tuner.baselines import baseline_timers
    ch = wl.chain(tokens=256)
    best = Config((T(128, 96, 128, 2, 1, 4, 1, "wgmma_tma", 2, 1), T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1)),
                  "stream", "row", "block", "serial")
    runner, m = b.load(ch, best)
    p = b.problem(ch)
    timers = {"ours": lambda w, r: runner.time(w, r), **baseline_timers(ch, p.xs[0], p.ws[0])}
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader", "-lms", "50"], stdout=open(OUT / "smi.csv", "w"))
    marks = []
    try:
        for name, timer in timers.items():
            time.sleep(1.0)
            marks.append((name, time.time()))
            series = [round(median(timer(0, 100)), 1) for _ in range(12)]
            marks.append((name + " end", time.time()))
            print(f"sustained {name:28s} {series}", flush=True)
    finally:
        time.sleep(0.3)
        smi.terminate()
    (OUT / "marks.json").write_text(json.dumps(marks))


if __name__ == "__main__":
    main()
