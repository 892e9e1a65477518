"""``python -m tuner bench``: our best stream-sync and tile-sync chains against the baselines and the floor.

Per size: the study's search (the ``staged`` strategy by default, through the same loop and
storage as ``python -m tuner study``, so a size already tuned there costs no new trial), then
the fastest three stream-synchronized and three tile-synchronized configs, every baseline
(the cuBLAS chain a CuPy user writes, PyTorch's chains where PyTorch is installed) and any
configs named by ``--compare`` summaries, timed in interleaved rounds after idle, and the
floor from the bandwidth and GEMM rate measured in the same run. Picking the fastest of many
noisy timings favours configs that were lucky once, and sustained load lowers the clock, so
the figures reported are the rounds' medians, every contestant timed at the same clock.
Every measurement is also written as a recording (the replay backend reads it) and the table
as JSON.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any, Sequence

from .. import UsageError
from ..chain.workloads import Chain, get_workload
from ..config import Config
from ..shipping.report import best_pytorch, over_stream, ratio_text, us_text
from ..storage.trials import study_name
from ..study.final import FINAL_PER_KIND, SYNC_KINDS, finalists, rounds_note, sync_kind
from ..study.loop import run_study

ROUNDS = 5  # interleaved rounds of the final timing


def timed_configs(storage: str, chain: Chain, device, stage: int | None = None, graphs: bool = False
                  ) -> list[tuple[float, Config]]:
    """Every measured, successful config of the chain's study (of stage ``stage`` timed alone,
    where given; ``graphs``: the study timed as CUDA graph replays), with its time; KeyError where
    the storage has no such study."""
    from optuna.trial import TrialState  # noqa: PLC0415

    from ..storage.trials import stage_study_name, stored_trials, trial_config  # noqa: PLC0415

    name = study_name(chain, device, graphs) if stage is None else stage_study_name(chain, stage, device, graphs)
    names = chain.stage_names if stage is None else (chain.stages[stage].name,)
    return [(t.value, c) for t in stored_trials(storage, name, (TrialState.COMPLETE,))
            if t.user_attrs.get("measured") and (c := trial_config(t, names, name)) is not None]


def ablations(contestants: dict[str, Config], fields: list[str], chain: Chain, device) -> dict[str, Config]:
    """For the leading finalist of each kind, the same config with each other value of a global
    ``field`` that the constraints and the checker allow (in the search space or not), named
    ``"<kind> <field>=<value>"``: what that one choice is worth, timed in the same rounds."""
    from ..checker.checks import check  # noqa: PLC0415
    from ..config import GLOBAL_CHOICES  # noqa: PLC0415
    from ..search.constraints import chain_problem  # noqa: PLC0415

    out: dict[str, Config] = {}
    for kind in SYNC_KINDS:
        cfg = contestants.get(kind)
        for field in fields if cfg is not None else ():
            for value in GLOBAL_CHOICES[field]:
                other = replace(cfg, **{field: value})
                if (value != getattr(cfg, field) and other not in contestants.values()
                        and chain_problem(other, chain, device) is None
                        and check(chain, other, sms=device.sms) is None):
                    out[f"{kind} {field}={value}"] = other
    return out


STAGE_FINALISTS = 3  # fastest tilings of each stage timed alone again against cuBLAS


def stage_rounds(gpu, chain: Chain, storage: str, device, graphs: bool, log=print,
                 sustained_s: float = 0.0, compiled: bool = False) -> list[dict[str, Any]]:
    """Each stage alone: its fastest tilings of the stage pass timed again with the baselines of
    that one stage (a cuBLAS GEMM with its epilogue, PyTorch's) in interleaved rounds (each timing
    after ``sustained_s`` of its own runs where given: GpuBackend.time_rounds). The GEMM our chains
    are built from against the library kernel for the same shape and epilogue."""
    from .baselines import baseline_timers  # noqa: PLC0415

    out = []
    for j, st in enumerate(chain.stages):
        alone = chain.alone(j)
        try:
            timed = sorted(timed_configs(storage, chain, device, stage=j, graphs=graphs), key=lambda x: x[0])
        except KeyError:
            log(f"{alone.label}: no stage timed alone (a strategy without a stage pass)")
            continue
        cfgs = list(dict.fromkeys(c for _, c in timed))[:STAGE_FINALISTS]
        if not cfgs:
            continue
        p = gpu.problem(alone)
        extra = baseline_timers(alone, list(zip(p.xs, p.ws)), graphs=graphs, compiled=compiled)
        log(f"{alone.label}: {rounds_note(len(cfgs) + len(extra), 'tilings and library kernels', ROUNDS, sustained_s)}")
        got = gpu.time_rounds(alone, cfgs, ROUNDS, extra=extra, graphs=graphs, heat_s=sustained_s)
        ours = {c: median(v) for c in cfgs if isinstance(v := got.get(c), list) and v}
        best = min(ours, key=ours.get) if ours else None
        row = {"stage": st.name, "shape": [st.m, st.n, st.k], "epilogue": st.epilogue,
               "ours_us": round(ours[best], 3) if best else None, "config": best.short() if best else None,
               "baselines_us": {k: round(median(v), 3) for k in extra if isinstance(v := got.get(k), list) and v}}
        out.append(row)
        log(f"{alone.label} alone: ours {row['ours_us']} µs ({row['config']}); "
            + ", ".join(f"{k} {v:.1f}" for k, v in row["baselines_us"].items()))
    return out


def run_bench(workload: str, sizes: list[dict[str, int]], out: Path, space_path: Path, storage: str, *,
              strategy: str = "staged", trials: int | None = None, seed: int = 0,
              compare: list[Path] = (), log=print, graphs: bool = False, ablate: list[str] = (),
              stages: bool = False, sustained_s: float = 0.0, compiled: bool = False) -> dict[str, Any]:
    """Search, then time the finalists with every baseline, for every size; returns (and writes) the
    summary. ``sustained_s``: the final rounds time each contestant right after that many seconds of
    its own runs, not after idle (GpuBackend.time_rounds); ``compiled``: PyTorch's ``torch.compile``
    form among the baselines."""
    from ..backends.gpu import GpuBackend
    from ..backends.replay import write_recording
    from ..search.space import load_space
    from ..storage.measurements import MeasurementStore
    from .baselines import baseline_timers, floor_us, gemm_rate, read_bandwidth

    gpu = GpuBackend(seed=seed, graphs=graphs)
    dev = gpu.device_info()
    wl = get_workload(workload)
    space = load_space(space_path)
    chains = [wl.chain(**size) for size in sizes]
    rate = gemm_rate()
    bw = read_bandwidth(max(ch.min_bytes for ch in chains))
    log(f"measured ceilings: read bandwidth {bw / 1e12:.2f} TB/s, fp16 GEMM {rate / 1e12:.0f} TFLOP/s")
    command = "python -m tuner " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    rec_path = out.with_name(out.name.replace(".bench.json", "") + ".measurements.json")
    # Every measurement of these sizes the storage holds, this run's and an earlier study's alike.
    labels = [c.label for c in chains] + [c.alone(j).label for c in chains for j in range(len(c.stages))]
    rows = []
    summary: dict[str, Any] = {}
    for ch in chains:
        outcome = run_study(ch, space, gpu, storage, strategy=strategy, seed=seed, trials=trials, final=False,
                            log=log)
        log(f"{ch.label}: search: {outcome.measured} trials ({outcome.new_trials} new, "
            f"{outcome.stage_trials} of them stages alone) in {outcome.elapsed_s:.0f} s")
        # The recording, written as soon as the search ends: the final rounds add no measurement,
        # and may not finish.
        store = MeasurementStore(storage, read_only=True)
        write_recording(rec_path, dev, store.records(dev, labels), command)
        store.close()
        passed = timed_configs(storage, ch, dev, graphs=graphs)
        contestants = _contestants(passed, ch, dev, compare, ablate)
        p = gpu.problem(ch)
        extra = baseline_timers(ch, list(zip(p.xs, p.ws)), graphs=graphs, compiled=compiled)
        log(f"{ch.label}: final rounds: "
            f"{rounds_note(len(contestants) + len(extra), 'chains, ours and the library', ROUNDS, sustained_s)}")
        got = gpu.time_rounds(ch, list(contestants.values()), ROUNDS, extra=extra, graphs=graphs, heat_s=sustained_s)
        rounds: dict[str, list[float]] = {}
        for name, cfg in contestants.items():
            if isinstance(got.get(cfg), list):
                rounds[name] = got[cfg]
            else:
                log(f"{ch.label}: final rounds leave out {name} ({cfg.short()}): {got.get(cfg)}")
        rounds.update({name: got[name] for name in extra if isinstance(got.get(name), list)})
        row = _row(ch, wl.sweep_param, outcome, strategy, passed, contestants, set(extra), rounds,
                   floor_us(ch, bw, rate), ch.min_bytes / bw * 1e6)
        if stages:
            row["stages_alone"] = stage_rounds(gpu, ch, storage, dev, graphs, log, sustained_s, compiled)
        rows.append(row)
        log(_row_text(row))
        # Written after every size, so an interrupted bench keeps what it measured.
        summary = {"schema": 1, "kind": "tuner-bench", "workload": workload, "device": dev.to_dict(),
                   "command": command, "read_bandwidth_Bps": bw, "gemm_flops": rate, "rows": rows,
                   "graphs": graphs, "sustained_s": sustained_s}
        summary["network"] = network_figures(summary, workload)
        out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if graphs:
        log("our chains and the CuPy chain timed inside CUDA graphs, as PyTorch's graph variants are")
    if sustained_s:
        log(f"final rounds: each timing right after {sustained_s:g} s of the same chain's own runs (sustained load)")
    log(table(summary))
    if any(r.get("stages_alone") for r in rows):
        log(stages_table(summary))
    if summary.get("network"):
        log(network_table(summary["network"], get_workload(workload).sweep_param))
    return summary


def _contestants(passed: list[tuple[float, Config]], chain: Chain, device, compare: Sequence[Path],
                 ablate: Sequence[str]) -> dict[str, Config]:
    """The final rounds' configs by name: the search's finalists, another run's picks, the ablations."""
    contestants = named_finalists(passed)
    for path in compare:
        for cfg in picked_configs(path, chain.label):
            if cfg not in contestants.values():
                contestants[f"{Path(path).name} {sync_kind(cfg)}"] = cfg
    contestants.update(ablations(contestants, list(ablate), chain, device))
    return contestants


