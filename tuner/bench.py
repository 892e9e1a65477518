"""``python -m tuner bench``: our best stream-sync and tile-sync chains against the baselines and the floor.

Per token count: the cuBLAS chain a CuPy user writes, PyTorch's chains where PyTorch is
installed, our best stream-synchronized config, our best tile-synchronized config (the
coverage set, the space's baselines and a seeded random sample of the feasible space, each
verified before it is timed), and the floor computed from the bandwidth and GEMM rate
measured in the same run. Writes every measurement as a recording (the replay backend reads
it) and the summary table as JSON.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .cases import coverage, streaming
from .config import Config
from .workloads import Chain, get_workload


def _configs(chain: Chain, device, space_path: Path, sample: int, seed: int) -> list[Config]:
    """Baselines, the coverage set and a seeded uniform sample of the feasible space that the checker accepts."""
    from .checker import check
    from .space import load_space

    feas = load_space(space_path).feasible(chain, device)
    rng = np.random.default_rng(seed)
    seeds = [*coverage(chain), *streaming(chain)]
    out = list(dict.fromkeys([*feas.baselines(), *[c for c in seeds if feas.contains(c) is None]]))
    want, tries = len(out) + sample, 0
    while len(out) < want and tries < 50 * sample:
        c = feas.sample(rng)
        tries += 1
        if c not in out:
            out.append(c)
    return [c for c in out if check(chain, c) is None]


def _precompile(chains_configs: list[tuple[Chain, Config]], arch: str, jobs: int) -> None:
    from .compile import compile_many, target_arch
    from .render import render

    todo = [(i, render(ch, cfg).source) for i, (ch, cfg) in enumerate(chains_configs)]
    for _ in compile_many(todo, target_arch(arch), jobs):
        pass


def run_bench(workload: str, tokens: list[int], sample: int, seed: int, out: Path, space_path: Path,
              jobs: int = 0, log=print) -> dict[str, Any]:
    """Measure everything for every token count; returns (and writes) the summary."""
    import os

    from .backends.gpu import GpuBackend
    from .backends.replay import write_recording
    from .baselines import floor_us, gemm_rate, measure_baselines, read_bandwidth

    backend = GpuBackend(seed=seed)
    dev = backend.device_info()
    wl = get_workload(workload)
    chains = [wl.chain(**{wl.sweep_param: t}) for t in tokens]
    plan = [(ch, cfg) for ch in chains for cfg in _configs(ch, dev, space_path, sample, seed)]
    t0 = time.time()
    _precompile(plan, dev.arch, jobs or os.cpu_count() or 4)
    log(f"compiled {len(plan)} configs in {time.time() - t0:.1f}s")
    rate = gemm_rate()
    bw = read_bandwidth(max(ch.min_bytes for ch in chains))
    log(f"measured ceilings: read bandwidth {bw / 1e12:.2f} TB/s, fp16 GEMM {rate / 1e12:.0f} TFLOP/s")
    command = "python -m tuner " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    rec_path = out.with_name(out.name.replace(".bench.json", "") + ".measurements.json")
    records, rows = [], []
    summary: dict[str, Any] = {}
    for ch in chains:
        cfgs = [c for c2, c in plan if c2 is ch]
        best: dict[str, tuple[float, Config]] = {}
        fails: dict[str, int] = {}
        for cfg in cfgs:
            m = backend.measure(ch, cfg)
            records.append({"label": ch.label, "config": cfg.to_dict(), "measurement": m.to_dict()})
            if not m.ok:
                fails[m.reason] = fails.get(m.reason, 0) + 1
                continue
            kind = "stream" if cfg.policy == "stream" else "tile"
            if kind not in best or m.median_us < best[kind][0]:
                best[kind] = (m.median_us, cfg)
        p = backend.problem(ch)
        base = measure_baselines(ch, p.xs[0], p.ws[0])
        fl = floor_us(ch, bw, rate)
        ours = min(v[0] for v in best.values()) if best else float("nan")
        row = {"label": ch.label, "tokens": ch.size_dict[wl.sweep_param], "floor_us": round(fl, 2),
               "baselines_us": base, "configs": len(cfgs), "failures": fails,
               "stream_us": best.get("stream", (None,))[0], "tile_us": best.get("tile", (None,))[0],
               "tuned_us": ours,
               "stream_config": best["stream"][1].to_dict() if "stream" in best else None,
               "tile_config": best["tile"][1].to_dict() if "tile" in best else None}
        rows.append(row)
        log(_row_text(row))
        # Written after every size, so an interrupted bench keeps what it measured.
        summary = {"schema": 1, "kind": "tuner-bench", "workload": workload, "device": dev.to_dict(),
                   "command": command, "read_bandwidth_Bps": bw, "gemm_flops": rate, "rows": rows}
        out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        write_recording(rec_path, dev, records, command)
    log(table(summary))
    return summary


def _row_text(r: dict[str, Any]) -> str:
    b = ", ".join(f"{k} {v:.1f}" for k, v in r["baselines_us"].items())
    return (f"{r['label']}: tuned {r['tuned_us']:.1f} µs (stream {r['stream_us']}, tile {r['tile_us']}), "
            f"floor {r['floor_us']:.1f}; {b}; failures {r['failures']}")


def table(summary: dict[str, Any]) -> str:
    """The bench summary as a text table: times in µs and ratios (>1 means we are faster)."""
    names = sorted({k for r in summary["rows"] for k in r["baselines_us"]})
    head = ["tokens", "floor", "ours stream", "ours tile", "tuned", *names, "tuned/floor",
            *(f"x vs {n}" for n in names), "tile vs stream"]
    lines = ["  ".join(head)]
    for r in summary["rows"]:
        tuned = r["tuned_us"]
        f = lambda v: "-" if v is None else f"{v:.1f}"
        vs = [f"{r['baselines_us'][n] / tuned:.2f}" if n in r["baselines_us"] else "-" for n in names]
        tvs = f"{r['stream_us'] / r['tile_us']:.2f}" if r["stream_us"] and r["tile_us"] else "-"
        lines.append("  ".join([str(r["tokens"]), f(r["floor_us"]), f(r["stream_us"]), f(r["tile_us"]), f(tuned),
                                *(f(r["baselines_us"].get(n)) for n in names), f"{tuned / r['floor_us']:.2f}", *vs, tvs]))
    return "\n".join(lines)


def main(args) -> int:
    """CLI entry: ``bench WORKLOAD [--tokens LIST] [--trials N] [--out PATH]``."""
    from .backends.gpu import gpu_available
    from .paths import home

    if not gpu_available():
        from .cli import UsageError

        raise UsageError("bench needs a CUDA GPU and none is visible (study runs without one, on recordings)")
    wl = get_workload(args.workload)
    tokens = list(args.tokens or wl.sweep)
    out = Path(args.out or f"studies/{args.workload}.bench.json")
    space = home() / "search_spaces" / f"{args.workload}.toml"
    run_bench(args.workload, tokens, args.trials or 40, getattr(args, "seed", 0) or 0, out, space)
    return 0
