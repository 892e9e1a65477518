"""The hard constraints: which tilings and sync choices can run at all.

Each constraint takes what it needs and returns why the choice is impossible, or None; a config
is feasible when every one returns None. They are listed once, in :data:`STAGE_CONSTRAINTS` (one
stage's tiling alone) and :data:`CHAIN_CONSTRAINTS` (the global choices and the tilings
together), and :mod:`tuner.search.feasible` solves them before any sampler sees a search space.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..chain.kinds import kind_of
from ..chain.tiling import (
    TILE_SWITCHES,
    TMA_MMAS,
    WG_OVERHEAD_REGS,
    WGMMA_MAX_N,
    even_share,
    may_persist,
    next_pow2,
    tail_split,
    whole_groups,
)
from ..chain.workloads import Chain, edges
from ..config import Config, StageGrid
from ..device import DeviceInfo
from ..sync.policies import POLICIES, cluster_allowed, launch_allowed, pair_env, persistent_allowed
from ..sync.prefetch import prefetch_allowed

HW_MAX_THREADS = 1024  # threads per block on every CUDA architecture the templates target
HW_MAX_REGS = 255  # registers per thread
HW_MAX_CLUSTER = 8  # blocks per thread-block cluster (the portable size)


@dataclass(frozen=True)
class Limits:
    """Caps on a block beyond the device's own (a search space's ``[limits]``)."""

    max_threads: int = HW_MAX_THREADS
    max_tile_regs: int = HW_MAX_REGS
    max_cluster: int = HW_MAX_CLUSTER


WGMMA_ARCHS = ("sm_90", "sm_90a")  # warpgroup MMAs exist on Hopper only


def warp_tile(g: StageGrid, lim: Limits, dev: DeviceInfo) -> str | None:
    """mma.sync: each warp computes whole 16x16 fragments. wgmma: each warpgroup computes 64 rows
    and a multiple of 8 columns up to 256, over whole 64-wide swizzle atoms of K, with a ring of
    at least three slots (one stays under the MMAs in flight). Transposed (``wgmma_tma_t``): each
    warpgroup computes 64 columns and all BM rows, a multiple of 8 up to 256, and the epilogue
    parks the fp32 tile in the ring. A grid of three warpgroups (no power of two) is built for the
    TMA-fed tiles alone (192 rows, or a transposed tile's 192 weight rows, in three MMA
    warpgroups, their producer a whole warpgroup that hands them its registers:
    :attr:`StageTiles.realloc`)."""
    t = g.tiles
    groups = t.wm * t.wn
    if groups & (groups - 1) and t.mma not in TMA_MMAS:
        return f"a {t.wm}x{t.wn} warp grid (not a power of two) is built for the TMA-fed tiles alone"
    if t.warpgroup:
        if dev.arch not in WGMMA_ARCHS:
            return f"wgmma needs a Hopper GPU ({' or '.join(WGMMA_ARCHS)}), not {dev.arch}"
        if t.transposed:
            if t.wm != 1 or t.bn != 64 * t.wn:
                return f"a transposed {t.bm}x{t.bn} tile is not 64 columns per warpgroup for 1x{t.wn} warpgroups"
            if t.bm % 8 or t.bm > WGMMA_MAX_N:
                return f"BM={t.bm} of a transposed tile is not a multiple of 8 up to {WGMMA_MAX_N} rows"
            if not t.persistent and t.transposed_out_bytes() > t.ring_bytes():
                return f"the fp32 {t.bm}x{t.bn} tile does not fit in the {t.ring_bytes()}-byte ring for its epilogue"
        else:
            wgn = t.bn // t.wn
            if t.bm != 64 * t.wm:
                return f"BM={t.bm} is not 64 rows per warpgroup for {t.wm} warpgroups along M"
            if t.bn % t.wn or wgn % 8 or wgn > WGMMA_MAX_N:
                return f"BN={t.bn} over {t.wn} warpgroups is not a multiple of 8 up to {WGMMA_MAX_N} columns each"
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
        budget = t.consumer_regs if t.realloc else even_share(t.threads)
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
    cap = max(8, whole_groups(m)) if t.transposed else max(64 if t.warpgroup else 16, next_pow2(m))
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
    the split ends sooner than whole tiles (:func:`tuner.chain.tiling.tail_split`)."""
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
# The others read how the shape is split and clustered, or its stage's kind, too.
PLACEMENT_CONSTRAINTS: tuple[tuple[str, StageConstraint], ...] = (
    ("split_k", split_k),
    ("cluster", cluster),
    ("persistence", persistence),
    ("stage_kind", stage_kind),
)
STAGE_CONSTRAINTS = BLOCK_CONSTRAINTS + PLACEMENT_CONSTRAINTS


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
    """Which policy/launch/dispatch combinations exist at all (see :func:`tuner.sync.policies.launch_allowed`)."""
    return launch_allowed(policy, launch, dispatch)


def prefetch_fits(prefetch: str, chain: Chain, dev: DeviceInfo) -> str | None:
    """The later stages' inputs fit the share of L2 a prefetch may fill (see :mod:`tuner.sync.prefetch`)."""
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
    """Clustered stages need their blocks in hardware order (see :func:`tuner.sync.policies.cluster_allowed`)."""
    clustered = [g.stage.name for g in grids if g.tiles.cluster > 1]
    why = cluster_allowed(dispatch, launch) if clustered else None
    return f"{', '.join(clustered)}: {why}" if why else None


def persistent_launch(policy: str, dispatch: str, launch: str, grids: Sequence[StageGrid]) -> str | None:
    """Persistent stages need block dispatch outside a fused launch, and a split last wave the
    stream policy (see :func:`tuner.sync.policies.persistent_allowed`)."""
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
    for p, c in edges(chain.stages):
        why = policy_requires(config.policy, grids[p], grids[c])
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
