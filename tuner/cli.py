"""Command line: ``python -m tuner {study,bench,export,show,list,report,compile}``.

Every user error surfaces as one ``tuner: error: ...`` line on stderr and exit
status 2 (``--debug`` adds the traceback); this module is the one place that
maps errors to exit statuses.
"""
from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import traceback
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from . import UsageError, __version__, shortlist
from .chain.workloads import WORKLOADS, WorkloadError, flag, get_workload, size_flags
from .config import GLOBAL_FIELDS
from .storage.database import DEFAULT_STORAGE, check_exists

USER_ERRORS = (UsageError, WorkloadError)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

__all__ = ["UsageError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument becomes a UsageError (one line, exit 2) instead of usage plus message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see python -m {self.prog} --help)")


# ---------------------------------------------------------------------------
# Argument types


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def sustained_argument(p: argparse.ArgumentParser, what: str) -> None:
    """``--sustained SECONDS`` (GpuBackend.time_rounds' ``heat_s``), for study, bench and benchmarks/template_ab.py."""
    p.add_argument("--sustained", type=_positive_float, metavar="SECONDS",
                   help=f"{what} right after about SECONDS of its own back-to-back runs instead of after idle: "
                        "the clock the power cap leaves under sustained load, where a kernel that draws more "
                        "power runs slower")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _int_list(text: str, least: int = 1) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if not values or any(v < least for v in values):
        what = "positive integers" if least == 1 else f"integers of at least {least}"
        raise argparse.ArgumentTypeError(f"expected {what} separated by commas (e.g. 64,2048), got {text!r}")
    return values


def _index_list(text: str) -> tuple[int, ...] | str:
    if text.strip() == "all":
        return "all"
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected GPU indices separated by commas (e.g. 0,1) or all, got {text!r}")
    return tuple(int(p) for p in parts)


def output_argument(p: argparse.ArgumentParser, metavar: str, help_: str, *aliases: str) -> None:
    """The one spelling of an output path, ``-o``/``--out``, on every command that writes one."""
    p.add_argument("-o", "--out", *aliases, dest="out", type=Path, metavar=metavar, help=help_)


def _fault(text: str) -> tuple[int, str]:
    from .codegen.render import FAULTS  # noqa: PLC0415

    kinds = [f for f in FAULTS if f != "none"]
    n, _, kind = text.partition(":")
    if not n.isdigit() or int(n) < 1 or kind not in kinds:
        raise argparse.ArgumentTypeError(f"expected N:KIND with N a positive trial number and KIND one of "
                                         f"{', '.join(kinds)}, got {text!r}")
    return int(n), kind


# ---------------------------------------------------------------------------
# Parser


