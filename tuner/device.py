"""The device a measurement is taken on (or a config is compiled for): what every cache key,
trial record and feasibility question names. Below everything that asks about a device."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from . import UsageError, shown

ARCH = re.compile(r"sm_\d{2,3}a?")  # what an architecture name looks like: sm_90, sm_90a


class DeviceError(UsageError):
    """A device record read back from a storage or a file is not one this version can use."""


@dataclass(frozen=True)
class DeviceInfo:
    """What a measurement was taken on; part of every cache key and trial record."""

    name: str
    arch: str = "sm_90"
    sms: int = 132
    smem_per_block: int = 227 * 1024
    regs_per_block: int = 65536
    l2_bytes: int = 50 * 1024 * 1024
    driver: str = ""
    toolkit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "device") -> "DeviceInfo":
        """A device record read back (a trial's, a recording's), every field checked: names are one
        line of printable text, the architecture is ``sm_XY`` or ``sm_XYa``, counts are positive
        integers. Fields this version does not know are left out."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise DeviceError(f"{where}: expected an object with at least a name")
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.type == "int" and not (isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 40):
                raise DeviceError(f"{where}: {f.name} = {shown(v)}: accepted: a positive integer")
            if f.type == "str" and not (isinstance(v, str) and v.isprintable() and len(v) <= 255):
                raise DeviceError(f"{where}: {f.name} = {shown(v)}: accepted: one line of printable text")
            out[f.name] = v
        if not ARCH.fullmatch(out.get("arch", "sm_90")):
            raise DeviceError(f"{where}: arch = {shown(out['arch'])}: accepted: sm_XY or sm_XYa (e.g. sm_90)")
        return cls(**out)
