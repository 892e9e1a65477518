"""A tuning configuration: a frozen value validated once, then trusted downstream.

``Config`` carries everything rendering needs. Its flat form (``params``) is what
Optuna sees: one named parameter per knob, e.g. ``gemm1.bm`` or ``policy``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .tiling import (TILE_CHOICES, TILE_DEFAULTS, TILE_FIELDS, WARPGROUP_MMAS, StageGrid, StageTiles,  # noqa: F401
                     cdiv, tile_value)
from .workloads import Chain

GLOBAL_FIELDS = ("policy", "order", "dispatch", "launch")


@dataclass(frozen=True)
class Config:
    """One point of the search space."""

    tiles: tuple[StageTiles, ...]
    policy: str
    order: str
    dispatch: str
    launch: str

    def params(self) -> dict[str, Any]:
        """Flat parameter dict, stage knobs prefixed by the stage name (``gemm1.bm``)."""
        out: dict[str, Any] = {}
        for i, t in enumerate(self.tiles):
            for f in TILE_FIELDS:
                out[f"gemm{i + 1}.{f}"] = getattr(t, f)
        for f in GLOBAL_FIELDS:
            out[f] = getattr(self, f)
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, Any], n_stages: int) -> "Config":
        tiles = tuple(StageTiles(**{f: tile_value(f, params.get(f"gemm{i + 1}.{f}", TILE_DEFAULTS.get(f)))
                                    for f in TILE_FIELDS}) for i in range(n_stages))
        return cls(tiles, *(str(params[f]) for f in GLOBAL_FIELDS))

    def to_dict(self) -> dict[str, Any]:
        return {"tiles": [asdict(t) for t in self.tiles], **{f: getattr(self, f) for f in GLOBAL_FIELDS}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        names = {f.name for f in fields(StageTiles)}
        tiles = tuple(StageTiles(**{k: tile_value(k, v) for k, v in t.items() if k in names}) for t in d["tiles"])
        return cls(tiles, *(str(d[f]) for f in GLOBAL_FIELDS))

    @property
    def globals(self) -> tuple[str, str, str, str]:
        """The sync choice: (policy, order, dispatch, launch)."""
        return (self.policy, self.order, self.dispatch, self.launch)

    def grids(self, chain: Chain) -> tuple[StageGrid, ...]:
        return tuple(StageGrid(s, t) for s, t in zip(chain.stages, self.tiles))

    def short(self) -> str:
        """A compact one-line description for tables and logs."""
        t = " | ".join(f"{x.bm}x{x.bn}x{x.bk} {dict(wgmma='g', wgmma_tma='t', wgmma_tma_t='T').get(x.mma, 'w')}{x.wm}x{x.wn} s{x.stages}"
                       + (f" k{x.split_k}" if x.split_k > 1 else "")
                       + (f" c{x.cm}x{x.cn}" if x.cluster > 1 else "") for x in self.tiles)
        return f"{self.policy}/{self.launch}/{self.order}-{self.dispatch} [{t}]"