def _row(chain: Chain, sweep: str, outcome, strategy: str, passed: list[tuple[float, Config]],
         contestants: dict[str, Config], library: set[str], rounds: dict[str, list[float]],
         floor: float, bytes_us: float | None = None) -> dict[str, Any]:
    """One size's figures in the summary: the fastest of each kind of sync, the baselines, the floor
    (and ``bytes_us``, the chain's fewest bytes over the read bandwidth measured in the same run, of
    which each time's share is its fraction of HBM bandwidth)."""
    final = {name: round(median(v), 3) for name, v in rounds.items() if v}
    ours = {n: c for n, c in contestants.items() if n in final and n.split("#")[0] in SYNC_KINDS}
    picked = fastest_per_kind(ours, final)
    found = {kind: (next(us for us, c in passed if c == contestants[name]), contestants[name])
             for kind, name in picked.items()}
    best = {kind: final[name] for kind, name in picked.items()}
    tuned = min(best, key=best.get) if best else None
    return {"label": chain.label, "size": chain.size_dict, "tokens": chain.size_dict[sweep],
            "floor_us": round(floor, 2), "bytes_us": None if bytes_us is None else round(bytes_us, 2),
            "baselines_us": {k: v for k, v in final.items() if k in library},
            "compared_us": {k: v for k, v in final.items() if k not in library and k not in ours},
            "finalists": {name: c.short() for name, c in contestants.items()},
            "configs": len(passed), "search_trials": outcome.measured, "search_new": outcome.new_trials,
            "search_s": round(outcome.elapsed_s, 1), "strategy": strategy,
            "stream_us": best.get("stream"), "pdl_us": best.get("pdl"), "tile_us": best.get("tile"),
            "tuned_us": best[tuned] if tuned else float("nan"), "tuned": tuned,
            "selection_us": {k: v[0] for k, v in found.items()}, "rounds_us": rounds,
            **{f"{kind}_config": found[kind][1].to_dict() if kind in found else None
               for kind in ("stream", "pdl", "tile")}}