def _size_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per size any workload has, from the workload definitions."""
    everyone = set(WORKLOADS)
    for name, (doc, owners) in size_flags().items():
        whose = "" if set(owners) == everyone else f" ({', '.join(owners)})"
        # Each workload checks its own sizes (Workload.chain); the help says what they accept.
        ranges = dict.fromkeys(get_workload(w).size_param(name).accepted for w in owners)
        least = min(get_workload(w).size_param(name).least for w in owners)
        p.add_argument(flag(name), dest=name, type=lambda text, least=least: _int_list(text, least), metavar="LIST",
                       help=f"{doc}, comma separated{whose}; each {' or '.join(ranges)}")


def _strategy_argument(p: argparse.ArgumentParser, default: str | None) -> None:
    from .search.strategies import DEFAULT as DEFAULT_STRATEGY  # noqa: PLC0415
    from .search.strategies import STRATEGIES  # noqa: PLC0415

    p.add_argument("--strategy", choices=list(STRATEGIES), default=default,
                   help="staged: each stage timed alone, the fastest tilings paired under every sync choice, "
                        "then a neighbourhood search and final rounds; tpe, random, grid: whole-chain "
                        "configs (default: " + (default or f"the study file's, else {DEFAULT_STRATEGY}") + ")")


def _study_arguments(p: argparse.ArgumentParser) -> None:
    """The study command's arguments."""
    from .backends import BACKENDS  # noqa: PLC0415
    from .study.loop import CLAIM_GRACE_S  # noqa: PLC0415
    from .study.spec import DEFAULT_TRIALS  # noqa: PLC0415

    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    _size_arguments(p)
    p.add_argument("--study-file", type=Path, metavar="F", help="study TOML (default: studies/<workload>.toml)")
    p.add_argument("--space", type=Path, metavar="F", help="search space TOML (default: the study file's)")
    _strategy_argument(p, None)
    p.add_argument("--seed", type=_non_negative_int, metavar="N", help="strategy seed")
    p.add_argument("--trials", type=_positive_int, metavar="N",
                   help="measured trials per size in total, stages timed alone included; staged keeps the last "
                        "fifth for whole chains (default: the study "
                        f"file's, else {', '.join(f'{k} {v}' for k, v in DEFAULT_TRIALS.items())}, others 100)")
    p.add_argument("--timeout", type=_positive_float, metavar="S", help="stop each size's study after S seconds")
    p.add_argument("--warm-start", type=Path, metavar="F",
                   help="bench summary whose picks for each size are measured first, after the stream baselines "
                        "(default: studies/<workload>.bench.json where it exists)")
    p.add_argument("--no-warm-start", action="store_true", help="measure no bench summary's picks first")
    p.add_argument("--no-transfer", action="store_true",
                   help="do not start from the best configs of the nearest sizes already in the storage")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="gpu measures, replay answers from recordings, auto picks gpu when one is visible")
    p.add_argument("--replay-file", type=Path, nargs="+", action="extend", metavar="F",
                   help="recordings to replay (default: studies/*.measurements.json)")
    p.add_argument("--deadline", type=_positive_float, default=60.0, metavar="S",
                   help="on a GPU: seconds a trial may run before its worker process is killed and the trial "
                        "recorded as a timeout, plus 100 times the baseline's measured runs (default: 60)")
    p.add_argument("--gpus", type=_index_list, metavar="LIST",
                   help="run one worker process per GPU (e.g. 0,1,2,3, or all) on the same study; the same "
                        "command on another host with the same --storage joins them")
    p.add_argument("--claim-grace", type=_positive_float, metavar="S", default=None,
                   help="seconds after a worker's last heartbeat (every few seconds) before the others take over "
                        f"what it was measuring; one of this host whose process is gone, at once (default: "
                        f"{CLAIM_GRACE_S:g})")
    p.add_argument("--graphs", action="store_true",
                   help="on a GPU: time every config as CUDA graph replays (the kernels number their runs on the "
                        "device), as a caller that captures the chain runs it; for chains of a few short kernels, "
                        "where launches are much of the time. Its studies are kept apart (names end in /graphs)")
    sustained_argument(p, "on a GPU: in the final rounds, whose medians give the study's best, time each finalist")
    p.add_argument("--plant-fault", type=_fault, action="append", metavar="N:KIND", default=[],
                   help="testing the isolation on a GPU: plant a fault in the N-th measured trial; "
                        "KIND is one of illegal_address, hang, missing_post")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    """The bench command's arguments."""
    from .search.strategies import DEFAULT as DEFAULT_STRATEGY  # noqa: PLC0415

    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    _size_arguments(p)
    p.add_argument("--space", type=Path, metavar="F", help="search space TOML (default: search_spaces/<workload>.toml)")
    _strategy_argument(p, DEFAULT_STRATEGY)
    p.add_argument("--trials", type=_positive_int, metavar="N",
                   help="measured trials of the search per size, as for study (a size the storage already "
                        "holds costs no new trial); then the 3 fastest chains of each kind of sync (stream, pdl, tile) are "
                        "timed again, with every baseline, in 5 interleaved rounds after idle (or see --sustained)")
    p.add_argument("--seed", type=_non_negative_int, default=0, metavar="N", help="strategy seed and random inputs")
    p.add_argument("--graphs", action="store_true",
                   help="time our chains (the search's trials and the finalists) and the CuPy chain inside CUDA "
                        "graphs, as PyTorch's graph variants are (the kernels then number their runs on the "
                        "device); for chains of a few short kernels, where launches are much of the time")
    sustained_argument(p, "in the final rounds (and --stages'), time each contestant and baseline")
    p.add_argument("--compile", action="store_true",
                   help="also PyTorch's chain through torch.compile (its default mode, compiled once per size: "
                        "tens of seconds each), captured in a CUDA graph, among the baselines")
    p.add_argument("--network", action="store_true",
                   help="every layer of the whole network (resnet38, vgg19) at each --batch, then the "
                        "multiplicity-weighted whole-network figure")
    p.add_argument("--compare", type=Path, action="append", metavar="F",
                   help="a bench summary whose picks for each size join the final rounds (repeatable)")
    p.add_argument("--stages", action="store_true",
                   help="also time each stage alone (its 3 fastest tilings of the stage pass) against the "
                        "cuBLAS and PyTorch kernels for the same shape and epilogue, in interleaved rounds")
    p.add_argument("--ablate", action="append", metavar="FIELD", choices=GLOBAL_FIELDS,
                   help="also time the leading finalist of each kind with every other allowed value of this "
                        f"global choice ({', '.join(GLOBAL_FIELDS)}), in the space or not, in the same rounds "
                        "(repeatable)")
    output_argument(p, "PATH", "summary JSON (default: studies/<workload>.bench.json); the recording of every "
                        "measurement goes beside it as <name>.measurements.json")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    stored = _Parser(add_help=False, parents=[common])  # the commands that read or write the study database
    stored.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                        help=f"SQLAlchemy URL of the study database (default: {DEFAULT_STORAGE})")

    parser = _Parser(prog="tuner", description="Auto-tuner for chains of dependent tiled CUDA kernels "
                                               "that synchronize tile by tile.")
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_: str, run: Callable[[argparse.Namespace, list[str]], int],
                storage: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[stored if storage else common], help=help_, description=help_)
        p.set_defaults(run=run)
        return p

    p = command("study", "tune a workload: one Optuna study per size and device", _cmd_study)
    _study_arguments(p)

    p = command("bench", "search a workload's sizes on the GPU, then time the finalists against every baseline",
                _cmd_bench)
    _bench_arguments(p)

    from .shipping.export import FORMATS  # noqa: PLC0415

    p = command("export", "write the best configs per device and size, a runnable bundle of them, or a recording",
                _cmd_export)
    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    output_argument(p, "PATH", "default: tuned/<workload>.json (.h, .measurements.json; a bundle: the folder "
                               "tuned/<workload>-bundle)", "--output")
    p.add_argument("--format", choices=(*FORMATS, "bundle"), default="json",
                   help="json or a C++ header (best configs); bundle: a folder with each best chain's CUDA source, "
                        "cubin and manifest, which tuner.shipping.runtime runs; recording: every measurement, for "
                        "--backend replay")

    p = command("show", "summarize the stored studies of a workload", _cmd_show)
    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--format", choices=("table", "json"), default="table")

    command("list", "list workloads and stored studies", _cmd_list)

    p = command("report", "plots and a Markdown page of a workload's recorded bench results (no GPU needed)",
                _cmd_report, storage=False)
    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--summary", type=Path, nargs="+", action="extend", metavar="F",
                   help="bench summaries to draw (default: studies/<workload>.bench.json and "
                        "studies/search/<workload>-*.bench.json; a later file's row for a size wins)")
    output_argument(p, "DIR", "where the page and PNGs go (default: studies/report)")

    p = command("compile", "render and compile a workload's kernels with NVRTC (no GPU needed)", _cmd_compile,
                storage=False)
    p.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--arch", default="sm_90", help="target architecture (default: sm_90)")
    _size_arguments(p)
    p.add_argument("--jobs", type=_positive_int, metavar="N", help="parallel compiles")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="compile at most N configs per size")
    return parser


