"""Search spaces: which tilings and sync choices to try, and which of them can run at all.

A search space file (TOML) lists candidate values per knob. Most combinations are
impossible (a warp grid that does not divide the tile, too much shared memory, a
sync policy whose wait formula needs aligned tiles, ...). Those hard constraints
are listed once, in :data:`STAGE_CONSTRAINTS` and :data:`CHAIN_CONSTRAINTS`, and
solved before any sampler sees the space.

The full product is far too large to enumerate (two stages of a few thousand
tilings each, times the sync choices), so :class:`FeasibleSet` works in
structure: it enumerates each stage's feasible tilings, groups them by the few
values the cross-stage constraints read, and counts, ranks and samples exactly
through those groups.
"""
from __future__ import annotations

import bisect
import copy
import hashlib
import itertools
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Container, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import UsageError
from .device import DeviceInfo
from .config import GLOBAL_DEFAULTS, GLOBAL_FIELDS, TILE_CHOICES, TILE_DEFAULTS, TILE_FIELDS, Config, StageGrid, StageTiles
from .expr import Expr
from .tiling import CONSUMER_REGS, TILE_SWITCHES, WG_OVERHEAD_REGS, even_share, may_persist, next_pow2, tail_split
from .prefetch import PREFETCHES, prefetch_allowed
from .stages import kind_of
from .sync import (DISPATCHES, LAUNCHES, ORDERS, POLICIES, cluster_allowed, grid_env, launch_allowed, pair_env,
                   persistent_allowed)
from .tomlfile import did_you_mean, read_toml
from .workloads import Chain

HW_MAX_THREADS = 1024  # threads per block on every CUDA architecture the templates target
HW_MAX_REGS = 255  # registers per thread
HW_MAX_CLUSTER = 8  # blocks per thread-block cluster (the portable size)


class SpaceError(UsageError):
    """A search space file is malformed, or leaves nothing feasible."""


# ---------------------------------------------------------------------------
# The file format


GLOBAL_CHOICES: dict[str, tuple[str, ...]] = {
    "policy": tuple(POLICIES),
    "order": tuple(ORDERS),
    "dispatch": tuple(DISPATCHES),
    "launch": tuple(LAUNCHES),
    "prefetch": PREFETCHES,
}
# What a space file that leaves a key out searches: every value, but a field with a default
# (one added later, opt-in) only that.
DEFAULT_GLOBALS: dict[str, tuple[str, ...]] = {**GLOBAL_CHOICES, **{f: (v,) for f, v in GLOBAL_DEFAULTS.items()}}
TABLES = ("stage", "global", "limits")


@dataclass(frozen=True)
class Limits:
    """Caps on a block beyond the device's own."""

    max_threads: int = HW_MAX_THREADS
    max_tile_regs: int = HW_MAX_REGS
    max_cluster: int = HW_MAX_CLUSTER