def network_figures(summary: dict[str, Any], workload: str) -> list[dict[str, Any]]:
    """The whole-network figure per value of the swept size whose every layer the summary holds:
    each column (tuned, ours stream, every baseline, floor) summed over the layers, each layer's
    time times its multiplicity, with the formula that was summed."""
    wl = get_workload(workload)
    if not wl.network:
        return []
    rows = {json.dumps(r["size"], sort_keys=True): r for r in summary["rows"]}
    out = []
    for v in dict.fromkeys(r["size"].get(wl.sweep_param) for r in summary["rows"]):
        layers = [(rows.get(json.dumps({**wl.chain(**{wl.sweep_param: v, **layer}).size_dict}, sort_keys=True)), n)
                  for layer, n in wl.network]
        if any(r is None for r, _ in layers):
            continue
        cols: dict[str, float] = {}
        for name in ("tuned_us", "stream_us", "floor_us"):
            if all(r.get(name) is not None for r, _ in layers):
                cols[name.removesuffix("_us")] = sum(n * r[name] for r, n in layers)
        for name in set.intersection(*(set(r["baselines_us"]) for r, _ in layers)):
            cols[name] = sum(n * r["baselines_us"][name] for r, n in layers)
        mixed = len({r["size"].get("depth") for r, _ in layers}) > 1  # say each chain's depth where they differ
        formula = " + ".join(f"{n} x {'x'.join(str(r['size'][k]) for k in ('height', 'width', 'channels') if k in r['size'])}"
                             + (f" ({r['size']['depth']} deep)" if mixed else "") for r, n in layers)
        out.append({wl.sweep_param: v, "us": {k: round(x, 2) for k, x in cols.items()}, "formula": formula})
    return out


