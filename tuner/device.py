"""The device a measurement is taken on (or a config is compiled for): what every cache key,
trial record and feasibility question names. Below everything that asks about a device."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
