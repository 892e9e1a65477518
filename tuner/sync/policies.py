"""Sync policies, tile orders and launch modes: the one definition of each.

Every formula here is an :class:`~tuner.chain.expr.Expr`. The CUDA templates receive
their C text (``expr.c``); the model checker evaluates them in Python. Names a
formula may read:

producer stage (``1``): ``m1``, ``n1`` (its tile), ``BM1``, ``BN1``, ``MT1``, ``NT1``
consumer stage (``2``): ``m2`` (its tile), ``kc`` (the K chunk about to be loaded,
counted over the whole reduction), ``first`` (1 on a split's first chunk),
``BM2``, ``BK2``, ``MT2``; ``r`` is the producer tile row a wait loop visits.

Which producer elements a consumer's chunk reads depends on the consumer's stage kind, so a
policy reads it through the names of the kind's **index map** (``INDEX_MAP_NAMES``). A kind
reads the producer's output through one or more **regions** (a GEMM one: its A operand; an
attention tile two: its queries once, then keys and values chunk by chunk); per region and
chunk ``kc``: whether it reads any producer element then (``A_ANY``), whether its rows differ
from the chunk before (``A_FRESH``), the first and last producer output row (``A_ROW_LO``,
``A_ROW_HI``) and column (``A_COL``, ``A_COL_HI``) it reads, and, over all its chunks and
regions, the first and last rows the tile reads (``A_TILE_LO``, ``A_TILE_HI``). A kind whose
reads depend on the consumer tile's column also reads ``n2``. :func:`policy_for` binds a
policy to each region of the consumer's kind (:mod:`tuner.chain.kinds`), so one policy serves a
GEMM, a convolution and an attention stage alike.
Tile orders read ``t`` (ticket), ``MT``, ``NT``, ``S`` (split count), ``CM``, ``CN`` (cluster shape).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Mapping

from ..chain.expr import Expr

if TYPE_CHECKING:
    from ..chain.tiling import StageGrid


@dataclass(frozen=True)
class SyncPolicy:
    """How a consumer tile learns that the producer tiles it reads are written.

    A producer tile ``(m1, n1)``, once all its splits are summed and stored, adds 1
    to semaphore ``post_sem``. Before loading K chunk ``kc`` of its A operand, a
    consumer tile ``m2`` checks ``wait_when``; if true it waits, for every producer
    row ``r`` in ``[wait_row_lo, wait_row_hi]``, until semaphore ``wait_sem`` holds
    ``epoch * wait_count``, and within a row for every producer tile column ``c`` in
    ``[wait_col_lo, wait_col_hi]``. ``sems`` is how many semaphores the policy needs.
    """

    name: str
    doc: str
    sems: Expr
    post_sem: Expr
    wait_when: Expr
    wait_row_lo: Expr
    wait_row_hi: Expr
    wait_col_lo: Expr
    wait_col_hi: Expr
    wait_sem: Expr
    wait_count: Expr
    requires: Expr  # a hard constraint this policy puts on the tiling (1 = fine)
    requires_doc: str = ""

    def bind(self, index_map: Mapping[str, Expr]) -> "SyncPolicy":
        """The policy with the index map's names (``A_ROW_LO``...) replaced by a stage kind's formulas."""
        exprs = {f.name: getattr(self, f.name).substitute(index_map) for f in fields(self)
                 if isinstance(getattr(self, f.name), Expr)}
        return replace(self, **exprs)


INDEX_MAP_NAMES = ("A_ANY", "A_FRESH", "A_ROW_LO", "A_ROW_HI", "A_COL", "A_COL_HI", "A_TILE_LO", "A_TILE_HI")


_ROW_LO = Expr("A_ROW_LO // BM1")
_ROW_HI = Expr("min(A_ROW_HI // BM1, MT1 - 1)")

POLICIES: dict[str, SyncPolicy | None] = {
    # Baseline: separate kernels in stream order, no semaphores at all.
    "stream": None,
    "tile": SyncPolicy(
        "tile", "wait, inside the K loop, for exactly the producer tiles that cover the next K chunk",
        sems=Expr("MT1 * NT1"), post_sem=Expr("m1 * NT1 + n1"),
        # A chunk whose rows are those of the chunk before and whose columns start inside the same
        # producer tile reads nothing new: no wait. One check a waited chunk: loading the next 4-16
        # chunks' semaphores in one round trip and skipping the checks of those seen posted was
        # measured 4.5-41% slower (results page, "The tile policy's batched check"), so it was taken out.
        wait_when=Expr("A_ANY and (first or A_FRESH or A_COL % BN1 == 0)"),
        wait_row_lo=_ROW_LO, wait_row_hi=_ROW_HI,
        wait_col_lo=Expr("A_COL // BN1"), wait_col_hi=Expr("min(A_COL_HI // BN1, NT1 - 1)"),
        wait_sem=Expr("r * NT1 + c"), wait_count=Expr("1"),
        # Where chunks walk along the columns (CSTEP2 = 1), a chunk must not start inside one producer
        # tile and end in the next: the wait above would miss the second.
        requires=Expr("CSTEP2 == 0 or BN1 % BK2 == 0"),
        requires_doc="the producer's BN must be a multiple of the consumer's BK"),
    "row": SyncPolicy(
        "row", "wait once, before the first K chunk, for every producer tile of the rows read",
        sems=Expr("MT1"), post_sem=Expr("m1"),
        wait_when=Expr("first"),
        wait_row_lo=Expr("A_TILE_LO // BM1"), wait_row_hi=Expr("min(A_TILE_HI // BM1, MT1 - 1)"),
        wait_col_lo=Expr("0"), wait_col_hi=Expr("0"),
        wait_sem=Expr("r"), wait_count=Expr("NT1"),
        requires=Expr("1")),
}


@dataclass(frozen=True)
class TileOrder:
    """Maps a dispatch ticket ``t`` to a tile ``(m, n)`` and split ``s``; splits of a tile are adjacent.

    With clusters of ``CM`` x ``CN`` blocks, consecutive tickets form a cluster: the order walks
    clusters (``t // (CM * CN)``) over the ``MT/CM`` x ``NT/CN`` grid of cluster tiles, and a
    block's rank in its cluster (``t % (CM * CN)``, M fastest) picks its tile inside.
    """

    name: str
    m: Expr
    n: Expr
    s: Expr


def _clustered(m: str, n: str) -> tuple[Expr, Expr, Expr]:
    """An order over cluster tiles, written with ``{q}`` (cluster index), ``{MTC}`` and ``{NTC}``
    (cluster tiles along M and N), turned into block tiles."""
    names = {"q": "(t // (CM * CN))", "MTC": "(MT // CM)", "NTC": "(NT // CN)"}
    return (Expr(f"{m.format(**names)} * CM + (t % (CM * CN)) % CM"),
            Expr(f"{n.format(**names)} * CN + (t % (CM * CN)) // CM"), Expr("{q} % S".format(**names)))


ORDERS: dict[str, TileOrder] = {
    "row": TileOrder("row", *_clustered(m="{q} // ({NTC} * S)", n="({q} // S) % {NTC}")),
    "col": TileOrder("col", *_clustered(m="({q} // S) % {MTC}", n="{q} // ({MTC} * S)")),
}

# How a block gets its ticket: its blockIdx (hardware order), or an atomic counter
# taken at block start, so tickets follow the order blocks actually start in.
DISPATCHES = ("block", "ticket")

# serial: one kernel per stage on one stream (a mode of the stream policy).
# pdl: one stream, but each kernel after the first is a programmatic dependent launch: it may be
#   scheduled once every block of the kernel before it has started (each calls
#   griddepcontrol.launch_dependents first), so the next stage's launch and block scheduling
#   overlap the previous stage's tail. Under the stream policy its blocks wait
#   (griddepcontrol.wait) until that kernel has finished and its writes are visible: a thread
#   waits just before it first copies from the previous stage's output, so the copies that depend
#   on no stage (the weights of a TMA-fed stage's ring, a KV cache) go first. Under a tile policy
#   they wait tile by tile on the semaphores instead: the dependent launch holds the consumer back
#   exactly as two_stream's guard does, without the guard kernel or a second stream.
# two_stream: producer and consumer on two streams; a one-block guard kernel holds the
#   consumer back until every producer block has started, so spinning consumers can
#   never keep a producer tile off the GPU.
# fused: one launch; blocks take tickets across all stages in dependency order, so a
#   tile only ever waits on tiles whose blocks are already running.
LAUNCHES = ("serial", "pdl", "two_stream", "fused")
STREAM_ORDERED = ("serial", "pdl")  # launches whose kernel boundaries may order the stages (the stream policy's)


def launch_allowed(policy: str, launch: str, dispatch: str) -> str | None:
    """Why this policy/launch/dispatch combination is impossible, or None if it is fine."""
    if policy == "stream" and launch not in STREAM_ORDERED:
        return "the stream policy runs in the stream-ordered launch modes (serial, pdl)"
    if policy != "stream" and launch == "serial":
        return "a serial launch orders the stages by kernel boundaries: a sync policy runs in pdl, two_stream or fused"
    if launch == "fused" and dispatch != "ticket":
        return "a fused launch dispatches by ticket"
    return None


def stream_ordered(policy: str, launch: str) -> bool:
    """Whether kernel boundaries order the stages: the stream policy, in its serial or pdl launch."""
    return policy == "stream" and launch in STREAM_ORDERED


def cluster_allowed(dispatch: str, launch: str) -> str | None:
    """Why blocks of this dispatch/launch cannot form clusters, or None if they can. The blocks of
    a cluster must compute the tiles of one cluster tile, which only the hardware's block order
    guarantees: tickets are taken per block, and a fused launch mixes stages."""
    if dispatch != "block" or launch == "fused":
        return "thread-block clusters need block dispatch in a serial or two_stream launch"
    return None


def persistent_allowed(dispatch: str, launch: str, tail_split: bool = False, policy: str = "stream") -> str | None:
    """Why stages of this dispatch/launch cannot run persistent blocks (``tail_split``: with the
    partial last wave split along K, under ``policy``), or None if they can. A persistent block
    takes the tiles ``blockIdx.x``, ``+ gridDim.x``, ... in turn, which only block dispatch numbers
    so, and a fused launch hands tickets out across stages. A persistent block waits tile by tile
    like any other, and may hold its SM while it waits: in a pdl or two_stream launch every block
    of the producer has started before any of the consumer's (the dependent launch, or the guard,
    which counts a persistent block's tiles), so no waiting block can keep a producer tile off the
    GPU. The split wave's parts are summed through counters that only the stream policy's launches
    have been checked with."""
    if dispatch != "block" or launch == "fused":
        return "persistent blocks need block dispatch in a serial, pdl or two_stream launch"
    if tail_split and not stream_ordered(policy, launch):
        return "a persistent stage whose last wave is split along K needs the stream policy (serial, pdl)"
    return None


def grid_env(grid: "StageGrid", idx: str) -> dict[str, int]:
    """Values of the constant names a policy formula reads for one stage, suffixed ``idx``
    (``"1"`` as the producer of a pair, ``"2"`` as its consumer): tile height ``BM``, tile
    width ``BN`` in *stored* output columns (what a consumer reads, so an epilogue that folds
    column pairs halves it), ``BK``, tile rows ``MT`` and columns ``NT``, K chunks ``KC`` and
    splits ``S``.

    The one builder of that environment: the search space's constraints, the kernel renderer
    and the model checker all read it, so they cannot disagree about a name.
    """
    from ..chain.kinds import kind_of  # noqa: PLC0415 - the kinds import this module's Expr users

    st, t = grid.stage, grid.tiles
    return {f"BM{idx}": t.bm, f"BN{idx}": t.bn // st.fold, f"BK{idx}": t.bk, f"MT{idx}": grid.mt, f"NT{idx}": grid.nt,
            f"KC{idx}": grid.kc, f"S{idx}": t.split_k, **kind_of(st).env(st, idx)}


def policy_for(policy: SyncPolicy, consumer: "StageGrid") -> tuple[SyncPolicy, ...]:
    """``policy`` bound to each region of the consumer's stage kind (see :meth:`SyncPolicy.bind`), in
    the order the kernel waits on them; regions that bind to the same waits are kept once."""
    from ..chain.kinds import kind_of  # noqa: PLC0415

    regions = kind_of(consumer.stage).regions(consumer.stage)
    return _bound(policy, tuple(tuple(r.items()) for r in regions))


@lru_cache(maxsize=64)
def _bound(policy: SyncPolicy, regions: tuple[tuple[tuple[str, Expr], ...], ...]) -> tuple[SyncPolicy, ...]:
    return tuple(dict.fromkeys(policy.bind(dict(region)) for region in regions))


def pair_env(producer: "StageGrid", consumer: "StageGrid") -> dict[str, int]:
    """The environment of a policy's formulas for one producer/consumer pair (see :func:`grid_env`)."""
    return {**grid_env(producer, "1"), **grid_env(consumer, "2")}


def order_env(grid: "StageGrid") -> dict[str, int]:
    """Values of the constant names a tile order reads for one stage."""
    return {"MT": grid.mt, "NT": grid.nt, "S": grid.tiles.split_k, "CM": grid.tiles.cm, "CN": grid.tiles.cn}