def network_table(figures: list[dict[str, Any]], sweep: str) -> str:
    """The whole-network figures as text: µs, and PyTorch's best over ours (>1 means we are faster)."""
    lines = []
    for f in figures:
        us = f["us"]
        torch_best = best_pytorch(us)
        ratio = f", best PyTorch / tuned {ratio_text(torch_best / us['tuned'])}" if torch_best and us.get("tuned") else ""
        cells = ", ".join(f"{k} {v:.1f}" for k, v in sorted(us.items()))
        lines.append(f"whole network, {sweep}={f[sweep]}: {cells} µs{ratio}  [sum of {f['formula']}]")
    return "\n".join(lines)


def named_finalists(passed: list[tuple[float, Config]], per_kind: int = FINAL_PER_KIND) -> dict[str, Config]:
    """The study's finalists named ``stream``, ``stream#2``, ..., ``tile``, ``tile#2``, ..."""
    out: dict[str, Config] = {}
    rank: dict[str, int] = {}
    for c in finalists(passed, per_kind):
        k = sync_kind(c)
        rank[k] = rank.get(k, 0) + 1
        out[k if rank[k] == 1 else f"{k}#{rank[k]}"] = c
    return out


def fastest_per_kind(contestants: dict[str, Config], final: dict[str, float]) -> dict[str, str]:
    """Per kind (``stream``, ``tile``), the name of the finalist fastest in the final rounds, which
    time everyone at the same clock; a finalist the rounds left out cannot be picked."""
    picked: dict[str, str] = {}
    for name, cfg in contestants.items():
        kind = sync_kind(cfg)
        if name in final and (kind not in picked or final[name] < final[picked[kind]]):
            picked[kind] = name
    return picked


def picked_configs(summary_path: Path, label: str) -> list[Config]:
    """The configs a bench summary picked for chain ``label``, one per kind of sync (none if it has no such row)."""
    try:
        rows = json.loads(Path(summary_path).read_text()).get("rows", [])
    except (OSError, ValueError, AttributeError):
        return []
    out = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if isinstance(row, dict) and row.get("label") == label:
            for key in ("tile_config", "pdl_config", "stream_config"):
                if row.get(key) is not None:  # a kind the bench found nothing for
                    out.append(Config.from_dict(row[key], where=f"{summary_path}: rows[{i}].{key}"))
    return out


