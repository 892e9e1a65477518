"""Run one recorded config on the GPU, verified, then again and again: the target for a profiler.

    python benchmarks/profile_config.py RECORDING --label TEXT [--rank N] [--also F=V[,F=V ...]] [--runs N]
    ncu --set full -k regex:'stage|fused' --launch-skip 10 --launch-count 1 -o OUT/attn \\
        python benchmarks/profile_config.py studies/llama-attn-decode.measurements.json \\
        --label 'llama-attn.attn/tokens=1,'

Picks, among the recording's measured configs whose label contains TEXT (a chain, or one stage
timed alone: ``gpt3.gemm1/...``), the one ranked N by its recorded median (0: the fastest),
with ``--also``'s fields changed (as ``template_ab.py`` changes them), renders and compiles it
as bench does, checks it against the float32 reference, then runs it ``--runs`` times back to
back and prints its median beside the recorded one. The kernels are ``stage<i>_kernel``
(``fused_kernel`` for a fused launch): filter on those names (``-k``), since making the inputs
and the reference launches CuPy's own kernels first, and skip a few launches, since the first
runs are the check and the warm-up.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.backends.gpu import GpuBackend, Runner  # noqa: E402
from tuner.backends.replay import Record, ReplayError, read_recording  # noqa: E402
from tuner.chain.workloads import Chain, chain_from_label  # noqa: E402


def target_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments that name a recorded config: RECORDING, --label, --rank."""
    ap.add_argument("recording", help="a *.measurements.json file")
    ap.add_argument("--label", required=True, help="text the record's label contains")
    ap.add_argument("--rank", type=int, default=0, help="0: the fastest recorded config, 1: the next, ...")
    ap.add_argument("--also", metavar="FIELD=VALUE[,FIELD=VALUE ...]",
                    help="the config with these fields changed together, as template_ab.py --also takes them "
                         "(e.g. order=row or cm=2,stages=4)")


def load_target(args: argparse.Namespace, device_epoch: bool = False) -> tuple[Record, Chain, Runner, float]:
    """The record the arguments name, its chain, and its config loaded on the GPU and checked
    against the float32 reference (with its error); exits with one line where any of it fails."""
    try:
        rec = read_recording(args.recording).pick(args.label, args.rank)
    except ReplayError as exc:
        raise SystemExit(str(exc)) from None
    chain, config = chain_from_label(rec.label), rec.config
    backend = GpuBackend()
    if args.also:
        from template_ab import tile_variant  # noqa: PLC0415 - the script beside this one

        notes: list[str] = []
        config = tile_variant(chain, config, args.also, backend.device_info(), notes)
        if config is None:
            raise SystemExit(f"--also {args.also}: " + "; ".join(notes))
        rec = replace(rec, config=config)
    runner, m = backend.load(chain, config, device_epoch=device_epoch)
    if runner is None:
        raise SystemExit(f"{config.short()}: {m.reason}: {m.message}")
    err, why = backend.verify(chain, runner)
    if why:
        raise SystemExit(f"{config.short()}: {why} (error {err:.2e})")
    return rec, chain, runner, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target_arguments(ap)
    ap.add_argument("--runs", type=int, default=50, help="timed runs after 20 of warm-up (default 50)")
    args = ap.parse_args()
    rec, _, runner, err = load_target(args)
    times = runner.time(20, args.runs)
    print(f"{rec.label}: {rec.config.short()}, error {err:.1e}; median {median(times):.2f} us here, "
          f"{rec.measurement.median_us:.2f} us recorded (rank {args.rank}" + (f", before --also {args.also})" if args.also else ")"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
