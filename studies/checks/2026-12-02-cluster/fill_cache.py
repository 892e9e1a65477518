"""Compile the GPU tests' configs (coverage of every MMA kind, and the clustered ones) in parallel first."""
import sys
from tuner.cases import clustered, coverage
from tuner.compile import compile_many, target_arch
from tuner.render import render
from tuner.workloads import get_workload


def main():
    sizes = [("gpt3", dict(tokens=1000, hidden=1032, ffn=776))] + [("gpt3", dict(tokens=t)) for t in (1, 64, 256, 1000, 2048)] \
        + [("llama", dict(tokens=100, hidden=1032, ffn=776))]
    items = []
    for wl, size in sizes:
        ch = get_workload(wl).chain(**size)
        cfgs = [c for mma in ("sync", "wgmma", "wgmma_tma") for c in coverage(ch, mma)] + clustered(ch)
        items += [((ch.label, c.short()), render(ch, c).source) for c in cfgs]
    n = sum(1 for k, m in compile_many(items, target_arch("sm_90"), int(sys.argv[1])) if not isinstance(m, Exception))
    print(f"{n} of {len(items)} compiled")


if __name__ == "__main__":
    main()
