"""A tuning configuration: a frozen value validated once, then trusted downstream.

``Config`` carries everything rendering needs. Its flat form (``params``) is what
Optuna sees: one named parameter per knob, e.g. ``gemm1.bm`` or ``policy``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .tiling import (TILE_CHOICES, TILE_DEFAULTS, TILE_FIELDS, TILE_OMITTED_AT_DEFAULT, WARPGROUP_MMAS,  # noqa: F401
                     StageGrid, StageTiles, cdiv, tile_value)
from .workloads import Chain

GLOBAL_FIELDS = ("policy", "order", "dispatch", "launch", "prefetch")
# What a config recorded before a global field existed meant by it.
GLOBAL_DEFAULTS = {"prefetch": "none"}


@dataclass(frozen=True)
class Config:
    """One point of the search space."""

    tiles: tuple[StageTiles, ...]
    policy: str
    order: str
    dispatch: str
    launch: str
    prefetch: str = "none"  # see tuner.prefetch

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
        return cls(tiles, *(str(params.get(f, GLOBAL_DEFAULTS.get(f))) for f in GLOBAL_FIELDS))

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON data; a global field at its default is left out, and so is a tile
        field of :data:`TILE_OMITTED_AT_DEFAULT`, so a config keeps the form (and the storage key)
        it had before the field existed."""
        return {"tiles": [{k: v for k, v in asdict(t).items()
                           if not (k in TILE_OMITTED_AT_DEFAULT and v == TILE_DEFAULTS[k])} for t in self.tiles],
                **{f: getattr(self, f) for f in GLOBAL_FIELDS if GLOBAL_DEFAULTS.get(f) != getattr(self, f)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        names = {f.name for f in fields(StageTiles)}
        tiles = tuple(StageTiles(**{k: tile_value(k, v) for k, v in t.items() if k in names}) for t in d["tiles"])
        return cls(tiles, *(str(d.get(f, GLOBAL_DEFAULTS.get(f))) for f in GLOBAL_FIELDS))

    @property
    def globals(self) -> tuple[str, ...]:
        """The chain-wide choices, in :data:`GLOBAL_FIELDS` order: (policy, order, dispatch, launch, prefetch)."""
        return tuple(getattr(self, f) for f in GLOBAL_FIELDS)

    def grids(self, chain: Chain) -> tuple[StageGrid, ...]:
        return tuple(StageGrid(s, t) for s, t in zip(chain.stages, self.tiles))

    def short(self) -> str:
        """A compact one-line description for tables and logs."""
        t = " | ".join(x.short() for x in self.tiles)
        pre = "" if self.prefetch == "none" else f"+{self.prefetch}"
        return f"{self.policy}/{self.launch}/{self.order}-{self.dispatch}{pre} [{t}]"
