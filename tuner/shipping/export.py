"""Export the best configs of a workload's studies, per device and size, as JSON or a C++ header,
or every measurement of them as a recording that the replay backend reads. (The runnable bundle,
:mod:`tuner.shipping.bundle`, is built on :func:`collect`.)

The output depends only on the stored trials: keys are sorted, rows are in a
fixed order and nothing records when it was written, so two identical studies
export byte-identical files.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .. import UsageError, __version__, shown
from ..backends.base import FAIL_REASONS
from ..chain.workloads import WorkloadError, get_workload
from ..config import GLOBAL_DEFAULTS, GLOBAL_FIELDS, TILE_CHOICES, TILE_DEFAULTS, TILE_FIELDS, ConfigError
from ..storage.database import open_optuna_storage
from ..storage.trials import final_heat, stored_trials, study_summaries, summarize, trial_config

SCHEMA_VERSION = 1
FORMATS = ("json", "header", "recording")


def collect(storage: str, workload: str) -> list[dict[str, Any]]:
    """One result per stored study of ``workload``: best config, baseline, speedup, trial and failure counts."""

    wl = get_workload(workload)
    rdb = open_optuna_storage(storage, read_only=True)
    rows = []
    summaries = study_summaries(rdb)
    alone: dict[tuple[str, str], int] = {}  # (chain label, device) -> trials of its stages timed alone
    for s in summaries:
        if "stage" in s.user_attrs:
            key = (s.user_attrs.get("label", ""), s.user_attrs.get("device", ""))
            alone[key] = alone.get(key, 0) + s.n_trials
    for s in summaries:
        attrs = s.user_attrs
        if attrs.get("workload") != wl.name or "stage" in attrs:  # a stage timed alone is not a result
            continue
        trials = stored_trials(rdb, s.study_name)
        summ = summarize(trials)
        best = summ.best
        chain = _study_chain(attrs, s.study_name)
        configs = {t.number: trial_config(t, chain.stage_names, s.study_name) for t in trials}  # each one checked
        config = None if best is None else configs[best.number]
        rows.append({
            "study": _printable(s.study_name, "name", s.study_name),
            "label": attrs.get("label", ""),
            "device": _printable(attrs.get("device", ""), "device", s.study_name),
            "size": chain.size_dict,
            "replayed": bool(attrs.get("replayed", False)),
            "synthetic": bool(attrs.get("synthetic", False)),
            "graphs": bool(attrs.get("graphs", False)),  # timed as CUDA graph replays
            "trials": summ.measured,
            "stage_trials": alone.get((attrs.get("label", ""), attrs.get("device", "")), 0),
            "failures": {r: summ.failures.get(r, 0) for r in FAIL_REASONS},
            "refused": summ.rejected,  # of the constraint failures: suggestions refused before measuring
            "best": None if best is None else {
                "params": dict(sorted(config.params(chain.stage_names).items())) if config is not None else {},
                "config": config.to_dict() if config is not None else None,
                "short": config.short() if config is not None else "",
                "median_us": best.value,
                "error": best.user_attrs.get("error"),
                # The seconds of its own runs each final timing followed (study --sustained); 0: after idle.
                "sustained_s": final_heat(best),
            },
            "baseline_us": summ.baseline_us,
            "speedup": summ.speedup,
        })
    rows.sort(key=lambda r: (r["device"], tuple(r["size"].get(p, 0) for p in wl.params), r["study"]))
    return rows


def one_per_size(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """What a runnable export (header, bundle) holds: one result per device and size, since a
    lookup by size must find one config. A size studied both ways, launches timed from the host and
    (``--graphs``) from CUDA graph replays, keeps its graph-timed study: its median counts the
    kernels without host launch gaps, as a chain replayed from a graph runs, and the two studies'
    medians are not comparable, so neither best can be said faster. Returns the kept rows in
    order, and the study names left out."""
    kept: dict[tuple[str, tuple], dict[str, Any]] = {}
    left: list[str] = []
    for r in rows:
        key = (r["device"], tuple(sorted(r["size"].items())))
        have = kept.get(key)
        if have is None:
            kept[key] = r
            continue
        if (r["graphs"], r["trials"]) > (have["graphs"], have["trials"]):
            kept[key], r = r, have
        left.append(r["study"])
    chosen = {id(r) for r in kept.values()}
    return [r for r in rows if id(r) in chosen], left


def _printable(text: Any, what: str, study: str) -> str:
    """A stored name (a device's, a study's), refused unless it is one line of printable text: it
    goes into file names, C++ strings and comments."""
    if not isinstance(text, str) or not text.isprintable() or len(text) > 1024:
        raise ConfigError(f"study {shown(study, 80)}: {what} {shown(text)}: accepted: one line of printable text")
    return text


def _study_chain(attrs: dict[str, Any], study: str) -> Any:
    """The chain a stored study tunes, from its workload and size, checked as a command line's are."""
    size = attrs.get("size")
    try:
        if not isinstance(size, dict):
            raise WorkloadError(f"size {size!r} is not a table of sizes")
        return get_workload(str(attrs.get("workload"))).chain(**size)
    except (WorkloadError, TypeError) as exc:
        raise ConfigError(f"study {study!r}: its size is not one this version can run: {exc}") from None


