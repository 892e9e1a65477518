"""A bundle's tuned chains run through tuner.shipping.runtime, against the same configs timed as bench times them.

    python -m tuner export WORKLOAD --format bundle -o BUNDLE
    python benchmarks/runtime_vs_bench.py BUNDLE [BUNDLE ...] [--rounds 5] [--json F]

Per entry, in one process on the GPU: the runtime's output on the bench's random inputs against
the float32 reference of the chain (from CuPy and from PyTorch); then, in interleaved rounds after
idle as bench's final rounds are, three timings over the same rotating input sets: bench's own
(the config's runner, runs queued back to back), the runtime called from Python, and the runtime
captured in CUDA graphs and replayed. Prints the medians of rounds and the runtime / bench ratios.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.backends.gpu import VERIFY_TOL, GpuBackend, _time_runs, reference, rel_error  # noqa: E402
from tuner.chain.workloads import get_workload  # noqa: E402
from tuner.config import Config  # noqa: E402
from tuner.shipping.runtime import load  # noqa: E402


def measure_entry(backend: GpuBackend, rt, manifest: dict, rounds: int) -> dict:
    """Errors and medians of rounds (µs) of one bundle entry."""
    import cupy as cp

    chain = get_workload(manifest["workload"]).chain(**manifest["size"])
    cfg = Config.from_dict(manifest["config"])
    p = backend.problem(chain)
    sets = len(p.xs)
    ref = reference(chain, p.xs[0], p.ws[0])
    row = {"label": manifest["label"], "config": cfg.short(), "sets": sets,
           "error_cupy": rel_error(rt(p.xs[0], *p.ws[0]), ref)}
    try:
        import torch

        tx, tw = torch.as_tensor(p.xs[0], device="cuda"), [torch.as_tensor(w, device="cuda") for w in p.ws[0]]
        row["error_torch"] = rel_error(cp.asarray(rt(tx, *tw)), ref)
    except ImportError:
        pass
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for i in range(sets):  # one graph per input set; the runtime's module loads before any capture
            rt(p.xs[i], *p.ws[i])
            stream.begin_capture()
            out = rt(p.xs[i], *p.ws[i])
            graphs.append((stream.end_capture(), out))
        graph0, out0 = graphs[0]
        out0[...] = 0
        graph0.launch(stream)
        stream.synchronize()
    row["error_graph"] = rel_error(out0, ref)
    bad = {k: v for k, v in row.items() if k.startswith("error_") and not v < VERIFY_TOL}
    if bad:
        raise SystemExit(f"{manifest['label']}: the runtime's output is wrong: {bad} (limit {VERIFY_TOL})")

    def runtime_timer(warmup: int, reps: int) -> list[float]:
        with stream:
            return _time_runs(lambda i: rt(p.xs[i % sets], *p.ws[i % sets]), stream, warmup, reps)

    def graph_timer(warmup: int, reps: int) -> list[float]:
        return _time_runs(lambda i: graphs[i % sets][0].launch(stream), stream, warmup, reps)

    got = backend.time_rounds(chain, [cfg], rounds, extra={"runtime": runtime_timer, "runtime graph": graph_timer})
    if isinstance(got[cfg], str):
        raise SystemExit(f"{manifest['label']}: bench's runner failed: {got[cfg]}")
    row["rounds_us"] = {"bench": got[cfg], "runtime": got["runtime"], "runtime graph": got["runtime graph"]}
    row["us"] = {k: median(v) for k, v in row["rounds_us"].items()}
    row["recorded_us"] = manifest.get("time_us")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", help="folders written by python -m tuner export WORKLOAD --format bundle")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    backend = GpuBackend()
    rows = []
    for folder in args.bundles:
        rt = load(folder)
        for m in rt.manifests:
            rows.append(measure_entry(backend, rt, m, args.rounds))
            r = rows[-1]
            print(f"{r['label']}: errors {r['error_cupy']:.1e} (CuPy), {r.get('error_torch', float('nan')):.1e} "
                  f"(PyTorch), {r['error_graph']:.1e} (graph); " +
                  ", ".join(f"{k} {v:.1f} µs" for k, v in r["us"].items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": backend.device_info().name, "rows": rows}, indent=1))
    print("entry  bench  runtime  runtime-graph  runtime/bench  graph/bench")
    for r in rows:
        us = r["us"]
        print(f"{r['label']}  {us['bench']:.1f}  {us['runtime']:.1f}  {us['runtime graph']:.1f}  "
              f"{us['runtime'] / us['bench']:.3f}  {us['runtime graph'] / us['bench']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
