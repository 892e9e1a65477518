"""A kernel change measured before it lands: recorded configs rendered from this checkout's
kernel templates and from each variant's, verified, then timed side by side in interleaved rounds.

    python benchmarks/template_ab.py [VARIANT ...] --config RECORDING LABEL [RANK] [--config ...] [--also F=V[,F=V ...]]
    # a variant is a folder holding a kernel_templates/ of its own, e.g. a copy with one change:
    cp -r kernel_templates /tmp/fence/ && $EDITOR /tmp/fence/kernel_templates/wgmma.cuh
    python benchmarks/template_ab.py /tmp/fence \\
        --config studies/recheck/gpt3-256.measurements.json 'gpt3.gemm2/tokens=256' \\
        --config studies/realloc/gpt3-2048.measurements.json 'gpt3.gemm2/tokens=2048'

Each ``--config`` picks a recorded config as ``profile_config.py`` does (the one ranked RANK,
default 0, among the measured configs whose label contains LABEL). Every source is checked
against the float32 reference on fresh inputs before it is timed; one that fails is reported,
not timed. With ``--timing-only``, the variant folders' sources are timed without that check,
for experiments that take work out to see what it costs (a variant whose epilogue skips its
stores answers wrongly by design); their lines say "unverified", and such figures are never
results. The rounds interleave every source of a config after idle (the H200's clock drops
under sustained load), in CUDA graphs with ``--graphs``. Prints the median of rounds of each
source and its ratio to this checkout's (below 1: the variant is faster); with ``--library``, the
library's chain of the same shape (bench's baselines) too. Each ``--also`` change is rendered from
this checkout and from every variant folder. With ``--sustained SECONDS`` every source is timed
right after about SECONDS of its own back-to-back runs, with no idle: at the clock that the
power cap leaves under sustained load, where a kernel that draws more power runs slower (rounds
after idle hide that). GPU only.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.backends.replay import Record, ReplayError, read_recording  # noqa: E402
from tuner.chain.workloads import chain_from_label  # noqa: E402
from tuner.cli import sustained_argument  # noqa: E402
from tuner.config import Config  # noqa: E402
from tuner.paths import home  # noqa: E402


def variant_homes(paths: list[str]) -> dict[str, Path]:
    """This checkout first, then each variant folder by name; a folder without kernel_templates/ is refused."""
    homes = {"this checkout": home()}
    for p in paths:
        root = Path(p)
        if not (root / "kernel_templates").is_dir():
            raise SystemExit(f"{p}: no kernel_templates/ folder in it (a variant holds a copy of kernel_templates/)")
        homes[root.name] = root
    return homes


def config_arguments(ap: argparse.ArgumentParser) -> None:
    """The repeatable ``--config RECORDING LABEL [RANK]``."""
    ap.add_argument("--config", nargs="+", action="append", required=True, metavar="RECORDING LABEL [RANK]",
                    help="a recorded config (repeatable): the one ranked RANK (default 0) among the measured "
                         "configs whose label contains LABEL")


def also_arguments(ap: argparse.ArgumentParser) -> None:
    """The repeatable ``--also FIELD=VALUE``: each config also with a tile or global field changed."""
    ap.add_argument("--also", action="append", default=[], metavar="FIELD=VALUE",
                    help="each config also with these fields changed together (tile fields in every stage "
                         "that accepts them, e.g. persist=1 or bm=256,bn=128; global ones, e.g. "
                         "policy=tile,launch=two_stream), from this checkout's templates (repeatable)")


def picked_configs(specs: list[list[str]]) -> list[Record]:
    """The record each ``--config`` names; exits with one line for a spec that names none."""
    targets = []
    for spec in specs:
        if len(spec) not in (2, 3):
            raise SystemExit(f"--config {' '.join(spec)}: give RECORDING LABEL [RANK]")
        try:
            targets.append(read_recording(spec[0]).pick(spec[1], int(spec[2]) if len(spec) == 3 else 0))
        except (ReplayError, ValueError) as exc:
            raise SystemExit(f"--config {' '.join(spec)}: {exc}") from None
    return targets


def tile_variant(chain, config, change: str, device, notes: list[str] | None = None) -> "Config | None":
    """``config`` with the fields of ``change`` (``FIELD=VALUE[,FIELD=VALUE ...]``, set together):
    tile fields in every stage that the search space's per-stage constraints accept them in, global
    ones (policy, launch...) for the chain; None if nothing changes, or the chain's constraints or
    the sync checker refuse the result. ``notes``, if given, gets one line per stage that keeps its
    tiling and the reason for a None, so a refused change is not silently skipped."""
    from dataclasses import replace

    from tuner.chain.tiling import StageGrid, tile_value
    from tuner.checker.checks import check
    from tuner.config import GLOBAL_FIELDS, TILE_FIELDS
    from tuner.search.constraints import Limits, chain_problem, stage_problem

    notes = [] if notes is None else notes
    fields, globals_ = {}, {}
    for part in change.split(","):
        field, _, value = part.partition("=")
        if field in GLOBAL_FIELDS and value:
            globals_[field] = value
        elif field in TILE_FIELDS and value:
            fields[field] = tile_value(field, value)
        else:
            raise SystemExit(f"--also {change}: give FIELD=VALUE[,FIELD=VALUE ...] with FIELD one of "
                             f"{', '.join(TILE_FIELDS + GLOBAL_FIELDS)}")
    tiles = []
    for st, t in zip(chain.stages, config.tiles):
        new = replace(t, **fields)
        problem = stage_problem(StageGrid(st, new), Limits(), device)
        if problem is not None and new != t:
            notes.append(f"{st.name} keeps {t.short()}: {new.short()} breaks {problem[0]} ({problem[1]})")
        tiles.append(new if problem is None else t)
    out = replace(config, tiles=tuple(tiles), **globals_)
    if out == config:
        notes.append("nothing changes")
        return None
    problem = chain_problem(out, chain, device)
    if problem is not None:
        notes.append(f"the chain's constraints refuse {out.short()}: {problem[0]} ({problem[1]})")
        return None
    why = check(chain, out, sms=device.sms)
    if why:
        notes.append(f"the sync checker refuses {out.short()}: {why}")
        return None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*",
                    help="folders each holding a kernel_templates/ to compare (none: this checkout and its --also "
                         "changes alone)")
    config_arguments(ap)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--graphs", action="store_true", help="time from CUDA graphs, as bench --graphs does")
    ap.add_argument("--library", action="store_true",
                    help="time the library's chain of the same shape in the same rounds too (cuBLAS through "
                         "CuPy, PyTorch's variants, as bench's baselines)")
    also_arguments(ap)
    sustained_argument(ap, "time each source")
    ap.add_argument("--timing-only", action="store_true",
                    help="time the variant folders' sources without checking their results (experiments that "
                         "take work out by design; printed as unverified, never results)")
    args = ap.parse_args()
    if args.timing_only and not args.variants:
        raise SystemExit("--timing-only applies to variant folders; give one (a folder holding kernel_templates/)")
    homes = variant_homes(args.variants)
    targets = picked_configs(args.config)

    from tuner.backends.gpu import GpuBackend

    gpu = GpuBackend(graphs=args.graphs)
    for rec in targets:
        chain = chain_from_label(rec.label)
        timers, failed = {}, {}

        def ready(name: str, cfg, verify: bool = True) -> None:
            """Renders, compiles and verifies ``cfg`` as source ``name``: its timer, or why it failed."""
            runner, why = gpu.ready(chain, cfg, args.graphs, verify=verify)
            if why:
                failed[name] = why
            else:
                timers[name] = runner.time_graphs if args.graphs else runner.time

        # Each config (the recorded one, then each --also change of it) from this checkout's
        # templates and from every variant folder's.
        names, unverified = [], set()
        changes = [(None, rec.config)]
        for c in args.also:
            notes: list[str] = []
            changes.append((c, tile_variant(chain, rec.config, c, gpu.device_info(), notes)))
            for note in notes:
                print(f"{rec.label}: --also {c}: {note}", flush=True)
        for change, cfg in changes:
            if cfg is None:
                continue
            for home_name, root in homes.items():
                os.environ["TUNER_HOME"] = str(root)  # the renderer reads its templates from here
                name = home_name if change is None else (f"{change}: {cfg.short()}" if home_name == "this checkout"
                                                         else f"{home_name}, {change}")
                names.append(name)
                if args.timing_only and home_name != "this checkout":
                    unverified.add(name)
                ready(name, cfg, verify=name not in unverified)
        os.environ["TUNER_HOME"] = str(homes["this checkout"])
        library = {}
        if args.library:
            from tuner.bench.baselines import baseline_timers

            p = gpu.problem(chain)
            library = baseline_timers(chain, list(zip(p.xs, p.ws)), graphs=args.graphs)
        got = gpu.time_rounds(chain, [], args.rounds, extra={**timers, **library}, heat_s=args.sustained or 0.0)
        print(f"{rec.label}: {rec.config.short()} (recorded {rec.measurement.median_us:.1f} us)"
              + (f", each after {args.sustained:g} s of its own runs" if args.sustained else ""))
        base = median(got["this checkout"]) if "this checkout" in got else None
        for name in names + list(library):
            if name in failed:
                print(f"  {name:>16}: FAILED {failed[name]}")
                continue
            if not isinstance(got.get(name), list) or not got[name]:
                print(f"  {name:>16}: not timed")
                continue
            us = median(got[name])
            print(f"  {name:>16}: {us:8.2f} us" + (f"  x{us / base:.3f}" if base else "")
                  + ("  (unverified: timing only)" if name in unverified else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