def _row_text(r: dict[str, Any]) -> str:
    b = ", ".join(f"{k} {v:.1f}" for k, v in {**r["baselines_us"], **r.get("compared_us", {})}.items())
    return (f"{r['label']}: tuned {r['tuned_us']:.1f} µs (stream {r['stream_us']}, pdl {r.get('pdl_us')}, "
            f"tile {r['tile_us']}), "
            f"floor {r['floor_us']:.1f}; {b}; {r['search_trials']} trials in {r['search_s']} s")


def hbm_text(bytes_us: float | None, us: float | None) -> str:
    """The share of HBM bandwidth a time uses (the chain's fewest bytes at the measured bandwidth over
    it), or ``-`` where a summary predates it."""
    return f"{bytes_us / us:.0%}" if bytes_us and us and us == us else "-"


def table(summary: dict[str, Any]) -> str:
    """The bench summary as a text table: times in µs and ratios (>1 means we are faster)."""
    names = sorted({k for r in summary["rows"] for k in {**r["baselines_us"], **r.get("compared_us", {})}})
    head = ["size", "floor", "ours stream", "ours pdl", "ours tile", "tuned", *names, "tuned/floor", "tuned HBM",
            *(f"x vs {n}" for n in names), "pdl vs stream", "tile vs stream"]
    lines = ["  ".join(head)]
    for r in summary["rows"]:
        tuned = r["tuned_us"]
        others = {**r["baselines_us"], **r.get("compared_us", {})}
        vs = [ratio_text(others[n] / tuned) if n in others else "-" for n in names]
        lines.append("  ".join([",".join(f"{k}={v}" for k, v in r.get("size", {"tokens": r["tokens"]}).items()), us_text(r["floor_us"]), us_text(r["stream_us"]), us_text(r.get("pdl_us")), us_text(r["tile_us"]), us_text(tuned),
                                *(us_text(others.get(n)) for n in names), ratio_text(tuned / r['floor_us']),
                                hbm_text(r.get("bytes_us"), tuned), *vs,
                                ratio_text(over_stream(r, "pdl")), ratio_text(over_stream(r, "tile"))]))
    return "\n".join(lines)


def stages_table(summary: dict[str, Any]) -> str:
    """Each stage alone against the library, as text: µs, and the library over ours (>1: we are faster)."""
    lines = ["stage  M x N x K  epilogue  ours  " + "  ".join(["best library", "library / ours", "our tiling"])]
    for r in summary["rows"]:
        for s in r.get("stages_alone", []):
            lib = min(s["baselines_us"].values()) if s["baselines_us"] else None
            name = min(s["baselines_us"], key=s["baselines_us"].get) if lib else "-"
            ratio = ratio_text(lib / s['ours_us']) if lib and s["ours_us"] else "-"
            lines.append(f"{r['label'].split('/')[0]}.{s['stage']}  {'x'.join(map(str, s['shape']))}  {s['epilogue']}  "
                         f"{us_text(s['ours_us'])}  {us_text(lib)} ({name})  {ratio}  {s['config']}")
    return "\n".join(lines)


def main(args) -> int:
    """CLI entry: ``bench WORKLOAD [size flags] [--trials N] [--out PATH]``."""
    from ..backends.gpu import gpu_available
    from ..paths import home

    if not gpu_available():
        raise UsageError("bench needs a CUDA GPU and none is visible (study runs without one, on recordings)")
    wl = get_workload(args.workload)
    out = Path(args.out or f"studies/{args.workload}.bench.json")
    space = args.space or home() / "search_spaces" / f"{args.workload}.toml"
    sizes = (wl.network_sizes(getattr(args, wl.sweep_param) or wl.sweep) if getattr(args, "network", False)
             else wl.requested_sizes(vars(args)))
    run_bench(args.workload, sizes, out, space, args.storage, strategy=args.strategy,
              trials=args.trials, seed=args.seed or 0, compare=list(args.compare or []),
              graphs=getattr(args, "graphs", False), ablate=list(getattr(args, "ablate", None) or []),
              stages=getattr(args, "stages", False), sustained_s=getattr(args, "sustained", None) or 0.0,
              compiled=getattr(args, "compile", False))
    return 0
