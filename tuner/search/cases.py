"""Hand-picked configs that cover every policy x order x dispatch x launch mode, and the L2
prefetch under every launch mode where the chain allows it.

Used by the GPU tests, the CPU compile test and ``bench`` (as the seed set before
tuning); each is a valid point of the default search space for the chain it is made for.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product

from ..chain.kinds import kind_of
from ..chain.tiling import whole_groups
from ..chain.workloads import Chain
from ..config import Config, StageGrid, StageTiles
from ..device import DeviceInfo
from ..sync.policies import DISPATCHES, LAUNCHES, ORDERS, POLICIES, cluster_allowed, launch_allowed, persistent_allowed
from ..sync.prefetch import prefetch_allowed
from .constraints import Limits, stage_problem


def combos() -> list[tuple[str, str, str, str]]:
    """Every allowed (policy, order, dispatch, launch)."""
    return [(p, o, d, l) for p, o, d, l in product(POLICIES, ORDERS, DISPATCHES, LAUNCHES)
            if launch_allowed(p, l, d) is None]


def tiles_for(chain: Chain, split: tuple[int, int] = (1, 1), mma: str = "sync", pack: bool = False) -> tuple[StageTiles, ...]:
    """A reasonable tiling for the chain's M: short tiles at small M; the first stage gets
    ``split[0]``, every later one ``split[1]``. A convolution's chunk holds one tap, so its BK
    is 32 on mma.sync (channels are a multiple of 32 in the tests) and 64 on wgmma. A transposed
    tile (``wgmma_tma_t``) is as tall as M needs, in 8s, up to 64. An attention
    stage's tile is one head of 16 queries (64 past 64 tokens) on mma.sync, whatever ``mma``; with
    ``pack``, the heads of a KV head's group (up to 8) of one row of warps' worth of tokens (four
    rows past 64 tokens)."""
    m = chain.stages[0].m
    n = len(chain.stages)
    splits = (split[0], *([split[1]] * (n - 1)))
    gemms = [st for st in chain.stages if not kind_of(st).OWN_WARP_TILE]
    bn = 64 if min(st.n for st in gemms) <= 64 else 128  # no wider than the narrowest stage needs
    if mma == "wgmma_tma_t":  # rows are the instruction's N: as few as M needs, in 8s, up to 64
        out = [StageTiles(min(64, whole_groups(m)), bn, 64, 1, bn // 64, 4, s, mma) for s in splits]
    elif mma != "sync":
        wm = 1 if m <= 64 else 2
        out = [StageTiles(64 * wm, bn, 64, wm, 1, 4, s, mma) for s in splits]
    elif m <= 16 and all(kind_of(st).MIN_CASE_ROWS <= 16 for st in chain.stages):
        out = [StageTiles(16, bn, 64, 1, 4, 4, s) for s in splits]
    elif m <= 64:
        out = [StageTiles(64, bn, 32, 2, 2, 4, s) for s in splits]
    else:
        out = [StageTiles(128, bn, 32, 2, 2, 4, splits[0]), *(StageTiles(64, bn, 32, 2, 2, 4, s) for s in splits[1:])]
    return tuple(kind_of(st).case_tiles(st, t, pack) for st, t in zip(chain.stages, out))


def _tma_fed(chain: Chain) -> bool:
    """Whether every stage reads a stored A operand, which the TMA-fed tiles of the cases below need."""
    return all(kind_of(st).STORED_A for st in chain.stages)


def coverage(chain: Chain, mma: str = "sync") -> list[Config]:
    """One config per allowed combination, alternating split-K and uneven M tiles across them,
    attention tiles of one head and of packed heads (every other combination), and the L2
    prefetch (every other pair of combinations, so under every launch mode) where the chain's
    later inputs fit an H200's L2."""
    out = []
    prefetch = "l2" if prefetch_allowed("l2", chain, DeviceInfo("H200")) is None else "none"
    for i, (p, o, d, l) in enumerate(combos()):
        split = (2, 2) if i % 3 == 1 else (1, 1)
        tiles = tiles_for(chain, split, mma, pack=i % 2 == 1)
        if l == "fused":  # one thread count for every stage: an attention tile's warps split its keys
            warps = max(t.warps for t in tiles)
            tiles = tuple(replace(t, wn=warps // t.wm) if kind_of(st).OWN_WARP_TILE else t
                          for st, t in zip(chain.stages, tiles))
            # A TMA stage's producer warp makes an odd count, which no attention tile splits.
            if len({t.threads for t in tiles}) > 1 or any(
                    kind_of(st).tiling_problem(StageGrid(st, t)) for st, t in zip(chain.stages, tiles)):
                continue
        out.append(Config(tiles, p, o, d, l, prefetch if i // 2 % 2 else "none"))
    return out


def clustered(chain: Chain) -> list[Config]:
    """TMA configs whose stages run in clusters of 2x1 and 1x2 blocks (where the tile grid
    divides), under every combination that allows clusters, alternating split-K."""
    out = []
    for i, (p, o, d, l) in enumerate(c for c in combos() if cluster_allowed(c[2], c[3]) is None):
        for cm, cn in ((2, 1), (1, 2)):
            split = (2, 2) if i % 2 else (1, 1)
            tiles = []
            for g in Config(tiles_for(chain, split, "wgmma_tma"), p, o, d, l).grids(chain):
                ok = g.mt % cm == 0 and g.nt % cn == 0
                tiles.append(replace(g.tiles, cm=cm, cn=cn) if ok else g.tiles)
            if any(t.cluster > 1 for t in tiles):
                out.append(Config(tuple(tiles), p, o, d, l))
    return out


def reallocated(chain: Chain) -> list[Config]:
    """Configs whose GEMM stages are tiles of two MMA warpgroups too large for the even share of
    registers, which move registers from their producer warpgroup (setmaxnreg): 128x256, and on
    every other combination a transposed 256-row tile for the last stage where M has 256 rows,
    under every combination but the fused launch, alternating split-K and, where the tile grid
    divides, a 2x1 cluster. Empty for chains of other stage kinds or too small for such tiles."""
    if not _tma_fed(chain) or chain.stages[0].m < 65 or min(
            st.n for st in chain.stages) < 129:
        return []
    out = []
    for i, (p, o, d, l) in enumerate(c for c in combos() if c[3] != "fused"):
        split = 2 if i % 3 == 1 else 1
        tiles = [StageTiles(128, 256, 64, 2, 1, 4, split, "wgmma_tma") for _ in chain.stages]
        if i % 2 and chain.stages[-1].m >= 256:
            tiles[-1] = StageTiles(256, 128, 64, 1, 2, 4, split, "wgmma_tma_t")
        if i % 4 == 3 and cluster_allowed(d, l) is None:
            g = StageGrid(chain.stages[0], tiles[0])
            if g.mt % 2 == 0:
                tiles[0] = replace(tiles[0], cm=2)
        assert all(t.realloc for t in tiles)
        out.append(Config(tuple(tiles), p, o, d, l))
    return out


def three_warpgroups(chain: Chain, sms: int = DeviceInfo.sms) -> list[Config]:
    """Configs whose GEMM stages are TMA-fed tiles of three MMA warpgroups (``wm`` or ``wn`` 3,
    ``max_threads = 512``; llama's space holds the transposed one), under every combination but the
    fused launch, cycling through 192x192 (which moves registers from its producer warpgroup), a
    transposed tile of 192 weight rows and 184 rows (moves them too) and 192x128 (fits the even
    share beside a producer warp), the first cycle position whose stages the chain's constraints
    accept (a folded epilogue's stored columns must be whole chunks of the next stage's K), with
    split-K on every third and, on every other combination that allows one where the tile grid
    divides, a cluster of two; each also with persistent blocks where a stage has more tiles than
    ``sms``. Empty for chains of other stage kinds or too small for such tiles."""
    from .constraints import chain_problem  # noqa: PLC0415 - the constraints import this module's users

    if not _tma_fed(chain) or chain.stages[0].m < 185 or min(
            st.n for st in chain.stages) < 193:
        return []
    dev = DeviceInfo("cases", sms=sms)
    shapes = (StageTiles(192, 192, 64, 3, 1, 4, 1, "wgmma_tma"), StageTiles(184, 192, 64, 1, 3, 4, 1, "wgmma_tma_t"),
              StageTiles(192, 128, 64, 3, 1, 5, 1, "wgmma_tma"))

    def fits(tiles: list[StageTiles], combo: tuple[str, ...]) -> bool:
        return (all(stage_problem(StageGrid(st, u), Limits(), dev) is None for st, u in zip(chain.stages, tiles))
                and chain_problem(Config(tuple(tiles), *combo), chain, dev) is None)

    def where_fits(tiles: list[StageTiles], wanted: list[StageTiles], combo: tuple[str, ...]) -> list[StageTiles]:
        """Each stage's ``wanted`` tiling where the chain, the others as in ``tiles``, accepts it."""
        return [v if fits(tiles[:j] + [v] + tiles[j + 1:], combo) else u for j, (u, v) in enumerate(zip(tiles, wanted))]

    out: list[Config] = []
    clustered = 0
    for i, combo in enumerate(c for c in combos() if c[3] != "fused"):
        split = 2 if i % 3 == 1 else 1
        cycle = ([replace(shapes[(i + r + j) % 3], split_k=split) for j in range(len(chain.stages))] for r in range(3))
        tiles = next((ts for ts in cycle if fits(ts, combo)), None)
        if tiles is None:
            continue
        if cluster_allowed(combo[2], combo[3]) is None and (clustered := clustered + 1) % 2:
            tiles = where_fits(tiles, [replace(u, **({"cn": 2} if u.transposed else {"cm": 2})) for u in tiles], combo)
        out.append(Config(tuple(tiles), *combo))
        if persistent_allowed(combo[2], combo[3], policy=combo[0]) is None:
            chosen = where_fits(tiles, [replace(u, persist=1, split_k=1, stages=3) for u in tiles], combo)
            if any(u.persist for u in chosen) and fits(chosen, combo):
                out.append(Config(tuple(chosen), *combo))
    return out


def persistent(chain: Chain, sms: int) -> list[Config]:
    """TMA configs whose stages run persistent blocks on a device of ``sms`` SMs, each block looping
    over several tiles: under every policy and launch that allows them (the stream policy in serial
    and pdl, the tile and row policies in pdl and two_stream) and both orders, cycling through the
    plain tile, the transposed tile (where M has the rows, of 160 rows, whose epilogue parks fp32
    rows 64, 64 and 32 at a time, and of 128, parked by stmatrix for the TMA in two rounds), a
    2x1 cluster where the tile grid divides and the two-warpgroup
    tile that moves registers where the chain is wide enough; each also with its partial last
    wave split along K where the space allows it. A stage with no more tiles than
    ``sms`` keeps one tile per block. Empty for chains of other stage kinds."""
    if not _tma_fed(chain):
        return []
    dev = DeviceInfo("cases", sms=sms)
    out = []
    wide = chain.stages[0].m >= 65 and min(st.n for st in chain.stages) >= 129
    for i, (p, o, d, l) in enumerate(c for c in combos() if persistent_allowed(c[2], c[3]) is None):
        variant = i % 4 if i % 4 < 3 or wide else 0
        tiles = list(tiles_for(chain, mma="wgmma_tma_t" if variant == 1 else "wgmma_tma"))
        tilings = [tiles]
        if variant == 1 and chain.stages[0].m >= 160:
            tilings = [[replace(t, bm=bm) for t in tiles] for bm in (160, 128)]
        if variant == 3:
            # three slots: four and the output parked beside them pass the shared memory
            tilings = [[StageTiles(128, 256, 64, 2, 1, 3, 1, "wgmma_tma") for _ in chain.stages]]
        for tiles, persist in ((t, q) for t in tilings for q in (1, 2)):  # 2: the last wave split along K, where the space allows it
            if persistent_allowed(d, l, tail_split=persist == 2, policy=p):
                continue
            chosen = []
            for st, t in zip(chain.stages, tiles):
                t = replace(t, persist=persist)
                if variant == 2 and StageGrid(st, t).mt % 2 == 0:
                    t = replace(t, cm=2)
                chosen.append(t if stage_problem(StageGrid(st, t), Limits(), dev) is None else replace(t, persist=0))
            if any(t.persist == persist for t in chosen):
                out.append(Config(tuple(chosen), p, o, d, l))
    return out