# ---------------------------------------------------------------------------
# Commands


def _cmd_study(args: argparse.Namespace, argv: list[str]) -> int:
    from .backends import get_backend  # noqa: PLC0415
    from .search.space import load_space  # noqa: PLC0415
    from .storage.measurements import MeasurementStore  # noqa: PLC0415
    from .study.spec import default_study, load_study_file  # noqa: PLC0415

    wl = get_workload(args.workload)
    if args.gpus:
        return _study_workers(args, argv)
    spec = load_study_file(args.study_file) if args.study_file else default_study(wl.name)
    if spec.workload != wl.name:
        raise UsageError(f"{spec.source} tunes {spec.workload}, not {wl.name}; accepted: "
                         f"python -m tuner study {spec.workload} --study-file {args.study_file}")
    chains = [wl.chain(**size) for size in wl.requested_sizes(vars(args), spec.sizes)]
    space = load_space(args.space or spec.space)
    MeasurementStore(args.storage).close()  # an unusable storage fails here, before any work

    backend = get_backend(args.backend, args.replay_file, announce=print, plant=dict(args.plant_fault),
                          deadline_s=args.deadline, graphs=args.graphs)
    try:
        if args.graphs and backend.replayed:
            raise UsageError("--graphs times CUDA graph replays on a GPU, and none is in use; accepted without a "
                             "GPU: the study without --graphs (a replay answers as its recording was timed)")
        if args.sustained and backend.replayed:
            raise UsageError("--sustained times the final rounds under load on a GPU, and none is in use; accepted "
                             "without a GPU: the study without --sustained (a replay runs no final rounds)")
        if backend.synthetic:
            files = ", ".join(str(r.path) for r in backend.recordings if r.synthetic)
            print(f"WARNING: synthetic figures, not measurements: {files} holds figures made by a cost model; "
                  "every figure below is marked 'replayed, synthetic'")
        if backend.supports("labels"):
            chains = _replayable(chains, backend, args, spec.source)
        return _study_sizes(chains, space, backend, spec, args, argv)
    finally:
        backend.close()


