"""Search strategies compared from an empty database: each one's best chain after k trials.

    python3 benchmarks/compare_strategies.py OUTDIR WORKLOAD TOKENS [--hidden N] [--ffn N]
        [--strategies staged,tpe,random] [--trials 400] [--seeds 1] [--backend auto|gpu|replay]

Per strategy and seed, one study on a database of its own in OUTDIR (nothing transferred, no
warm start, no final rounds, so every strategy gets the same kind of single timings), then a
table: the best whole-chain time after 25, 50, 100, 200 and 400 trials (stages timed alone
count as trials), and the trials needed to come within 3% of the best any run found. On a
GPU these are measurements; with ``--backend replay`` they are replayed from the recordings
under studies/ and labelled so (a replayed strategy can only draw recorded configs).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.backends import get_backend  # noqa: E402
from tuner.chain.workloads import get_workload  # noqa: E402
from tuner.paths import home  # noqa: E402
from tuner.search.space import load_space  # noqa: E402
from tuner.storage.trials import measured_history, trials_to_within  # noqa: E402
from tuner.study.loop import run_study  # noqa: E402
from tuner.study.outcome import figure_tag  # noqa: E402

MARKS = (25, 50, 100, 200, 400)
WITHIN = 1.03


def best_after(values: list[float | None], k: int) -> float | None:
    seen = [v for v in values[:k] if v is not None]
    return min(seen) if seen else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("workload")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--strategies", default="staged,tpe,random")
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    wl = get_workload(args.workload)
    size = {"tokens": args.tokens, **{k: v for k, v in (("hidden", args.hidden), ("ffn", args.ffn)) if v}}
    chain = wl.chain(**size)
    space = load_space(home() / "search_spaces" / f"{wl.name}.toml")
    backend = get_backend(args.backend)
    tag = figure_tag(backend)
    device = backend.device_info().name
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[list[float | None]]] = {}
    try:
        for strategy in args.strategies.split(","):
            for seed in range(args.seeds):
                # Letters, digits, dots and dashes only: some tools that copy results drop other names.
                db = args.out / f"{re.sub(r'[^A-Za-z0-9.-]+', '-', chain.label)}-{strategy}{seed}.db"
                url = f"sqlite:///{db}"
                out = run_study(chain, space, backend, url, strategy=strategy, seed=seed, trials=args.trials,
                                transfer=False, final=False)
                runs.setdefault(strategy, []).append(measured_history(url, chain, device))
                best = out.summary.best_us
                print(f"{strategy} seed {seed}: {out.measured} trials in {out.elapsed_s:.0f} s, best "
                      + (f"{best:.2f} us{tag}" if best is not None else "chain: none measured yet")
                      + f" ({out.stop})", flush=True)
    finally:
        backend.close()
    top = min(v for rs in runs.values() for r in rs for v in r if v is not None)
    print(f"\n{chain.label} on {device}{tag}: best whole-chain time after k trials (median over seeds), "
          f"and trials to within 3% of {top:.2f} us")
    marks = [k for k in MARKS if k <= args.trials]
    print("strategy  " + "  ".join(f"k={k:<6}" for k in marks) + "  to 3%")
    for strategy, rs in runs.items():
        cells = []
        for k in marks:
            got = [b for r in rs if (b := best_after(r, k)) is not None]
            cells.append(f"{median(got):8.2f}" if got else "       -")
        reach = [trials_to_within(r, top, WITHIN) for r in rs]
        print(f"{strategy:8}  " + "  ".join(cells) + f"  {median(reach):g} {reach}")
    # Every trial's running best, kept beside the databases, so the table can be made again.
    (args.out / "strategies.json").write_text(json.dumps(
        {"label": chain.label, "device": device, "replayed": bool(tag), "trials": args.trials, "within": WITHIN,
         "best_us": top, "histories": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
