"""A tuning configuration: a frozen value validated once, then trusted downstream.

``Config`` carries everything rendering needs. Its flat form (``params``) is what
Optuna sees: one named parameter per knob, e.g. ``gemm1.bm`` or ``policy``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .workloads import Chain, GemmStage

TILE_FIELDS = ("bm", "bn", "bk", "wm", "wn", "stages", "split_k", "mma", "cm", "cn")
# Tile fields that name a choice rather than count something, with their accepted values.
# "sync": mma.sync warps (any sm_80+); "wgmma": Hopper warpgroup MMAs from swizzled shared memory
# filled by cp.async; "wgmma_tma": the same MMAs, shared memory filled by the Tensor Memory Accelerator.
TILE_CHOICES: dict[str, tuple[str, ...]] = {"mma": ("sync", "wgmma", "wgmma_tma")}
WARPGROUP_MMAS = ("wgmma", "wgmma_tma")
TILE_DEFAULTS: dict[str, Any] = {"split_k": 1, "mma": "sync", "cm": 1, "cn": 1}  # what records made before a field existed mean
GLOBAL_FIELDS = ("policy", "order", "dispatch", "launch")


def tile_value(field: str, value: Any) -> Any:
    """A tile field's value in its own type (choices are names, the rest counts)."""
    if value is None:
        raise KeyError(field)
    return str(value) if field in TILE_CHOICES else int(value)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class StageTiles:
    """Tiling of one GEMM stage: block tile, warp grid, pipeline depth, split-K, MMA instruction
    and thread-block cluster.

    With a warpgroup MMA (``wgmma``, ``wgmma_tma``), ``wm`` x ``wn`` counts warpgroups (four warps
    each, 64 rows apiece). ``cm`` x ``cn`` blocks computing neighbouring tiles form one cluster
    (``wgmma_tma`` only): each A slab is fetched once and multicast to the ``cn`` blocks that read
    it, each B slab to the ``cm`` blocks, which cuts the traffic from L2."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int
    split_k: int = 1
    mma: str = "sync"
    cm: int = 1
    cn: int = 1

    @property
    def cluster(self) -> int:
        """Blocks per cluster."""
        return self.cm * self.cn

    @property
    def warpgroup(self) -> bool:
        """Whether the stage computes with Hopper warpgroup MMAs."""
        return self.mma in WARPGROUP_MMAS

    @property
    def warps(self) -> int:
        """Warps per block; the TMA variant adds one producer warp that only issues copies."""
        return self.wm * self.wn * (4 if self.warpgroup else 1) + (self.mma == "wgmma_tma")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def ring_bytes(self) -> int:
        """The ring of A and B tiles: swizzled unpadded rows for wgmma, rows padded by 16 bytes for mma.sync."""
        row = self.bk * 2 if self.warpgroup else self.bk * 2 + 16
        return self.stages * (self.bm + self.bn) * row

    def smem_bytes(self) -> int:
        """Shared memory of a block: the ring, plus for wgmma 1 KiB of alignment slack and, when the
        TMA fills the ring, two 8-byte mbarriers (full, empty) per slot."""
        if self.warpgroup:
            return self.ring_bytes() + 1024 + (16 * self.stages if self.mma == "wgmma_tma" else 0)
        return self.ring_bytes()


@dataclass(frozen=True)
class StageGrid:
    """How a stage's output is cut into tiles, derived from its size and tiling."""

    stage: GemmStage
    tiles: StageTiles

    @property
    def mt(self) -> int:
        return cdiv(self.stage.m, self.tiles.bm)

    @property
    def nt(self) -> int:
        return cdiv(self.stage.n, self.tiles.bn)

    @property
    def kc(self) -> int:
        """K chunks of the whole reduction."""
        return cdiv(self.stage.k, self.tiles.bk)

    @property
    def ks(self) -> int:
        """K chunks per split."""
        return cdiv(self.kc, self.tiles.split_k)

    @property
    def blocks(self) -> int:
        return self.mt * self.nt * self.tiles.split_k

    def split_chunks(self, s: int) -> range:
        return range(s * self.ks, min((s + 1) * self.ks, self.kc))


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
        t = " | ".join(f"{x.bm}x{x.bn}x{x.bk} {dict(wgmma='g', wgmma_tma='t').get(x.mma, 'w')}{x.wm}x{x.wn} s{x.stages}"
                       + (f" k{x.split_k}" if x.split_k > 1 else "")
                       + (f" c{x.cm}x{x.cn}" if x.cluster > 1 else "") for x in self.tiles)
        return f"{self.policy}/{self.launch}/{self.order}-{self.dispatch} [{t}]"
