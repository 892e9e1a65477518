"""The current results, as the tables that README.md and studies/README.md show.

``studies/results.toml`` lists, per workload and GPU, the bench runs whose figures stand today
(a bench summary each, with the commit that recorded it). This module turns that index into
Markdown: a short table for the README (one row per workload and GPU, the range of ratios over
its sizes) and a full one per workload for the results page (every size, its times, ratios,
run and command). The blocks between ``<!-- results:NAME begin -->`` and ``<!-- results:NAME end -->``
in those files are generated; ``python -m tuner.shipping.results`` (no option) says whether they agree with
the index (a test runs it), ``--write`` rewrites them. Every figure is a GPU measurement: the
bench timed our chains and PyTorch's in one process.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import UsageError
from ..chain.workloads import get_workload
from ..paths import home
from ..tomlfile import read_toml
from .report import best_pytorch

INDEX = "studies/results.toml"
PAGES = {"summary": "README.md", "index": "studies/README.md"}


@dataclass(frozen=True)
class Row:
    """One size of a workload as its latest listed run timed it."""

    label: str
    size: dict[str, int]
    tuned_us: float
    stream_us: float | None
    pytorch_us: float | None
    floor_us: float | None
    summary: str
    commit: str
    command: str

    @property
    def over_pytorch(self) -> float | None:
        return self.pytorch_us / self.tuned_us if self.pytorch_us else None

    @property
    def over_stream(self) -> float | None:
        return self.stream_us / self.tuned_us if self.stream_us else None


@dataclass(frozen=True)
class Table:
    """The current results of one workload on one GPU."""

    workload: str
    gpu: str
    rows: tuple[Row, ...]


def load_index(root: Path | None = None) -> list[Table]:
    """The tables of ``studies/results.toml``, their rows read from the summaries it lists."""
    root = root or home()
    path = root / INDEX
    data = read_toml(path, "results index", UsageError)
    tables = []
    for i, t in enumerate(data.get("table", [])):
        where = f"{path}: table {i + 1}"
        try:
            wl = get_workload(t["workload"])
            gpu, runs = str(t["gpu"]), list(t["runs"])
        except (KeyError, TypeError) as exc:
            raise UsageError(f"{where}: needs workload, gpu and runs ({exc})") from None
        rows: dict[str, Row] = {}
        for run in runs:
            summary = root / "studies" / run["summary"]
            try:
                doc = json.loads(summary.read_text())
            except (OSError, ValueError) as exc:
                raise UsageError(f"{where}: cannot read {summary}: {exc}") from None
            if doc.get("workload") != wl.name or doc.get("device", {}).get("name") != gpu:
                raise UsageError(f"{where}: {run['summary']} holds {doc.get('workload')} on "
                                 f"{doc.get('device', {}).get('name')}, not {wl.name} on {gpu}")
            for r in doc.get("rows", []):
                if r.get("tuned_us") is None:
                    continue
                size = r.get("size") or {wl.sweep_param: r["tokens"], **wl.defaults}
                rows[r["label"]] = Row(r["label"], dict(size), r["tuned_us"], r.get("stream_us"),
                                       best_pytorch(r.get("baselines_us") or {}), r.get("floor_us"),
                                       run["summary"], str(run["commit"]), str(doc.get("command", "")))
        ordered = sorted(rows.values(), key=lambda r: tuple(r.size.get(p, 0) for p in (*wl.defaults, wl.sweep_param)))
        tables.append(Table(wl.name, gpu, tuple(ordered)))
    return tables


def _ratio_range(values: Sequence[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    lo, hi = min(got), max(got)
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"


def _anchor(t: Table) -> str:
    return re.sub(r"[^a-z0-9-]", "", f"{t.workload}-on-{t.gpu}".lower().replace(" ", "-"))


def summary_block(tables: Sequence[Table]) -> str:
    """The README's table: per workload and GPU, the range over its sizes of the tuned chain's
    speedup over PyTorch's best chain and over our own stream order."""
    lines = ["| workload | GPU | sizes | tuned vs PyTorch's best | tuned vs our stream order | every size |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for t in tables:
        lines.append(f"| `{t.workload}` | {t.gpu} | {len(t.rows)} | {_ratio_range([r.over_pytorch for r in t.rows])} "
                     f"| {_ratio_range([r.over_stream for r in t.rows])} | [table](studies/README.md#{_anchor(t)}) |")
    return "\n".join(lines)


def _size_text(wl_name: str, size: dict[str, int]) -> str:
    wl = get_workload(wl_name)
    fixed = {k: v for k, v in size.items() if k != wl.sweep_param and wl.defaults.get(k) != v}
    return f"{wl.sweep_param} {size.get(wl.sweep_param)}" + "".join(f", {k} {v}" for k, v in fixed.items())


def index_block(tables: Sequence[Table]) -> str:
    """The results page's index: per workload and GPU, every size with its times, ratios, run and commit."""
    out = []
    for t in tables:
        out += [f"### {t.workload} on {t.gpu}", "",
                "| size | tuned µs | our stream order µs | PyTorch's best µs | vs PyTorch | vs stream | floor µs "
                "| run | commit |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for r in t.rows:
            def us(v: float | None) -> str:
                return "-" if v is None else f"{v:.1f}"

            def x(v: float | None) -> str:
                return "-" if v is None else f"{v:.2f}x"

            out.append(f"| {_size_text(t.workload, r.size)} | {us(r.tuned_us)} | {us(r.stream_us)} | "
                       f"{us(r.pytorch_us)} | {x(r.over_pytorch)} | {x(r.over_stream)} | {us(r.floor_us)} | "
                       f"[{r.summary}]({r.summary}) | {r.commit} |")
        commands = dict.fromkeys((r.summary, r.command) for r in t.rows)
        out += ["", "Commands:", ""] + [f"- `{s}`: `{c}`" for s, c in commands] + [""]
    return "\n".join(out).rstrip()


def blocks(root: Path | None = None) -> dict[str, str]:
    """Each generated block's text, by name."""
    tables = load_index(root)
    return {"summary": summary_block(tables), "index": index_block(tables)}


def _marks(name: str) -> tuple[str, str]:
    return f"<!-- results:{name} begin (generated from {INDEX}: python -m tuner.shipping.results --write) -->", \
        f"<!-- results:{name} end -->"


def replaced(text: str, name: str, block: str) -> str:
    """``text`` with the block called ``name`` replaced by ``block``; an error where its marks are missing."""
    begin, end = _marks(name)
    head, found, rest = text.partition(begin)
    body, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise UsageError(f"no generated block {name!r} (the line {begin!r} and, after it, {end!r})")
    return f"{head}{begin}\n{block}\n{end}{tail}"


def stale(root: Path | None = None) -> list[str]:
    """The pages whose generated blocks disagree with the index (empty when all agree)."""
    root = root or home()
    made = blocks(root)
    out = []
    for name, page in PAGES.items():
        text = (root / page).read_text()
        if replaced(text, name, made[name]) != text:
            out.append(page)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.shipping.results", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the generated blocks (default: only check them)")
    args = p.parse_args(argv)
    root = home()
    try:
        if args.write:
            made = blocks(root)
            for name, page in PAGES.items():
                path = root / page
                path.write_text(replaced(path.read_text(), name, made[name]))
                print(f"wrote the {name} block of {path}")
            return 0
        bad = stale(root)
    except UsageError as exc:
        print(f"tuner.shipping.results: error: {exc}", file=sys.stderr)
        return 2
    for page in bad:
        print(f"{page}: its results block disagrees with {INDEX}; run python -m tuner.shipping.results --write", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