LIMIT_KEYS = tuple(Limits.__dataclass_fields__)


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values for every knob; ``overrides`` replaces some of them for named stages."""

    stage: Mapping[str, tuple[Any, ...]]
    overrides: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    globals: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_GLOBALS))
    limits: Limits = Limits()
    source: str = "<search space>"

    def stage_domain(self, stage_name: str) -> dict[str, tuple[Any, ...]]:
        """Candidate values of each tile field for one stage."""
        return {**self.stage, **self.overrides.get(stage_name, {})}

    def feasible(self, chain: Chain, device: DeviceInfo) -> "FeasibleSet":
        """Every config of this space that can run on ``device`` for ``chain``."""
        names = [s.name for s in chain.stages]
        for name in self.overrides:
            if name not in names:
                raise SpaceError(f"{self.source}: [stage.{name}] names no stage of {chain.workload}"
                                 f"{did_you_mean(name, names)}; stages: {', '.join(names)}")
        return FeasibleSet(chain, device, self)



def _int_list(value: Any, where: str, source: str) -> tuple[int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: a positive integer or a non-empty list of them")
    if len(set(items)) != len(items):
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: a list without repeated values")
    return tuple(items)


def _choice_list(value: Any, where: str, accepted: Sequence[str], source: str) -> tuple[str, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in items if v not in accepted]
    if not items or bad or len(set(items)) != len(items):
        what = f"{bad[0]!r} is not one of them" if bad else "a non-empty list without repeated values"
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: {', '.join(accepted)} ({what})")
    return tuple(items)


def _switch_list(value: Any, where: str, key: str, source: str) -> tuple[int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    values = TILE_SWITCHES[key]
    if not items or any(v not in values or isinstance(v, bool) for v in items) or len(set(items)) != len(items):
        accepted = ", ".join(f"{v} ({what})" for v, what in values.items())
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: {accepted}, or a list of them without repeats")
    return tuple(items)


def _tile_list(value: Any, where: str, key: str, source: str) -> tuple[Any, ...]:
    if key in TILE_CHOICES:
        return _choice_list(value, where, TILE_CHOICES[key], source)
    if key in TILE_SWITCHES:
        return _switch_list(value, where, key, source)
    return _int_list(value, where, source)


def _unknown(key: str, where: str, valid: Sequence[str], source: str) -> SpaceError:
    return SpaceError(f"{source}: unknown key {where}{did_you_mean(key, valid)}; accepted: {', '.join(valid)}")


def parse_space(data: Mapping[str, Any], source: str = "<search space>") -> SearchSpace:
    """Validate a search space given as a mapping (the parsed TOML); ``source`` names it in errors."""
    for key in data:
        if key not in TABLES:
            raise _unknown(key, repr(key), TABLES, source)
        if not isinstance(data[key], dict):
            raise SpaceError(f"{source}: {key} must be a table ([{key}])")
    raw_stage = data.get("stage")
    if raw_stage is None:
        raise SpaceError(f"{source}: missing table [stage]; it lists {', '.join(TILE_FIELDS)}")
    stage: dict[str, tuple[Any, ...]] = {}
    overrides: dict[str, dict[str, tuple[Any, ...]]] = {}
    for key, value in raw_stage.items():
        if isinstance(value, dict):
            sub = {}
            for k, v in value.items():
                if k not in TILE_FIELDS:
                    raise _unknown(k, f"stage.{key}.{k}", TILE_FIELDS, source)
                sub[k] = _tile_list(v, f"stage.{key}.{k}", k, source)
            overrides[key] = sub
        elif key in TILE_FIELDS:
            stage[key] = _tile_list(value, f"stage.{key}", key, source)
        else:
            raise _unknown(key, f"stage.{key}", TILE_FIELDS, source)
    for key, value in TILE_DEFAULTS.items():
        stage.setdefault(key, (value,))
    missing = [f for f in TILE_FIELDS if f not in stage]
    if missing:
        defaults = ", ".join(f"{k} to {v}" for k, v in TILE_DEFAULTS.items())
        raise SpaceError(f"{source}: [stage] lacks {', '.join(missing)}; it must list every one of "
                         f"{', '.join(TILE_FIELDS)} ({defaults} by default)")
    globals_ = dict(DEFAULT_GLOBALS)
    for key, value in data.get("global", {}).items():
        if key not in GLOBAL_CHOICES:
            raise _unknown(key, f"global.{key}", tuple(GLOBAL_CHOICES), source)
        globals_[key] = _choice_list(value, f"global.{key}", GLOBAL_CHOICES[key], source)
    limits = {}
    for key, value in data.get("limits", {}).items():
        if key not in LIMIT_KEYS:
            raise _unknown(key, f"limits.{key}", LIMIT_KEYS, source)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpaceError(f"{source}: limits.{key} = {value!r}: accepted: a positive integer")
        limits[key] = value
    return SearchSpace(stage, overrides, globals_, Limits(**limits), source)


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search space TOML file."""
    path = Path(path)
    data = read_toml(path, "search space", SpaceError)
    return parse_space(data, str(path))


# ---------------------------------------------------------------------------
# Hard constraints. Each takes what it needs and returns why the choice is
# impossible, or None. A config is feasible when every one returns None.


WGMMA_ARCHS = ("sm_90", "sm_90a")  # warpgroup MMAs exist on Hopper only


