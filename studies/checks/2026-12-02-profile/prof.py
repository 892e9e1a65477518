"""Where does a 256-token GEMM's time go, ours against cuBLAS's? Modes:
  names           kernel names, grids and durations of PyTorch's best chain (torch profiler)
  ours TOK J      run one of our stage-alone configs a few times (for ncu)
  torch TOK       run PyTorch's cuBLASLt-GELU chain a few times (for ncu)"""
import sys, time, json
from statistics import median

PICKS = {  # the bench's picks at 256 tokens (studies/gpt3.bench.json)
    0: ("128 192 64 2 1 4 2 wgmma_tma 2 1"),
    1: ("128 192 64 2 1 4 1 wgmma_tma 2 1"),
}


def torch_chain(tok):
    import torch
    x = torch.randn(tok, 12288, dtype=torch.float16, device="cuda")
    w1 = torch.randn(6144, 12288, dtype=torch.float16, device="cuda") / 110
    w2 = torch.randn(12288, 6144, dtype=torch.float16, device="cuda") / 78
    b = torch.zeros(6144, dtype=torch.float16, device="cuda")
    return lambda: torch.mm(torch._addmm_activation(b, x, w1.t(), use_gelu=True), w2.t())


def names():
    import torch
    from torch.profiler import profile, ProfilerActivity
    for tok in (64, 128, 256, 512, 2048):
        fn = torch_chain(tok)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        p.export_chrome_trace(f"/tmp/tr{tok}.json")
        ev = [e for e in json.load(open(f"/tmp/tr{tok}.json"))["traceEvents"] if e.get("cat") == "kernel"]
        seen = {}
        for e in ev:
            a = e.get("args", {})
            k = (e["name"], str(a.get("grid")), str(a.get("block")), a.get("shared memory"), a.get("registers per thread"))
            seen.setdefault(k, []).append(e["dur"])
        print(f"== {tok} tokens")
        for k, d in seen.items():
            print(f"  {median(d):7.1f} us  grid={k[1]} block={k[2]} smem={k[3]} regs={k[4]}  {k[0][:160]}")


def ours(tok, j, reps=5):
    import tuner.backends.gpu as gpu
    from tuner.config import Config, StageTiles as T
    from tuner.workloads import get_workload
    f = PICKS[j].split()
    t = T(*map(int, f[:7]), f[7], int(f[8]), int(f[9]))
    a = get_workload("gpt3").chain(tokens=tok).alone(j)
    b = gpu.GpuBackend(seed=17)
    runner, m = b.load(a, Config((t,), "stream", "row", "block", "serial"))
    assert runner is not None, m.message
    print(a.label, t, "median us", median(runner.time(3, 5)))


def torch_run(tok):
    import torch
    fn = torch_chain(tok)
    for _ in range(8):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "names":
        names()
    elif mode == "ours":
        ours(int(sys.argv[2]), int(sys.argv[3]))
    else:
        torch_run(int(sys.argv[2]))
