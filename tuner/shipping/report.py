"""``python -m tuner report WORKLOAD``: plots and a Markdown page from recorded bench summaries.

A bench summary (``studies/<workload>.bench.json``, ``studies/search/<workload>*.bench.json``)
holds, per size, our tuned chain, our best stream-synchronized chain, every baseline and the
floor, all timed in one process on the GPU. The report draws, per model shape (the sizes that
are not swept), the time of each against the swept size, and the speedups of tile-sync over
stream-sync and of the tuned chain over the best baseline, the 1.0 line marked. It needs no GPU:
its figures are the recorded measurements, and say which device and file they come from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import UsageError
from ..chain.workloads import get_workload
from ..paths import home


@dataclass
class Series:
    """The rows of one model shape, ordered by the swept size."""

    shape: dict[str, int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # label -> summary file
    device: str = ""

    @property
    def name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape.items()) or "default"


# Folders of ``studies/`` whose bench runs, made after a kernel change, supersede the earlier ones,
# oldest first (the other folders hold experiments: ablations, rechecks, strategies).
LATER_RUNS = ("realloc", "gqa")


def default_summaries(workload: str) -> list[Path]:
    """The workload's summaries under ``studies/``: the searches from scratch (``search/``), the
    main one, then the others of its runs (``<workload>-*.bench.json``), then those of the
    :data:`LATER_RUNS` folders, each group in name order, so that a bench run's row outranks a
    search experiment's and a later run's an earlier one's. A name's prefix is not enough
    (``gpt3-attn-decode`` starts like a ``gpt3`` run): each file's own workload decides."""
    root = home() / "studies"
    found = [*sorted((root / "search").glob(f"{workload}-*.bench.json")), root / f"{workload}.bench.json",
             *sorted(root.glob(f"{workload}-*.bench.json")),
             *(p for folder in LATER_RUNS for p in sorted((root / folder).glob(f"{workload}-*.bench.json")))]
    return [p for p in found if p.is_file() and _workload_of(p) in (workload, None)]


def _workload_of(path: Path) -> str | None:
    """The workload a bench summary names (None where it cannot be read: collect_series says why)."""
    try:
        return json.loads(path.read_text()).get("workload")
    except (OSError, ValueError, AttributeError):
        return None


def collect_series(workload: str, paths: Sequence[Path]) -> list[Series]:
    """Rows of the summaries grouped by model shape. Of two rows for the same size, one timed in CUDA
    graphs wins over one timed as launches (PyTorch's best is a graph: only then are the terms
    equal), else the later file's."""
    wl = get_workload(workload)
    by_label: dict[str, tuple[dict[str, Any], str, str]] = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read bench summary {path}: {exc}") from None
        if doc.get("kind") != "tuner-bench" or doc.get("workload") != wl.name:
            raise UsageError(f"{path} is not a bench summary of {wl.name}; accepted: a file python -m tuner bench "
                             f"{wl.name} wrote")
        for row in doc.get("rows", []):
            if row.get("tuned_us") is None:
                continue
            if "size" not in row:  # summaries from before sizes were recorded: the sweep at default sizes
                row = {**row, "size": {wl.sweep_param: row["tokens"], **wl.defaults}}
            row = {**row, "graphs": bool(doc.get("graphs")), "timing": _timing_note(doc)}
            held = by_label.get(row["label"])
            if held is None or row["graphs"] or not held[0]["graphs"]:
                by_label[row["label"]] = (row, str(path), doc.get("device", {}).get("name", "?"))
    series: dict[str, Series] = {}
    for label, (row, path, device) in by_label.items():
        shape = {k: row["size"][k] for k in wl.params if k != wl.sweep_param and k in row["size"]}
        s = series.setdefault(json.dumps(shape, sort_keys=True), Series(shape, device=device))
        s.rows.append(row)
        s.sources[label] = path
    for s in series.values():
        s.rows.sort(key=lambda r: r["size"][wl.sweep_param])
    return list(series.values())


