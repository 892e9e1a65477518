"""Where a chain's time goes on the GPU: every kernel's start and duration, ours beside PyTorch's.

    python benchmarks/timeline.py RECORDING --label TEXT [--rank N] [--replays N]

Picks a recorded config as ``profile_config.py`` does (the fastest measured config whose label
contains TEXT), checks it against the float32 reference, captures it in CUDA graphs (one per
input set, as ``bench --graphs`` times it) and PyTorch's graph of the same chain over the same
input sets, and replays each back to back under the PyTorch profiler (CUPTI). For each kernel of
a replay it prints the median start, measured from the replay's first kernel, and the median
duration; then the median span of a replay and the period between replays' first kernels.
Last, event-timed medians of both in the same process, and PyTorch's graph replayed on one input
set only: the figure a benchmark that does not rotate its inputs would report (its weights then
stay in L2 when they fit there).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_config import load_target, target_arguments  # noqa: E402 - the script beside this one

from tuner.bench.baselines import rotating, time_torch, torch_chains  # noqa: E402


def kernels(run, replays: int) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every kernel that ``replays`` calls of ``run`` ran, by start."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize()
    out = [(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
           if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()
           and "memset" not in e.name.lower()]
    return sorted(out, key=lambda k: k[1])


def show(title: str, ks: list[tuple[str, float, float]], replays: int) -> None:
    per = len(ks) // replays
    if per == 0 or len(ks) % replays:
        print(f"{title}: {len(ks)} kernels traced in {replays} replays; no per-replay view")
        return
    groups = [ks[r * per:(r + 1) * per] for r in range(replays)]
    print(f"\n{title}: {per} kernels per replay (medians of {replays} replays, µs)")
    print(f"  {'kernel':<64} {'start':>7} {'time':>7} {'end':>7}")
    for j in range(per):
        starts = [g[j][1] - g[0][1] for g in groups]
        durs = [g[j][2] for g in groups]
        ends = [s + d for s, d in zip(starts, durs)]
        print(f"  {groups[0][j][0][:64]:<64} {median(starts):7.2f} {median(durs):7.2f} {median(ends):7.2f}")
    spans = [max(k[1] + k[2] for k in g) - g[0][1] for g in groups]
    periods = [b[0][1] - a[0][1] for a, b in zip(groups, groups[1:])]
    print(f"  span of a replay {median(spans):.2f}, period between replays {median(periods):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target_arguments(ap)
    ap.add_argument("--replays", type=int, default=20, help="replays traced (default 20)")
    args = ap.parse_args()
    rec, chain, runner, err = load_target(args, device_epoch=True)
    config = rec.config
    runner.capture()
    p = runner.problem
    sets = len(p.xs)
    ours = rotating([lambda g=g: g.launch(runner.streams[0]) for g in runner.graphs])
    theirs = [torch_chains(chain, x, ws) for x, ws in zip(p.xs, p.ws)]
    name = "torch graph" if "torch graph" in theirs[0] else None
    print(f"{rec.label}: {config.short()}, error {err:.1e}, {sets} input sets")
    for _ in range(20):
        ours()
    show("ours, CUDA graphs", kernels(ours, args.replays), args.replays)
    if name is None:
        print("PyTorch is not installed here: no baseline")
        return 0
    torch_graph = rotating([t[name] for t in theirs])
    for _ in range(20):
        torch_graph()
    show(f"PyTorch, {name}", kernels(torch_graph, args.replays), args.replays)
    ours_us = median(runner.time_graphs(20, 200))
    theirs_us = median(time_torch(torch_graph, 20, 200))
    one_set_us = median(time_torch(theirs[0][name], 20, 200))
    print(f"\nevents, median of 200: ours {ours_us:.2f} µs, PyTorch {theirs_us:.2f} µs over {sets} input sets, "
          f"{one_set_us:.2f} µs on one input set")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