def _study_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """``study --gpus``: the same command, one worker process per GPU."""
    from .backends import gpu_count  # noqa: PLC0415
    from .study.workers import check_gpus, run_workers, strip_option  # noqa: PLC0415

    gpus = args.gpus
    if gpus == "all":
        count = gpu_count()
        if not count:
            raise UsageError("--gpus all: no CUDA device is visible here; accepted: GPU indices (e.g. 0,1), "
                             "or run on a GPU host")
        gpus = tuple(range(count))
    # Replaying workers, or no GPU to count: nothing to check the indices against.
    check_gpus(gpus, (gpu_count() or None) if args.backend != "replay" else None)
    return run_workers(strip_option(argv, "--gpus"), gpus)


def _replayable(chains: list, backend, args: argparse.Namespace, source: str) -> list:
    """The chains a replay can answer for. Sizes the user named that it cannot are each said; of a
    study file's default sizes, the recorded ones run, and one line says so."""
    wl = get_workload(args.workload)
    recorded = set(backend.labels())
    runnable = [c for c in chains if c.label in recorded]
    named = args.study_file is not None or any(getattr(args, p, None) for p in wl.params)
    if named:
        for c in chains:
            if c.label not in recorded:
                print(f"{c.label}: skipped, no recorded measurements to replay")
    elif runnable and len(runnable) < len(chains):
        sizes = ", ".join(str(c.size_dict[wl.sweep_param]) for c in runnable)
        print(f"replaying the {len(runnable)} sizes the recordings hold ({wl.sweep_param} {sizes}); the "
              f"other {len(chains) - len(runnable)} of {source} need a GPU (or name sizes: "
              f"{flag(wl.sweep_param)} LIST)")
    if not runnable:
        mine = sorted((lb for lb in recorded if lb.startswith(f"{wl.name}/")), key=_size_key)
        raise UsageError(f"the recordings hold no size of this sweep; recorded {wl.name} sizes: "
                         f"{shortlist(lb.split('/', 1)[1] for lb in mine) or 'none'}; "
                         f"accepted: those sizes ({flag(wl.sweep_param)} ...), or a GPU")
    return runnable


def _study_sizes(chains: list, space, backend, spec, args: argparse.Namespace, argv: list[str]) -> int:
    """Each size's study in turn, a line per size, then the table of them all."""
    from .bench.runs import picked_configs  # noqa: PLC0415
    from .paths import home  # noqa: PLC0415
    from .shipping.report import recorded_library  # noqa: PLC0415
    from .study.loop import run_study  # noqa: PLC0415
    from .study.outcome import describe, figure_tag, outcome_table  # noqa: PLC0415

    wl = get_workload(args.workload)
    tag = figure_tag(backend)
    warm_file = None if args.no_warm_start else (args.warm_start or home() / "studies" / f"{wl.name}.bench.json")
    if args.warm_start is not None and not args.no_warm_start and not args.warm_start.is_file():
        raise UsageError(f"--warm-start {args.warm_start}: no such file; accepted: a bench summary "
                         "(python -m tuner bench writes one)")
    outcomes = []
    for chain in chains:
        warm = picked_configs(warm_file, chain.label) if warm_file is not None else []
        outcome = run_study(chain, space, backend, args.storage, strategy=args.strategy or spec.strategy,
                            seed=spec.seed if args.seed is None else args.seed, trials=args.trials or spec.trials,
                            timeout=args.timeout or spec.timeout, progress=True, warm=warm,
                            transfer=not args.no_transfer, log=print, sustained_s=args.sustained or 0.0,
                            **({} if args.claim_grace is None else {"claim_grace_s": args.claim_grace}))
        print(describe(outcome, tag))
        outcomes.append(outcome)
        if outcome.interrupted:
            print(f"interrupted: every measured trial is stored in {args.storage}; "
                  f"resume with: python -m tuner {shlex.join(argv)}", file=sys.stderr)
            return EXIT_INTERRUPTED
    if len(outcomes) > 1 or any(o.summary.best is not None for o in outcomes):
        print(outcome_table(outcomes, wl.sweep_param, tag, recorded_library(backend)))
    return 0