def document(storage: str, workload: str) -> dict[str, Any]:
    """The export of ``workload`` as a JSON-ready dict."""
    rows = collect(storage, workload)
    if not rows:
        raise UsageError(f"no study of {workload} in {storage}; run python -m tuner study {workload} first, "
                         "or pass --storage with the URL the studies were written to")
    return {"schema_version": SCHEMA_VERSION, "workload": workload, "tuner_version": __version__, "results": rows}


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"


def _cpp_name(workload: str) -> str:
    return "".join(part.capitalize() for part in workload.replace("-", "_").split("_"))


def _num(x: float | None) -> str:
    return "0.0" if x is None or not math.isfinite(float(x)) else repr(float(x))


def _cpp_str(text: str) -> str:
    """A C++ string literal of ``text``: printable ASCII as it is (quotes and backslashes escaped),
    every other byte of its UTF-8 in octal."""
    out = []
    for b in text.encode():
        c = chr(b)
        out.append("\\" + c if c in '"\\' else c if 32 <= b < 127 else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def to_header(doc: dict[str, Any]) -> str:
    """A C++ header with one ``constexpr`` entry per device and size that has a best config."""
    wl = get_workload(doc["workload"])
    rows, left = one_per_size([r for r in doc["results"] if r["best"] is not None])
    if not rows:
        raise UsageError(f"nothing to export for {wl.name}: no study has a successful trial yet")
    n = len(rows[0]["best"]["config"]["tiles"])
    name = _cpp_name(wl.name)
    fields = ["  const char* device;"]
    fields += [f"  int {p};" for p in wl.params]
    fields += [f"  const char* {f};" for f in GLOBAL_FIELDS]
    fields += [f"  {'const char*' if f in TILE_CHOICES else 'int'} {f}[{n}];" for f in TILE_FIELDS]
    fields += ["  double median_us;", "  double baseline_us;  // 0 when no stream baseline was measured",
               "  double speedup;  // 0 when no stream baseline was measured",
               "  bool replayed;  // figures replayed from a recording", "  bool synthetic;  // modelled, not measured"]
    entries = []
    for r in rows:
        cfg = r["best"]["config"]
        vals = [_cpp_str(r["device"])] + [str(r["size"].get(p, 0)) for p in wl.params]
        vals += [_cpp_str(cfg.get(k, GLOBAL_DEFAULTS.get(k))) for k in GLOBAL_FIELDS]
        vals += ["{" + ", ".join(_cpp_str(v) if f in TILE_CHOICES else str(v)
                                 for t in cfg["tiles"] for v in [t.get(f, TILE_DEFAULTS.get(f))]) + "}"
                 for f in TILE_FIELDS]
        vals += [_num(r["best"]["median_us"]), _num(r["baseline_us"]), _num(r["speedup"]),
                 "true" if r["replayed"] else "false", "true" if r["synthetic"] else "false"]
        entries.append("    {" + ", ".join(vals) + "},")
    lines = [
        f"// Tuned configs of {wl.name}: {wl.description}.",
        f"// Exported by tuner {doc['tuner_version']} (python -m tuner export {wl.name} --format header),"
        f" schema {doc['schema_version']}.",
        *([f"// One entry per device and size; left out for a study of the same size timed from CUDA graphs "
           f"(or with more trials): {', '.join(left)}."] if left else []),
        "#pragma once",
        "",
        "namespace tuner_tuned {",
        "",
        f"struct {name}Entry {{",
        *fields,
        "};",
        "",
        f"constexpr {name}Entry k{name}[] = {{",
        *entries,
        "};",
        f"constexpr int k{name}Count = {len(entries)};",
        "",
        "}  // namespace tuner_tuned",
        "",
    ]
    return "\n".join(lines)


def recording(storage: str, workload: str, command: str) -> str:
    """Every measured (not replayed) outcome of ``workload``'s studies, stages timed alone included,
    as the text of a recording (see :func:`tuner.backends.replay.write_recording`)."""

    from ..backends.replay import recording_text  # noqa: PLC0415
    from ..device import DeviceInfo  # noqa: PLC0415
    from ..storage.measurements import MeasurementStore  # noqa: PLC0415

    wl = get_workload(workload)
    rdb = open_optuna_storage(storage, read_only=True)
    devices: dict[str, DeviceInfo] = {}
    labels: set[str] = set()
    replayed = 0
    for s in study_summaries(rdb):
        attrs = s.user_attrs
        if attrs.get("workload") != wl.name:
            continue
        if attrs.get("replayed"):
            replayed += 1
            continue
        chain = _study_chain(attrs, s.study_name)
        labels |= {chain.label, *(chain.alone(j).label for j in range(len(chain.stages)))}
        for t in stored_trials(rdb, s.study_name):
            if isinstance(t.user_attrs.get("device"), dict):
                d = DeviceInfo.from_dict(t.user_attrs["device"], f"study {s.study_name!r}, trial {t.number}: device")
                devices.setdefault(d.name, d)
                break
    if not devices and replayed:
        raise UsageError(f"the {replayed} {workload} studies in {storage} replay recorded measurements, and a "
                         "recording holds GPU measurements only: the recordings they replay (--replay-file, by "
                         "default studies/*.measurements.json) are already the recording; accepted: a storage "
                         "that a study on a GPU wrote")
    if len(devices) != 1:
        found = ", ".join(sorted(devices)) or "none"
        raise UsageError(f"a recording holds one device's measurements; {storage} holds {workload} "
                         f"measured on: {found}")
    (device,) = devices.values()
    store = MeasurementStore(storage, read_only=True)
    try:
        records = store.records(device, sorted(labels))
    finally:
        store.close()
    return recording_text(device, records, command)


def export(storage: str, workload: str, out: str | Path | None = None, fmt: str = "json",
           command: str = "") -> Path:
    """Write the export of ``workload``; the default path is ``tuned/<workload>.json`` (``.h``,
    ``.measurements.json``)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}; accepted: {', '.join(FORMATS)}")
    if fmt == "recording":
        text = recording(storage, workload, command)
    else:
        doc = document(storage, workload)
        text = to_json(doc) if fmt == "json" else to_header(doc)
    suffix = {"json": "json", "header": "h", "recording": "measurements.json"}[fmt]
    path = Path(out) if out else Path("tuned") / f"{workload}.{suffix}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