def _timing_note(doc: dict[str, Any]) -> str:
    """How a bench summary's final rounds were timed, beside its name, where not as launches after idle."""
    notes = (["in CUDA graphs"] if doc.get("graphs") else []) + (
        [f"each after {doc['sustained_s']:g} s of its own runs"] if doc.get("sustained_s") else [])
    return f" ({', '.join(notes)})" if notes else ""


def best_pytorch(us: dict[str, float]) -> float | None:
    """The fastest of the PyTorch variants among named times, or None when none ran."""
    return min((v for k, v in us.items() if k.startswith("torch")), default=None)


def recorded_library(backend: Any) -> dict[tuple[str, str], float]:
    """PyTorch's best chain per (chain label, device), as the bench runs that made a replay
    backend's recordings timed it in the same process (each ``<name>.bench.json`` beside its
    ``<name>.measurements.json``); empty for a measuring backend, which times no library here."""
    out: dict[tuple[str, str], float] = {}
    for rec in getattr(backend, "recordings", []):
        summary = rec.path.with_name(rec.path.name.replace(".measurements.json", ".bench.json"))
        try:
            doc = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        for row in doc.get("rows", []) if isinstance(doc, dict) else []:
            us = best_pytorch(row.get("baselines_us") or {}) if isinstance(row, dict) else None
            if us is not None:
                out.setdefault((str(row.get("label")), rec.device.name), us)
    return out


def over_stream(row: dict[str, Any], kind: str) -> float | None:
    """Our stream-sync chain's time over our best chain of another kind of sync (``tile``, ``pdl``)
    in a bench row: above 1, that kind is faster; None where either is missing."""
    stream, other = row.get("stream_us"), row.get(f"{kind}_us")
    return stream / other if stream and other else None


def ratio_text(v: float | None) -> str:
    """A ratio for a table, to a tenth of a percent (the gains of sync kinds over stream order are
    often below one percent); "-" where there is none."""
    return "-" if v is None else f"{v:.3f}"


def us_text(v: float | None) -> str:
    """A time in µs for a table; "-" where there is none."""
    return "-" if v is None else f"{v:.1f}"


def _best_baseline(row: dict[str, Any]) -> tuple[str, float] | None:
    base = row.get("baselines_us") or {}
    return min(base.items(), key=lambda kv: kv[1]) if base else None