# The commands whose module imports what a plain install may lack (CuPy, NVRTC, matplotlib).
_DELEGATED = {"bench": "bench", "compile": "codegen.compile", "report": "shipping.report"}


def _delegate(command: str, args: argparse.Namespace) -> int:
    module = f"{__package__}.{_DELEGATED[command]}"
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise UsageError(f"{command} needs {exc.name}, which is not installed; "
                             f"accepted: pip install -e '.[{'gpu' if command == 'bench' else 'compile'}]'") from None
        raise UsageError(f"the {command} command is not part of this install (no {module})") from None
    return int(mod.main(args) or 0)


def _cmd_bench(args: argparse.Namespace, argv: list[str]) -> int:
    from .backends import gpu_visible  # noqa: PLC0415

    wl = get_workload(args.workload)
    if args.network and not wl.network:
        raise UsageError(f"--network: {wl.name} has no network layers; accepted with: "
                         f"{', '.join(w.name for w in WORKLOADS.values() if w.network)}")
    if not gpu_visible():
        raise UsageError("bench measures on a GPU and no CUDA device is visible (cupy finds none); accepted "
                         "without a GPU: python -m tuner study --backend replay, python -m tuner compile")
    return _delegate("bench", args)


def _require_nvrtc(what: str) -> None:
    """Refuse, in one line, a command that compiles where NVRTC is missing or does not load."""
    try:
        importlib.import_module("cuda.bindings.nvrtc")
    except ImportError:
        raise UsageError(f"{what} needs NVRTC (cuda-bindings and nvidia-cuda-nvrtc), which is not installed; "
                         "accepted: pip install -e '.[compile]'") from None
    try:
        from .codegen.compile import ToolchainMissing, toolkit_version  # noqa: PLC0415
    except ImportError:
        return  # _delegate says what is missing
    try:
        toolkit_version()  # the bindings may import while NVRTC itself does not load: say so before any work
    except ToolchainMissing as exc:
        raise UsageError(f"{what} needs NVRTC, which does not load here ({exc}); "
                         "accepted: pip install -e '.[compile]'") from None


def _cmd_compile(args: argparse.Namespace, argv: list[str]) -> int:
    get_workload(args.workload)
    _require_nvrtc("compile")
    return _delegate("compile", args)


def _cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    get_workload(args.workload)
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise UsageError("report draws with matplotlib, which is not installed; accepted: "
                         "pip install -e '.[report]'") from None
    return _delegate("report", args)


def _cmd_export(args: argparse.Namespace, argv: list[str]) -> int:
    from .shipping.export import export  # noqa: PLC0415

    wl = get_workload(args.workload)
    if args.format == "bundle":
        _require_nvrtc("a bundle (its cubins)")
        from .shipping.bundle import write_bundle  # noqa: PLC0415 - compiles with NVRTC

        path = write_bundle(args.storage, wl.name, args.out or Path("tuned") / f"{wl.name}-bundle")
    else:
        path = export(args.storage, wl.name, args.out, args.format, command="python -m tuner " + shlex.join(argv))
    print(f"wrote {path}")
    return 0


def _fmt_us(x: float | None, tag: str) -> str:
    return "-" if x is None else f"{x:.2f} us{tag}"