def warp_tile(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """mma.sync: each warp computes whole 16x16 fragments. wgmma: each warpgroup computes 64 rows
    and a multiple of 8 columns up to 256, over whole 64-wide swizzle atoms of K, with a ring of
    at least three slots (one stays under the MMAs in flight). Transposed (``wgmma_tma_t``): each
    warpgroup computes 64 columns and all BM rows, a multiple of 8 up to 256, and the epilogue
    parks the fp32 tile in the ring."""
    t = g.tiles
    if t.warpgroup:
        if dev.arch not in WGMMA_ARCHS:
            return f"wgmma needs a Hopper GPU ({' or '.join(WGMMA_ARCHS)}), not {dev.arch}"
        if t.transposed:
            if t.wm != 1 or t.bn != 64 * t.wn:
                return f"a transposed {t.bm}x{t.bn} tile is not 64 columns per warpgroup for 1x{t.wn} warpgroups"
            if t.bm % 8 or t.bm > 256:
                return f"BM={t.bm} of a transposed tile is not a multiple of 8 up to 256 rows"
            if not t.persistent and t.transposed_out_bytes() > t.ring_bytes():
                return f"the fp32 {t.bm}x{t.bn} tile does not fit in the {t.ring_bytes()}-byte ring for its epilogue"
        else:
            wgn = t.bn // t.wn
            if t.bm != 64 * t.wm:
                return f"BM={t.bm} is not 64 rows per warpgroup for {t.wm} warpgroups along M"
            if t.bn % t.wn or wgn % 8 or wgn > 256:
                return f"BN={t.bn} over {t.wn} warpgroups is not a multiple of 8 up to 256 columns each"
        if t.bk % 64:
            return f"BK={t.bk} is not a whole number of 64-wide swizzle atoms"
        if t.stages < 3:
            return f"a wgmma ring needs at least 3 stages, got {t.stages}"
        return None
    if kind_of(g.stage).OWN_WARP_TILE:
        return None  # the kind's own constraint (stage_kind) judges its warps' tile
    if t.bm % (16 * t.wm) or t.bn % (16 * t.wn):
        return f"a {t.bm}x{t.bn} tile does not split into {t.wm}x{t.wn} warps of 16x16 multiples"
    return None


def threads(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    cap = min(lim.max_threads, HW_MAX_THREADS)
    if g.tiles.threads > cap:
        return f"{g.tiles.threads} threads per block exceed {cap}"
    return None


def accumulators(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """The warp tile lives in registers: (bm/wm)*(bn/wn) fp32 accumulators per warp over 32 lanes,
    plus, for mma.sync, one k-step's A and B fragments (4 registers per 16 rows, 2 per 8 columns;
    wgmma reads both operands from shared memory). Past the cap the compiler spills (the CI
    compile test holds this bound to the compiler's report)."""
    t = g.tiles
    if t.warpgroup:
        regs = t.acc_regs
        budget = CONSUMER_REGS if t.realloc else even_share(t.threads)
        if regs + WG_OVERHEAD_REGS > budget:
            return (f"{regs} accumulator registers plus {WG_OVERHEAD_REGS} others exceed the {budget} per thread "
                    f"that {t.threads} threads leave")
    elif kind_of(g.stage).OWN_WARP_TILE:
        return None  # judged by the kind (stage_kind)
    else:
        wtm, wtn = t.bm // t.wm, t.bn // t.wn
        regs = wtm * wtn // 32 + (wtm // 16) * 4 + (wtn // 8) * 2
    cap = min(lim.max_tile_regs, HW_MAX_REGS)
    if regs > cap:
        return f"{regs} registers per thread for the warp tile exceed {cap}"
    return None


def shared_memory(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    need = kind_of(g.stage).smem_bytes(g)
    if need > dev.smem_per_block:
        return f"{need} bytes of shared memory exceed the device's {dev.smem_per_block} per block"
    return None


def tile_height(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """A tile taller than M rounded up to a power of two (to 8 rows for a transposed tile) only
    computes padding (wgmma's least is 64 rows, transposed 8)."""
    t, m = g.tiles, g.stage.m
    cap = max(8, -(-m // 8) * 8) if t.transposed else max(64 if t.warpgroup else 16, next_pow2(m))
    if g.tiles.bm > cap:
        return f"BM={g.tiles.bm} is taller than needed for M={g.stage.m} (at most {cap})"
    return None


def tile_width(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    cap = max(64, next_pow2(g.stage.n))
    if g.tiles.bn > cap:
        return f"BN={g.tiles.bn} is wider than needed for N={g.stage.n} (at most {cap})"
    return None


def split_k(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """Every split must own at least one K chunk."""
    s = g.tiles.split_k
    if s > g.kc:
        return f"split_k={s} leaves a split without K chunks ({g.kc} chunks of BK={g.tiles.bk})"
    return None


def cluster(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """Clusters multicast TMA copies (Hopper, ``wgmma_tma``, ``wgmma_tma_t``); their blocks compute a
    whole cluster tile, so the tile grid must divide into cluster tiles."""
    t = g.tiles
    if t.cluster == 1:
        return None
    if not t.tma:
        return f"a {t.cm}x{t.cn} cluster multicasts TMA copies; mma={t.mma} has none"
    cap = min(lim.max_cluster, HW_MAX_CLUSTER)
    if t.cluster > cap:
        return f"a {t.cm}x{t.cn} cluster exceeds {cap} blocks"
    if g.mt % t.cm or g.nt % t.cn:
        return f"the {g.mt}x{g.nt} tile grid does not divide into {t.cm}x{t.cn} clusters"
    return None


def persistence(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """Persistent blocks (``persist`` = 1, or 2 with the partial last wave split along K) loop over
    the tiles of a TMA-fed stage, one split each, and only where there are more tiles than blocks
    resident at once: with fewer, each block runs one tile, as without. Splitting the last wave,
    which cuts tiles between blocks, needs blocks of their own (no cluster) and a last wave that
    the split ends sooner than whole tiles (:func:`tuner.tiling.tail_split`)."""
    t = g.tiles
    if t.persist not in TILE_SWITCHES["persist"]:
        return f"persist={t.persist} is not one of {', '.join(map(str, TILE_SWITCHES['persist']))}"
    if not t.persistent:
        return None
    if not may_persist(t.mma, t.split_k):
        if not t.tma:
            return f"persistent blocks carry a TMA ring from tile to tile; mma={t.mma} has none"
        return f"persistent blocks compute whole tiles, not split_k={t.split_k} partial ones"
    resident = t.resident_blocks(dev.sms)
    if g.blocks <= resident:
        return f"{g.blocks} tiles run one per block on the device's {dev.sms} SMs without persistence"
    if t.tail_split and t.cluster > 1:
        return f"splitting the last wave cuts tiles between blocks; a {t.cm}x{t.cn} cluster computes its tiles together"
    if t.tail_split and not tail_split(g.blocks, g.kc, resident)[0]:
        return (f"{g.blocks} tiles of {g.kc} K chunks on {resident} blocks: splitting the last wave "
                f"({g.blocks % resident} tiles) would not end it sooner")
    return None


def stage_kind(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """What the stage's own kind asks of a tiling (a convolution's chunk holds one tap...)."""
    return kind_of(g.stage).tiling_problem(g)


StageConstraint = Callable[[StageGrid, Limits, DeviceInfo], "str | None"]

# The tile fields that fix a block's shape: its tile, warps, ring and MMA, and whether it persists.
BLOCK_FIELDS = ("mma", "bm", "bn", "bk", "wm", "wn", "stages", "persist")

# Per stage, judged on one stage's grid alone; these first ones read only the block's shape
# (BLOCK_FIELDS, with the stage and the device), so the feasible set judges them once per shape
# rather than once per split and cluster of it (they reject most of a space).
BLOCK_CONSTRAINTS: tuple[tuple[str, StageConstraint], ...] = (
    ("warp_tile", warp_tile),
    ("threads", threads),
    ("accumulators", accumulators),
    ("shared_memory", shared_memory),
    ("tile_height", tile_height),
    ("tile_width", tile_width),
)
STAGE_CONSTRAINTS: tuple[tuple[str, StageConstraint], ...] = BLOCK_CONSTRAINTS + (
    ("split_k", split_k),
    ("cluster", cluster),
    ("persistence", persistence),
    ("stage_kind", stage_kind),
)


def stage_problem(g: StageGrid, lim: Limits, dev: DeviceInfo,
                  constraints: Sequence[tuple[str, StageConstraint]] = STAGE_CONSTRAINTS) -> tuple[str, str] | None:
    """The first per-stage constraint ``g`` breaks, with why, or None (of ``constraints``, by
    default all of them)."""
    for name, fn in constraints:
        why = fn(g, lim, dev)
        if why is not None:
            return name, why
    return None


def launch_mode(policy: str, order: str, dispatch: str, launch: str) -> str | None:
    """Which policy/launch/dispatch combinations exist at all (see :func:`tuner.sync.launch_allowed`)."""
    return launch_allowed(policy, launch, dispatch)


def prefetch_fits(prefetch: str, chain: Chain, dev: DeviceInfo) -> str | None:
    """The later stages' inputs fit the share of L2 a prefetch may fill (see :mod:`tuner.prefetch`)."""
    return prefetch_allowed(prefetch, chain, dev)


def combo_problem(combo: Sequence[str], chain: Chain, dev: DeviceInfo) -> tuple[str, str] | None:
    """The constraint a global combination breaks on its own, with why, or None."""
    policy, order, dispatch, launch, prefetch = combo
    why = launch_mode(policy, order, dispatch, launch)
    if why is not None:
        return "launch_mode", why
    why = prefetch_fits(prefetch, chain, dev)
    return ("prefetch_fits", why) if why is not None else None


def cluster_launch(dispatch: str, launch: str, grids: Sequence[StageGrid]) -> str | None:
    """Clustered stages need their blocks in hardware order (see :func:`tuner.sync.cluster_allowed`)."""
    clustered = [g.stage.name for g in grids if g.tiles.cluster > 1]
    why = cluster_allowed(dispatch, launch) if clustered else None
    return f"{', '.join(clustered)}: {why}" if why else None


def persistent_launch(policy: str, dispatch: str, launch: str, grids: Sequence[StageGrid]) -> str | None:
    """Persistent stages need block dispatch outside a fused launch, and a split last wave the
    stream policy (see :func:`tuner.sync.persistent_allowed`)."""
    for split in (False, True):
        named = [g.stage.name for g in grids if g.tiles.persistent and (g.tiles.tail_split or not split)]
        why = persistent_allowed(dispatch, launch, tail_split=split, policy=policy) if named else None
        if why:
            return f"{', '.join(named)}: {why}"
    return None


def policy_requires(policy: str, producer: StageGrid, consumer: StageGrid) -> str | None:
    """The sync policy's own condition on a producer/consumer pair of tilings."""
    pol = POLICIES[policy]
    if pol is None:
        return None
    env = pair_env(producer, consumer)  # the condition reads tilings and kind constants, no index map
    if pol.requires(env):
        return None
    return (f"the {policy} policy needs {pol.requires_doc or pol.requires.text} "
            f"({producer.stage.name} BN={env['BN1']} stored columns, {consumer.stage.name} BK={env['BK2']})")


def fused_threads(launch: str, grids: Sequence[StageGrid]) -> str | None:
    """One launch has one block size, so every stage of a fused launch uses the same thread count;
    and one register count at entry, so no stage of it reallocates registers between warpgroups."""
    if launch != "fused":
        return None
    counts = [g.tiles.threads for g in grids]
    if len(set(counts)) > 1:
        return "a fused launch needs one thread count for all stages, got " + \
               ", ".join(f"{g.stage.name} {n}" for g, n in zip(grids, counts))
    shifting = [g.stage.name for g in grids if g.tiles.realloc]
    if shifting:
        return f"{', '.join(shifting)}: a tile that reallocates registers (setmaxnreg) runs in a kernel of its own"
    return None


# Across the chain: the first two read the global choices (and the chain and device), the others the tilings too.
CHAIN_CONSTRAINTS = ("launch_mode", "prefetch_fits", "policy_requires", "fused_threads", "cluster_launch",
                     "persistent_launch")


def chain_problem(config: Config, chain: Chain, dev: DeviceInfo,
                  grids: Sequence[StageGrid] | None = None) -> tuple[str, str] | None:
    """The constraint across the chain (:data:`CHAIN_CONSTRAINTS`) that ``config`` breaks, with why,
    or None: its global combination's (:func:`combo_problem`), then its tilings' together. Each
    stage's own constraints are :func:`stage_problem`'s. ``grids``: the config's, if at hand."""
    problem = combo_problem(config.globals, chain, dev)
    if problem is not None:
        return problem
    grids = config.grids(chain) if grids is None else grids
    for g in grids:
        if g.stage.a_from is not None:
            why = policy_requires(config.policy, grids[g.stage.a_from], g)
            if why is not None:
                return "policy_requires", why
    why = fused_threads(config.launch, grids)
    if why is not None:
        return "fused_threads", why
    why = cluster_launch(config.dispatch, config.launch, grids)
    if why is not None:
        return "cluster_launch", why
    why = persistent_launch(config.policy, config.dispatch, config.launch, grids)
    return ("persistent_launch", why) if why is not None else None


# ---------------------------------------------------------------------------
# The feasible set


@dataclass
class _Group:
    """Stage tilings that look alike to every cross-stage constraint."""

    tiles: list[StageTiles]
    key_in: tuple[int, ...]  # values read as the consumer of the previous stage
    key_out: tuple[int, ...]  # values read as the producer of the next stage
    threads: int | None  # only when a fused launch compares thread counts

    @property
    def state(self) -> tuple[tuple[int, ...], int | None]:
        return self.key_out, self.threads


class _Plan:
    """Exact counting and ranking of the stage tilings for one (policy, fused?) pair.

    ``ways[j][state]`` is the number of ways to complete stages j+1.. given stage
    j's state; ranks are then mixed-radix numbers over (group, tile in group). ``envs(g)``: a
    grid's values as producer and as consumer (:func:`tuner.sync.grid_env`'s).
    """

    def __init__(self, chain: Chain, tilings: Sequence[Sequence[StageGrid]], requires: Expr | None, fused: bool,
                 envs: Callable[[StageGrid], tuple[Mapping[str, Any], Mapping[str, Any]]]):
        self.chain = chain
        self.requires = requires
        self.fused = fused
        names = sorted(requires.names) if requires is not None else []
        self.out_names = [n for n in names if n.endswith("1")]
        self.in_names = [n for n in names if n.endswith("2")]
        self.groups: list[list[_Group]] = []
        for grids in tilings:
            by_sig: dict[tuple, _Group] = {}
            for g in grids:
                out_env, in_env = envs(g)
                key_in = tuple(in_env[n] for n in self.in_names)
                key_out = tuple(out_env[n] for n in self.out_names)
                thr = g.tiles.threads if fused else None
                grp = by_sig.setdefault((key_in, key_out, thr), _Group([], key_in, key_out, thr))
                grp.tiles.append(g.tiles)
            self.groups.append(sorted(by_sig.values(), key=lambda x: (x.key_in, x.key_out, x.threads or 0)))
        self._cands: dict[tuple[int, Any], list[_Group]] = {}
        n = len(tilings)
        self.ways: list[dict[Any, int]] = [dict() for _ in range(n)]
        for grp in self.groups[n - 1]:
            self.ways[n - 1][grp.state] = 1
        for j in range(n - 2, -1, -1):
            for grp in self.groups[j]:
                s = grp.state
                if s not in self.ways[j]:
                    self.ways[j][s] = sum(len(c.tiles) * self.ways[j + 1][c.state] for c in self.candidates(j + 1, s))
        self.total = sum(len(c.tiles) * self.ways[0][c.state] for c in self.candidates(0, None))

    def _compatible(self, j: int, prev: Any, grp: _Group) -> bool:
        key_out, thr = prev
        if self.fused and thr != grp.threads:
            return False
        if self.requires is not None and self.chain.stages[j].a_from == j - 1:
            env = {**dict(zip(self.out_names, key_out)), **dict(zip(self.in_names, grp.key_in))}
            return bool(self.requires(env))
        return True

    def candidates(self, j: int, prev: Any) -> list[_Group]:
        """Groups of stage j that may follow a stage j-1 in state ``prev`` (None for the first stage)."""
        key = (j, prev)
        if key not in self._cands:
            self._cands[key] = [g for g in self.groups[j] if prev is None or self._compatible(j, prev, g)]
        return self._cands[key]

    def unrank(self, i: int) -> tuple[StageTiles, ...]:
        out: list[StageTiles] = []
        prev = None
        for j in range(len(self.groups)):
            for grp in self.candidates(j, prev):
                rest = self.ways[j][grp.state]
                weight = len(grp.tiles) * rest
                if i < weight:
                    out.append(grp.tiles[i // rest])
                    i %= rest
                    prev = grp.state
                    break
                i -= weight
            else:  # pragma: no cover - ranks are always below total
                raise IndexError("rank out of range")
        return tuple(out)


def _feistel(n: int, seed: int) -> Callable[[int], int]:
    """A seeded bijection of range(n), computed lazily (a small Feistel network with cycle walking)."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    keys = [hashlib.blake2b(f"tuner-grid:{seed}:{r}".encode(), digest_size=8).digest() for r in range(4)]

    def rnd(r: int, x: int) -> int:
        h = hashlib.blake2b(x.to_bytes(8, "little"), key=keys[r], digest_size=8).digest()
        return int.from_bytes(h, "little") & mask

    def enc(x: int) -> int:
        left, right = x >> half, x & mask
        for r in range(4):
            left, right = right, left ^ rnd(r, right)
        return (left << half) | right

    def perm(i: int) -> int:
        x = enc(i)
        while x >= n:  # stays inside range(n) because enc permutes the larger power-of-two range
            x = enc(x)
        return x

    return perm


# nearest() weighs this many of the closest global combinations, and of the closest tilings per stage.
_NEAR_COMBOS = 4
_NEAR_TILINGS = 8


def baseline_key(g: StageGrid, sms: int) -> tuple:
    """Ranks tilings for a stream baseline: fill up to two waves of SMs with as many blocks as possible."""
    t = g.tiles
    fits = g.blocks <= 2 * sms
    return (not fits, -g.blocks if fits else g.blocks, t.split_k, abs(t.warps - 4), -t.bk, abs(t.stages - 3),
            t.bm, t.bn, t.wm, t.wn, t.cluster)


class FeasibleSet:
    """The configs of a search space that satisfy every hard constraint for one chain and device.

    Optionally narrowed to an explicit list (what a replay backend has recordings for).
    """

    def __init__(self, chain: Chain, device: DeviceInfo, space: SearchSpace):
        for j, st in enumerate(chain.stages):
            # The solver chains pair constraints stage to stage, so a consumer must read its direct predecessor.
            if st.a_from not in (None, j - 1):
                raise NotImplementedError(f"stage {st.name} reads stage {st.a_from}, not the one just before it")
        self.chain = chain
        self.device = device
        self.space = space
        self.stage_names = [s.name for s in chain.stages]
        self.domains_space: list[dict[str, tuple[int, ...]]] = [space.stage_domain(n) for n in self.stage_names]
        self._rejections: list[dict[str, int]] = []
        self.tilings: list[list[StageGrid]] = []
        for stage, dom in zip(chain.stages, self.domains_space):
            ok, rejected = self._stage_tilings(stage, dom)
            self.tilings.append(ok)
            self._rejections.append(rejected)
        self.combos: list[tuple[str, ...]] = [
            combo for combo in itertools.product(*(space.globals[f] for f in GLOBAL_FIELDS))
            if combo_problem(combo, chain, device) is None]
        self._plans: dict[tuple[str, bool, bool, bool], _Plan] = {}
        self._env_cache: dict[int, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
        counts = [self._plan(c).total for c in self.combos]
        self._combo_counts = counts
        self._prefix = list(itertools.accumulate(counts))
        self._explicit: list[Config] | None = None  # set by restricted_to
        self._explicit_from = 0

    # -- construction helpers

    def _stage_reason(self, g: StageGrid) -> tuple[str, str] | None:
        return stage_problem(g, self.space.limits, self.device)

    def _stage_tilings(self, stage: Any, dom: Mapping[str, Sequence[Any]]) -> tuple[list[StageGrid], dict[str, int]]:
        """The tilings of ``dom`` that every per-stage constraint accepts, in the order of the
        product of TILE_FIELDS' values, and how many each constraint rejected first.

        The block constraints are judged once per block shape: where one rejects it, every split
        and cluster of it counts as rejected by that one (reading none of those fields, it would
        have been the first to reject each). A persistent tile that may not persist (not TMA-fed,
        or split along K) is rejected as such before the rest are asked."""
        lim, dev = self.space.limits, self.device
        rest = tuple(f for f in TILE_FIELDS if f not in BLOCK_FIELDS)
        per_shape = int(np.prod([len(dom[f]) for f in rest]))
        later = STAGE_CONSTRAINTS[len(BLOCK_CONSTRAINTS):]
        ok: list[StageGrid] = []
        rejected: dict[str, int] = {}
        for shape in itertools.product(*(dom[f] for f in BLOCK_FIELDS)):
            base = dict(zip(BLOCK_FIELDS, shape))
            why = stage_problem(StageGrid(stage, StageTiles(**base)), lim, dev, BLOCK_CONSTRAINTS)
            if why is not None:
                rejected[why[0]] = rejected.get(why[0], 0) + per_shape
                continue
            for values in itertools.product(*(dom[f] for f in rest)):
                tiles = StageTiles(**base, **dict(zip(rest, values)))
                if tiles.persist and not may_persist(tiles.mma, tiles.split_k):
                    why = ("persistence", "")
                else:
                    g = StageGrid(stage, tiles)
                    why = stage_problem(g, lim, dev, later)
                if why is None:
                    ok.append(g)
                else:
                    rejected[why[0]] = rejected.get(why[0], 0) + 1
        position = {f: {v: i for i, v in enumerate(dom[f])} for f in TILE_FIELDS}
        ok.sort(key=lambda g: tuple(position[f][getattr(g.tiles, f)] for f in TILE_FIELDS))
        return ok, rejected

    def _envs(self, g: StageGrid) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """``g``'s values as a producer and as a consumer (grid_env), computed once for all plans."""
        key = id(g)  # the grids live in self.tilings as long as the set
        if key not in self._env_cache:
            self._env_cache[key] = (grid_env(g, "1"), grid_env(g, "2"))
        return self._env_cache[key]

    def _plan(self, combo: tuple[str, ...]) -> _Plan:
        policy, _order, dispatch, launch, _prefetch = combo
        clusters = cluster_allowed(dispatch, launch) is None
        persistent = persistent_allowed(dispatch, launch) is None
        tail = persistent_allowed(dispatch, launch, tail_split=True, policy=policy) is None
        fused = launch == "fused"
        key = (policy, fused, clusters, persistent, tail)
        if key not in self._plans:
            pol = POLICIES[policy]
            # A fused launch takes no tile that reallocates registers (see fused_threads).
            tilings = [[g for g in gs if (clusters or g.tiles.cluster == 1) and (persistent or not g.tiles.persistent)
                        and (tail or not g.tiles.tail_split) and not (fused and g.tiles.realloc)]
                       for gs in self.tilings]
            self._plans[key] = _Plan(self.chain, tilings, pol.requires if pol else None, key[1], self._envs)
        return self._plans[key]

    # -- public interface

    def accepts_tiling(self, j: int, tiles: StageTiles) -> bool:
        """Whether stage ``j`` may use ``tiles`` (every per-stage constraint holds; the domain is not asked)."""
        return self._stage_reason(StageGrid(self.chain.stages[j], tiles)) is None

    @property
    def explicit(self) -> bool:
        """True when narrowed to a list of configs."""
        return self._explicit is not None

    @property
    def size(self) -> int:
        """Exact number of feasible configs."""
        if self._explicit is not None:
            return len(self._explicit)
        return self._prefix[-1] if self._prefix else 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Config) and self.contains(config) is None

    def __iter__(self) -> Iterator[Config]:
        return self.grid(0)

    @cached_property
    def reasons(self) -> list[str]:
        """When the set is empty: which constraints emptied it (empty list otherwise)."""
        if self.size:
            return []
        out = []
        for name, tilings, rej in zip(self.stage_names, self.tilings, self._rejections):
            if not tilings:
                detail = ", ".join(f"{k} rejected {v}" for k, v in sorted(rej.items(), key=lambda kv: -kv[1]))
                out.append(f"stage {name} has no feasible tiling ({detail})")
        if not self.combos:
            out.append("no policy/order/dispatch/launch/prefetch combination is allowed (launch_mode: the stream "
                       "policy runs only in the serial and pdl launches, the others in two_stream or fused, and fused "
                       "needs ticket dispatch; prefetch_fits: an L2 prefetch needs Hopper and inputs that fit L2)")
        if not out and self._explicit is None:
            out.append("every combination of stage tilings breaks a cross-stage constraint "
                       "(policy_requires, fused_threads, cluster_launch or persistent_launch)")
        if not out and self._explicit is not None:
            out.append(f"none of the {self._explicit_from} recorded configs is inside the search space")
        return out

    def contains(self, config: Config) -> str | None:
        """Why ``config`` is not in the set (naming the constraint), or None when it is."""
        why = self._structural_reason(config)
        if why is None and self._explicit is not None and config not in self._explicit_set:
            why = "recorded: no recorded measurement of this config for " + self.chain.label
        return why

    @cached_property
    def _explicit_set(self) -> frozenset[Config]:
        return frozenset(self._explicit or ())

    def _structural_reason(self, config: Config) -> str | None:
        if len(config.tiles) != len(self.stage_names):
            return f"stages: {self.chain.workload} has {len(self.stage_names)} stages, the config {len(config.tiles)}"
        for i, (name, t, dom) in enumerate(zip(self.stage_names, config.tiles, self.domains_space)):
            for f in TILE_FIELDS:
                if getattr(t, f) not in dom[f]:
                    return (f"domain: gemm{i + 1}.{f}={getattr(t, f)} is outside the search space "
                            f"(accepted: {', '.join(map(str, dom[f]))})")
        for f in GLOBAL_FIELDS:
            if getattr(config, f) not in self.space.globals[f]:
                return (f"domain: {f}={getattr(config, f)} is outside the search space "
                        f"(accepted: {', '.join(self.space.globals[f])})")
        grids = config.grids(self.chain)
        for g in grids:
            why = self._stage_reason(g)
            if why is not None:
                return f"{why[0]}: {g.stage.name}: {why[1]}"
        problem = chain_problem(config, self.chain, self.device, grids)
        return f"{problem[0]}: {problem[1]}" if problem is not None else None

    def unrank(self, i: int) -> Config:
        """The i-th feasible config in canonical order, 0 <= i < size."""
        if not 0 <= i < self.size:
            raise IndexError(f"rank {i} outside 0..{self.size - 1}")
        if self._explicit is not None:
            return self._explicit[i]
        c = bisect.bisect_right(self._prefix, i)
        combo = self.combos[c]
        local = i - (self._prefix[c - 1] if c else 0)
        return Config(self._plan(combo).unrank(local), *combo)

    def sample(self, rng: np.random.Generator, combo: tuple[str, ...] | None = None) -> Config:
        """One config drawn uniformly from the set, or from its configs of one sync ``combo``."""
        if combo is None:
            if not self.size:
                raise ValueError("cannot sample from an empty feasible set")
            return self.unrank(int(rng.integers(self.size)))
        if self._explicit is not None:
            mine = [c for c in self._explicit if c.globals == combo]
            if not mine:
                raise ValueError(f"no feasible config with sync choice {combo}")
            return mine[int(rng.integers(len(mine)))]
        c = self.combos.index(combo)
        if not self._combo_counts[c]:
            raise ValueError(f"no feasible config with sync choice {combo}")
        return Config(self._plan(combo).unrank(int(rng.integers(self._combo_counts[c]))), *combo)

    def grid(self, seed: int = 0) -> Iterator[Config]:
        """Every feasible config exactly once, in a shuffled order fixed by ``seed``; lazy."""
        n = self.size
        if n == 0:
            return
        perm = _feistel(n, seed)
        for k in range(n):
            yield self.unrank(perm(k))

    def nearest(self, config: Config, exclude: Container[Config] = (),
                accept: Callable[[Config], bool] | None = None) -> Config | None:
        """A feasible config differing from ``config`` in as few parameters as possible.

        Configs in ``exclude`` and those ``accept`` refuses are passed over. Ties go to the
        canonical order, so the answer is deterministic. On a structured set the search
        weighs the closest few global combinations and stage tilings only, and may return
        None although a farther config is left; callers then draw one at random.
        """
        target = config.params()

        def distance(c: Config) -> int:
            return sum(target.get(k) != v for k, v in c.params().items())

        def usable(c: Config) -> bool:
            return c not in exclude and (accept is None or accept(c))

        if self._explicit is not None:
            ranked = sorted((distance(c), i) for i, c in enumerate(self._explicit) if c not in exclude)
            return next((self._explicit[i] for _, i in ranked if usable(self._explicit[i])), None)
        wanted = tuple(getattr(config, f) for f in GLOBAL_FIELDS)
        combos = sorted((c for c, n in zip(self.combos, self._combo_counts) if n),
                        key=lambda c: sum(a != b for a, b in zip(c, wanted)))[:_NEAR_COMBOS]
        per_stage = []
        for j, grids in enumerate(self.tilings):
            t = config.tiles[j] if j < len(config.tiles) else None
            per_stage.append(sorted(grids, key=lambda g: 0 if t is None else
                                    sum(getattr(g.tiles, f) != getattr(t, f) for f in TILE_FIELDS))[:_NEAR_TILINGS])
        candidates = [Config(tuple(g.tiles for g in tiles), *combo)
                      for combo in combos for tiles in itertools.product(*per_stage)]
        for _, i in sorted((distance(c), i) for i, c in enumerate(candidates)):
            if self.contains(candidates[i]) is None and usable(candidates[i]):
                return candidates[i]
        return None

    def baselines(self, limit: int = 3) -> list[Config]:
        """Stream-policy configs to measure first: serial kernels with tilings that fill the GPU.

        Per stage, the tilings are ranked by :func:`baseline_key`; baseline k pairs
        each stage's k-th best. Deterministic; empty when the space has no stream policy.
        """
        sms = self.device.sms
        if self._explicit is not None:
            streams = [c for c in self._explicit if c.policy == "stream"]
            streams.sort(key=lambda c: tuple(baseline_key(g, sms) for g in c.grids(self.chain))
                         + ((c.order, c.dispatch) != ("row", "block"), c.order, c.dispatch))
            return streams[:limit]
        combo = self._stream_combo()
        if combo is None:
            return []
        ranked = [sorted(grids, key=lambda g: baseline_key(g, sms)) for grids in self.tilings]
        out: list[Config] = []
        for k in range(limit):
            cfg = Config(tuple(r[min(k, len(r) - 1)].tiles for r in ranked), *combo)
            if cfg not in out:
                out.append(cfg)
        return out

    def _stream_combo(self) -> tuple[str, ...] | None:
        """The plainest stream combination: serial kernels, row order, block dispatch, no prefetch."""
        streams = [c for c in self.combos if c[0] == "stream"]
        if not streams or not all(self.tilings):
            return None
        return min(streams, key=lambda c: (c[3] != "serial", c[4] != "none", (c[1], c[2]) != ("row", "block"), c))

    def domains(self) -> dict[str, list]:
        """Per Optuna parameter, the values some feasible config uses, in the space's order.

        A superset is fine (a sampler may still propose infeasible combinations), but
        every feasible value is present, and the result depends only on the space,
        chain, device (and the explicit list), so it is stable across resumed runs.
        """
        out: dict[str, list] = {}
        if self._explicit is not None:
            used: dict[str, set] = {}
            for c in self._explicit:
                for k, v in c.params().items():
                    used.setdefault(k, set()).add(v)
            order = self.param_order()
            return {k: [v for v in order[k] if v in used.get(k, ())] for k in order}
        live = [c for c, n in zip(self.combos, self._combo_counts) if n]
        for i, grids in enumerate(self.tilings):
            for f in TILE_FIELDS:
                present = {getattr(g.tiles, f) for g in grids}
                out[f"gemm{i + 1}.{f}"] = [v for v in self.domains_space[i][f] if v in present]
        for k, f in enumerate(GLOBAL_FIELDS):
            present = {c[k] for c in live}
            out[f] = [v for v in self.space.globals[f] if v in present]
        return out

    def param_order(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for i, dom in enumerate(self.domains_space):
            for f in TILE_FIELDS:
                out[f"gemm{i + 1}.{f}"] = list(dom[f])
        for f in GLOBAL_FIELDS:
            out[f] = list(self.space.globals[f])
        return out

    def restricted_to(self, configs: Iterable[Config]) -> "FeasibleSet":
        """The feasible configs among ``configs`` (order kept, duplicates dropped)."""
        narrowed = copy.copy(self)
        for cached in ("reasons", "_explicit_set"):
            narrowed.__dict__.pop(cached, None)
        configs = list(configs)
        keep, seen = [], set()
        for c in configs:
            if c not in seen and self._structural_reason(c) is None:
                seen.add(c)
                keep.append(c)
        narrowed._explicit = keep
        narrowed._explicit_from = len(configs)
        return narrowed