def plot_series(s: Series, workload: str, out_dir: Path) -> tuple[Path, Path]:
    """Two PNGs for one shape: times against size, and speedups against size."""
    import matplotlib  # noqa: PLC0415 - optional dependency (the report extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sweep = get_workload(workload).sweep_param
    x = [r["size"][sweep] for r in s.rows]
    stem = f"{workload}-{s.name.replace('=', '').replace(',', '-')}"
    title = f"{workload} {s.name} on {s.device} (recorded bench measurements)"

    fig, ax = plt.subplots(figsize=(8, 5))
    lines = {"tuned": [r.get("tuned_us") for r in s.rows], "ours, stream-sync": [r.get("stream_us") for r in s.rows],
             "ours, stream-sync with PDL": [r.get("pdl_us") for r in s.rows]}
    for name in sorted({k for r in s.rows for k in (r.get("baselines_us") or {})}):
        lines[name] = [(r.get("baselines_us") or {}).get(name) for r in s.rows]
    lines["floor"] = [r.get("floor_us") for r in s.rows]
    for name, ys in lines.items():
        pts = [(a, b) for a, b in zip(x, ys) if b is not None]
        if pts:
            style = {"tuned": dict(lw=2.5), "floor": dict(ls=":", color="k")}.get(name, dict(lw=1.2))
            ax.plot(*zip(*pts), marker="o", ms=3, label=name, **style)
    ax.set_yscale("log")
    times = _save(plt, fig, ax, sweep, "time per chain (µs)", title, out_dir / f"{stem}-time.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    tile = [(a, v) for a, r in zip(x, s.rows) if (v := over_stream(r, "tile"))]
    pdl = [(a, v) for a, r in zip(x, s.rows) if (v := over_stream(r, "pdl"))]
    over = [(a, b[1] / r["tuned_us"]) for a, r in zip(x, s.rows) if (b := _best_baseline(r))]
    if tile:
        ax.plot(*zip(*tile), marker="o", ms=3, label="tile-sync over stream-sync (ours)")
    if pdl:
        ax.plot(*zip(*pdl), marker="o", ms=3, label="PDL over stream-sync (ours)")
    if over:
        ax.plot(*zip(*over), marker="o", ms=3, label="tuned over the best baseline")
    ax.axhline(1.0, color="k", lw=1, ls="--", label="1.0: as fast")
    speed = _save(plt, fig, ax, sweep, "speedup (>1: faster)", title, out_dir / f"{stem}-speedup.png")
    return times, speed


def _save(plt: Any, fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(workload: str, paths: Sequence[Path] | None = None, out_dir: Path | None = None) -> Path:
    """Plots and ``<workload>.md`` in ``out_dir`` (default ``studies/report``); returns the page."""
    wl = get_workload(workload)
    paths = list(paths) if paths else default_summaries(wl.name)
    if not paths:
        raise UsageError(f"no bench summary of {wl.name} under studies/; accepted: --summary F (python -m tuner "
                         f"bench {wl.name} writes one)")
    out_dir = Path(out_dir) if out_dir else home() / "studies" / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    series = collect_series(wl.name, paths)
    lines = [f"# {wl.name}: recorded results", "",
             f"{wl.description}. Every figure is a measurement recorded by `python -m tuner bench` (the file "
             "named in each row), not a replay; µs per chain, medians of interleaved rounds; ratios above 1 "
             f"mean we are faster. Made by `python -m tuner report {wl.name}`.", ""]
    for s in series:
        times, speed = plot_series(s, wl.name, out_dir)
        lines += [f"## {s.name} on {s.device}", "", f"![time]({times.name})", "", f"![speedup]({speed.name})", "",
                  f"| {wl.sweep_param} | tuned | ours stream-sync | ours PDL | best baseline | best / tuned | floor | "
                  "PDL vs stream | tile vs stream | source |",
                  "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in s.rows:
            b = _best_baseline(r)
            tvs, pvs = ratio_text(over_stream(r, "tile")), ratio_text(over_stream(r, "pdl"))
            src = Path(s.sources[r["label"]])
            try:
                src = src.relative_to(home())
            except ValueError:
                pass
            tuned = r["tuned_us"]
            best = "-" if b is None else f"{b[1]:.1f} ({b[0]})"
            ratio = "-" if b is None else ratio_text(b[1] / tuned)
            lines.append(f"| {r['size'][wl.sweep_param]} | {tuned:.1f} ({r.get('tuned')}) | {us_text(r.get('stream_us'))} | "
                         f"{us_text(r.get('pdl_us'))} | {best} | {ratio} | {r['floor_us']:.1f} | {pvs} | {tvs} | `{src}`{r['timing']} |")
        lines.append("")
    lines += network_lines(wl.name, paths)
    page = out_dir / f"{wl.name}.md"
    page.write_text("\n".join(lines))
    return page


def network_lines(workload: str, paths: Sequence[Path]) -> list[str]:
    """The whole-network figures the summaries hold (``bench --network``), as a Markdown table."""
    rows = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for f in doc.get("network") or []:
            rows.append((f, Path(path).name, _timing_note(doc)))
    if not rows:
        return []
    sweep = get_workload(workload).sweep_param
    out = ["## Whole network", "", "Each layer's chain time times its multiplicity, summed (µs; `bench --network`).", "",
           f"| {sweep} | tuned | ours stream-sync | best PyTorch | best PyTorch / tuned | floor | sum of | source |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for f, name, timing in rows:
        us = f["us"]
        torch_best = best_pytorch(us)
        cell = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = "-" if torch_best is None or not us.get("tuned") else ratio_text(torch_best / us["tuned"])
        out.append(f"| {f[sweep]} | {cell(us.get('tuned'))} | {cell(us.get('stream'))} | {cell(torch_best)} | {ratio} | "
                   f"{cell(us.get('floor'))} | {f['formula']} | `{name}`{timing} |")
    return out + [""]


def main(args: Any) -> int:
    """CLI entry: ``report WORKLOAD [--summary F ...] [--out DIR]``."""
    page = write_report(args.workload, args.summary, args.out)
    print(f"wrote {page} and its plots")
    return 0