def _cmd_show(args: argparse.Namespace, argv: list[str]) -> int:
    from .shipping.export import collect  # noqa: PLC0415

    wl = get_workload(args.workload)
    rows = collect(args.storage, wl.name)
    if not rows:
        raise UsageError(f"no study of {wl.name} in {args.storage}; run python -m tuner study {wl.name} first, "
                         "or pass --storage with the URL the studies were written to")
    if args.format == "json":
        print(json.dumps(rows, sort_keys=True, indent=2))
        return 0
    table = [("size", "device", "best", "baseline", "speedup", "trials", "failures", "refused", "best config")]
    for r in rows:
        tag = " replayed, synthetic" if r["synthetic"] else " replayed" if r["replayed"] else ""
        measured_fails = {**r["failures"], "constraint": r["failures"]["constraint"] - r["refused"]}
        fails = ", ".join(f"{k} {v}" for k, v in measured_fails.items() if v) or "-"
        table.append((",".join(f"{k}={v}" for k, v in r["size"].items()), r["device"],
                      _fmt_us(r["best"] and r["best"]["median_us"], tag)
                      + (f" (under {r['best']['sustained_s']:g} s of load)" if r["best"] and r["best"]["sustained_s"] else ""),
                      _fmt_us(r["baseline_us"], tag),
                      "-" if r["speedup"] is None else f"{r['speedup']:.2f}x{tag}",
                      str(r["trials"]) + (f" + {r['stage_trials']} alone" if r["stage_trials"] else ""), fails,
                      str(r["refused"]), r["best"]["short"] if r["best"] else "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _cmd_list(args: argparse.Namespace, argv: list[str]) -> int:
    print("workloads:")
    for wl in WORKLOADS.values():
        fixed = ", ".join(f"{k}={v}" for k, v in wl.defaults.items())
        print(f"  {wl.name}: {wl.description}")
        if wl.builtin:
            sizes = "; ".join(", ".join(f"{k} {','.join(map(str, v))}" for k, v in b.items()) for b in wl.builtin)
            print(f"    built-in sizes: {sizes} ({fixed})")
        else:
            print(f"    sweep {wl.sweep_param} = {','.join(map(str, wl.sweep))} ({fixed})")
    try:
        check_exists(args.storage)
    except UsageError:
        print(f"stored studies: none ({args.storage} does not exist yet)")
        return 0

    from .storage.database import has_studies, open_optuna_storage  # noqa: PLC0415
    from .storage.trials import stored_trials, study_summaries, summarize  # noqa: PLC0415

    if not has_studies(args.storage):
        print(f"stored studies: none in {args.storage} (it holds no tuner tables)")
        return 0
    rdb = open_optuna_storage(args.storage, read_only=True)
    summaries = study_summaries(rdb)
    print(f"stored studies in {args.storage}:" if summaries else f"stored studies: none in {args.storage}")
    for s in sorted(summaries, key=lambda s: (s.study_name.split("/", 1)[0], _size_key(s.study_name))):
        attrs = s.user_attrs
        if "stage" in attrs and not s.n_trials:
            continue  # a stage that its twin's stage pass stood in for
        tag = " (replayed, synthetic)" if attrs.get("synthetic") else " (replayed)" if attrs.get("replayed") else ""
        # The same counts as show: measured trials, and the best of the final rounds where they ran.
        summ = summarize(stored_trials(rdb, s.study_name))
        best = f"best {summ.best_us:.2f} us{tag}" if summ.best is not None else "no successful trial"
        print(f"  {s.study_name}: {summ.measured} trials measured, {best}")
    return 0


def _size_key(label: str) -> tuple:
    """Sort key of a chain label or study name by its sizes as numbers (1, 2, 128, 256, 2048, not as text)."""
    parts = label.split("/")
    sizes = parts[1] if len(parts) > 1 else ""
    try:
        numbers = tuple(int(kv.split("=", 1)[1]) for kv in sizes.split(",") if "=" in kv)
    except ValueError:
        numbers = ()
    return (numbers, label)


# ---------------------------------------------------------------------------
# Entry point


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 user error, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0)
        return args.run(args, argv)
    except USER_ERRORS as exc:
        if debug:
            traceback.print_exc()
        print(f"tuner: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        hint = f"; resume with: python -m tuner {shlex.join(argv)}" if argv[:1] == ["study"] else ""
        print(f"tuner: interrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug, not a user error: keep it short unless asked
        if debug:
            raise
        print(f"tuner: internal error: {type(exc).__name__}: {_one_line(exc)} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
