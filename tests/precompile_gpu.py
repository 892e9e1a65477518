"""Compile the kernels that ``pytest -m gpu`` runs, on a host without a GPU, into a kernel cache
to carry to the GPU host, so that the GPU tests spend their time running, not compiling.

    python tests/precompile_gpu.py CACHE_DIR
    # on the GPU host, with CACHE_DIR carried there:
    TUNER_CACHE=CACHE_DIR TUNER_CARRIED_CACHE=CACHE_DIR python -m pytest -m gpu

The configs are those of the GPU tests' case lists (``tests/test_gpu.py``): every combination
of the MLP, convolution and attention cases, the clustered configs, and the graph-replay
sources that number their runs on the device. NVRTC from PyPI builds them (``.[compile]``);
the GPU host loads a cubin built by another NVRTC version as is.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_gpu as cases  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tuner.chain.workloads import get_workload  # noqa: E402
from tuner.codegen.compile import compile_many, target_arch  # noqa: E402
from tuner.codegen.render import render  # noqa: E402
from tuner.search.cases import clustered, coverage, reallocated, three_warpgroups  # noqa: E402


def sources() -> dict[str, str]:
    """The distinct sources the GPU tests compile, by hash."""
    chain = lambda workload, size: get_workload(workload).chain(**size)  # noqa: E731
    rendered = []
    for workload, size in cases.MLP_CASES:
        rendered += [render(chain(workload, size), c) for mma in cases.MMAS for c in coverage(chain(workload, size), mma)]
    for size in cases.CLUSTER_SIZES:
        rendered += [render(chain("gpt3", size), c) for c in clustered(chain("gpt3", size))]
    odd = chain("gpt3", cases.ODD)
    rendered += [render(odd, c, device_epoch=True) for mma in cases.MMAS for c in coverage(odd, mma)]
    for workload, size in cases.REALLOC_CASES:
        rendered += [render(chain(workload, size), c) for c in reallocated(chain(workload, size))]
        rendered += [render(chain(workload, size), c) for c in three_warpgroups(chain(workload, size))]
        rendered += [render(chain(workload, size), c, sms=8) for c in three_warpgroups(chain(workload, size), sms=8)
                     if any(t.persist for t in c.tiles)]
        rendered += [render(chain(workload, size), c, device_epoch=graphs, sms=blocks) for graphs in (False, True)
                     for blocks, cfgs in cases.persistent_grids(chain(workload, size)) for c in cfgs]
    graphed = chain("gpt3", dict(tokens=64))  # a backend timing graphs
    rendered += [render(graphed, c, device_epoch=True) for c in coverage(graphed, "wgmma_tma")]
    for workload, size, mma in cases.CONV_CASES:
        rendered += [render(chain(workload, size), c) for c in coverage(chain(workload, size), mma)]
    for workload, size in cases.ATTN_CASES:
        rendered += [render(chain(workload, size), c) for mma in cases.ATTN_MMAS
                     for c in coverage(chain(workload, size), mma)]
    return {r.hash: r.source for r in rendered}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path, help="the kernel cache to fill (carry it to the GPU host)")
    ap.add_argument("--arch", default="sm_90", help="target architecture (default: sm_90)")
    ap.add_argument("--jobs", type=int, help="parallel compiles (default: every core)")
    args = ap.parse_args()
    todo = sources()
    failed = 0
    for _, module in tqdm(compile_many(todo.items(), target_arch(args.arch), args.jobs, cache_dir=args.cache,
                                       accept_other_toolkit=True), total=len(todo), unit="kernel"):
        failed += isinstance(module, Exception)
    print(f"{len(todo) - failed} of {len(todo)} sources compiled into {args.cache}"
          + (f"; {failed} failed (the GPU tests report them)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
