"""Recorded measurements: the file format, and a backend that answers from it instead of a GPU.

A recording is one JSON file per device::

    {"schema": 1, "kind": "tuner-measurements", "synthetic": false,
     "command": "python -m tuner bench gpt3 ...",
     "device": {DeviceInfo.to_dict()},
     "records": [{"label": "gpt3/tokens=64,hidden=12288,ffn=6144",
                  "config": {Config.to_dict()}, "measurement": {Measurement.to_dict()}}]}

``synthetic: true`` marks figures made by a model rather than measured; every
figure replayed from such a file is labelled so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .. import UsageError
from ..chain.workloads import Chain
from ..config import Config
from .base import Backend, DeviceInfo, Measurement

SCHEMA = 1
KIND = "tuner-measurements"


class ReplayError(UsageError):
    """A recording cannot be read, or does not hold what was asked of it."""


@dataclass(frozen=True)
class Record:
    """One recorded outcome: a config of the chain named by ``label``, and what it measured."""

    label: str
    config: Config
    measurement: Measurement


@dataclass(frozen=True)
class Recording:
    """The contents of one recording file."""

    path: Path
    device: DeviceInfo
    records: tuple[Record, ...]
    command: str = ""
    synthetic: bool = False

    def pick(self, text: str, rank: int = 0) -> Record:
        """The measured record ranked ``rank`` by median (0: the fastest) among those whose label
        contains ``text``, which must name one label."""
        found = sorted((r for r in self.records if text in r.label and r.measurement.ok),
                       key=lambda r: r.measurement.median_us)
        labels = sorted({r.label for r in found})
        if len(labels) != 1:
            shown = f": {', '.join(labels[:5])}{' ...' if len(labels) > 5 else ''}" if labels else ""
            raise ReplayError(f"{text!r} matches {len(labels)} labels of measured records in {self.path}{shown}; "
                              "accepted: text that names one")
        if rank >= len(found):
            raise ReplayError(f"rank {rank}: {labels[0]} has {len(found)} measured configs")
        return found[rank]


def _record_dict(r: Record | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(r, Record):
        return {"config": r.config.to_dict(), "label": r.label, "measurement": r.measurement.to_dict()}
    cfg, m = r["config"], r["measurement"]
    return {"config": cfg.to_dict() if isinstance(cfg, Config) else dict(cfg), "label": str(r["label"]),
            "measurement": m.to_dict() if isinstance(m, Measurement) else dict(m)}


def write_recording(path: str | Path, device: DeviceInfo, records: Iterable[Record | Mapping[str, Any]],
                    command: str, *, synthetic: bool = False) -> None:
    """Write a recording; the output depends only on the arguments (one record per line, sorted keys).

    A record is a :class:`Record` or a mapping with ``label``, ``config`` and ``measurement``
    (objects or their ``to_dict()`` forms).
    """
    Path(path).write_text(recording_text(device, records, command, synthetic=synthetic))


def recording_text(device: DeviceInfo, records: Iterable[Record | Mapping[str, Any]], command: str, *,
                   synthetic: bool = False) -> str:
    """The text :func:`write_recording` writes."""
    head = {"schema": SCHEMA, "kind": KIND, "synthetic": synthetic, "command": command, "device": device.to_dict()}
    lines = [json.dumps(_record_dict(r), sort_keys=True) for r in records]
    return json.dumps(head, sort_keys=True, indent=1)[:-2] + ',\n "records": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def _device_from(d: Any, path: Path) -> DeviceInfo:
    return DeviceInfo.from_dict(d, f"{path}: device")


def read_recording(path: str | Path) -> Recording:
    """Read and check one recording file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ReplayError(f"cannot read recording {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ReplayError(f"{path}: not a measurement recording (expected \"kind\": \"{KIND}\")")
    if data.get("schema") != SCHEMA:
        raise ReplayError(f"{path}: recording schema {data.get('schema')!r} is not supported; accepted: {SCHEMA}")
    records = []
    for i, r in enumerate(data.get("records", [])):
        try:
            records.append(Record(str(r["label"]), Config.from_dict(r["config"], f"{path}: record {i}"),
                                  Measurement.from_dict(r["measurement"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"{path}: record {i} is malformed: {exc}") from None
    return Recording(path, _device_from(data.get("device"), path), tuple(records), str(data.get("command", "")),
                     bool(data.get("synthetic", False)))


class ReplayBackend(Backend):
    """Answers ``measure`` from recordings of one device; never touches a GPU."""

    name = "replay"
    replayed = True
    features = frozenset({"labels"})

    def __init__(self, paths: Sequence[str | Path]):
        if not paths:
            raise ReplayError("no recording to replay; pass --replay-file PATH (a *.measurements.json file)")
        self.recordings = [read_recording(p) for p in paths]
        devices = sorted({r.device.name for r in self.recordings})
        if len(devices) > 1:
            raise ReplayError(f"the recordings cover several devices ({', '.join(devices)}); "
                              "pass --replay-file with the files of one device")
        self._device = self.recordings[0].device
        self.synthetic = any(r.synthetic for r in self.recordings)
        self._table: dict[str, dict[Config, Measurement]] = {}
        for rec in self.recordings:
            for r in rec.records:
                # A later file wins, so a fresh recording can be laid over an old one.
                self._table.setdefault(r.label, {})[r.config] = r.measurement

    @property
    def paths(self) -> list[Path]:
        return [r.path for r in self.recordings]

    def labels(self) -> list[str]:
        """Chain labels that have recorded measurements."""
        return sorted(self._table)

    def device_info(self) -> DeviceInfo:
        return self._device

    def recorded(self, chain: Chain) -> list[Config]:
        """Every recorded config of ``chain``, in file order."""
        return list(self._table.get(chain.label, {}))

    def restrict(self, chain: Chain, configs: Iterable[Config]) -> list[Config]:
        """The recorded configs that are also in ``configs`` (a container is tested, not iterated)."""
        recorded = self.recorded(chain)
        if hasattr(configs, "__contains__") and not isinstance(configs, (list, tuple)):
            return [c for c in recorded if c in configs]
        wanted = set(configs)
        return [c for c in recorded if c in wanted]

    def measure(self, chain: Chain, config: Config) -> Measurement:
        try:
            m = self._table[chain.label][config]
        except KeyError:
            files = ", ".join(str(p) for p in self.paths)
            raise ReplayError(f"no recorded measurement of {chain.label} with {config.short()} in {files}") from None
        return replace(m, times_us=list(m.times_us), resources=dict(m.resources), replayed=True)
