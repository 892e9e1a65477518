"""Which kernels the library runs for a chain or one stage of it, and a target for a profiler.

    python benchmarks/profile_library.py LABEL [--variant TEXT] [--runs N]
    python benchmarks/profile_library.py 'gpt3.gemm1/tokens=256,hidden=12288,ffn=6144'
    ncu --clock-control none --set full -k regex:nvjet --launch-skip 10 --launch-count 1 -o OUT/lib \\
        python benchmarks/profile_library.py 'gpt3.gemm2/tokens=256,hidden=12288,ffn=6144' --variant 'torch graph'

LABEL names a chain (``gpt3/tokens=256,...``) or a stage of it timed alone (``gpt3.gemm1/...``),
as bench's recordings label them. The chain's PyTorch forms are those bench times
(``tuner.bench.baselines.torch_chains``: eager, CUDA graph, and the graph with cuBLASLt's epilogue
where one applies), on the same random inputs. For each form (or the one whose name contains
``--variant``), every kernel a call runs, under the PyTorch profiler: name, grid, block,
registers, shared memory and median duration over 20 calls. Then it calls the chosen forms
``--runs`` more times, for a profiler attached from outside (skip the first launches there:
they are the warm-up and the listing).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.chain.workloads import WorkloadError, chain_from_label  # noqa: E402

LISTED_CALLS = 20


def kernel_rows(fn) -> list[dict]:
    """Every kernel ``LISTED_CALLS`` calls of ``fn`` ran, with its launch shape and median duration."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(LISTED_CALLS):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the launch shapes are only in the exported trace
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    by_name: dict[str, list[dict]] = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e)
    rows = []
    for name, es in by_name.items():
        a = es[0].get("args", {})
        rows.append(dict(name=name, calls=len(es) / LISTED_CALLS, us=median(e["dur"] for e in es),
                         grid=a.get("grid"), block=a.get("block"), regs=a.get("registers per thread"),
                         smem=a.get("shared memory")))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label", help="a chain or stage label, e.g. 'gpt3.gemm1/tokens=256,hidden=12288,ffn=6144'")
    ap.add_argument("--variant", default="", help="only the PyTorch forms whose name contains this text")
    ap.add_argument("--runs", type=int, default=30, help="calls after the listing, for an outside profiler (default 30)")
    args = ap.parse_args()
    try:
        chain = chain_from_label(args.label)
    except WorkloadError as exc:
        raise SystemExit(str(exc)) from None
    from tuner.backends.gpu import GpuBackend
    from tuner.bench.baselines import torch_chains

    p = GpuBackend().problem(chain)
    forms = {k: f for k, f in torch_chains(chain, p.xs[0], p.ws[0]).items() if args.variant in k}
    if not forms:
        raise SystemExit(f"no PyTorch form of {chain.label} matches {args.variant!r} (is torch installed?)")
    for name, fn in forms.items():
        for _ in range(5):
            fn()
        print(f"{chain.label}, {name}:")
        for r in kernel_rows(fn):
            print(f"  {r['us']:8.2f} us  x{r['calls']:g}  grid {r['grid']} block {r['block']} regs {r['regs']} "
                  f"smem {r['smem']}  {r['name']}")
    for fn in forms.values():
        for _ in range(args.runs):
            fn()
    import torch

    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
