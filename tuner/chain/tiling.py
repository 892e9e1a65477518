"""Tilings: how one tensor-core stage is cut into block tiles, and the grid that cut makes.

Below the stage kinds, which read a tiling's grid in their index maps, and below the config,
which holds one tiling per stage.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Protocol

from .expr import Expr


class Shaped(Protocol):
    """What a grid reads of a stage: the ``M x N x K`` of its product."""

    name: str
    m: int
    n: int
    k: int


TILE_FIELDS = ("bm", "bn", "bk", "wm", "wn", "stages", "split_k", "mma", "cm", "cn", "persist")
# Tile fields that name a choice rather than count something, with their accepted values.
# "sync": mma.sync warps (any sm_80+); "wgmma": Hopper warpgroup MMAs from swizzled shared memory
# filled by cp.async; "wgmma_tma": the same MMAs, shared memory filled by the Tensor Memory Accelerator;
# "wgmma_tma_t": the TMA-fed tile computed transposed, the weights on the instruction's 64-row side and
# the tile's BM rows (tokens) as its N, a multiple of 8 up to 256: few tokens no longer pad to 64,
# and M = 320 cuts into two tiles of 160.
TILE_CHOICES: dict[str, tuple[str, ...]] = {"mma": ("sync", "wgmma", "wgmma_tma", "wgmma_tma_t")}
# Tile fields that switch something off (0) or on in one of a few ways (1, ...), with what each
# value means. persist: 1 persistent blocks, 2 persistent blocks with the partial last wave split
# along K (StageTiles.tail_split).
TILE_SWITCHES: dict[str, dict[int, str]] = {"persist": {0: "off", 1: "persistent blocks",
                                                        2: "persistent, last wave split along K"}}
WARPGROUP_MMAS = ("wgmma", "wgmma_tma", "wgmma_tma_t")
TMA_MMAS = ("wgmma_tma", "wgmma_tma_t")
# The counts a tile field may hold at all, whatever a space lists: a value read back from a
# storage or a file outside these is refused before anything renders it (tuner.config.field_value).
TILE_LIMITS: dict[str, tuple[int, int]] = {"bm": (1, 4096), "bn": (1, 4096), "bk": (1, 4096), "wm": (1, 64),
                                           "wn": (1, 64), "stages": (1, 64), "split_k": (1, 4096),
                                           "cm": (1, 16), "cn": (1, 16)}
TILE_DEFAULTS: dict[str, Any] = {"split_k": 1, "mma": "sync", "cm": 1, "cn": 1, "persist": 0}  # what records made before a field existed mean
# Tile fields that a config's JSON form leaves out at their default, so that configs recorded
# before the field existed keep their form (and storage key).
TILE_OMITTED_AT_DEFAULT = ("persist",)

REGISTERS = 65536  # per SM, and per block at one block per SM
WG_OVERHEAD_REGS = 56  # registers a warpgroup kernel needs besides its accumulators (ptxas reports 26-52)
# Register reallocation (setmaxnreg) in a TMA-fed block of two or three MMA warpgroups: its
# producer is a whole warpgroup that gives its registers up to PRODUCER_REGS, and the MMA
# warpgroups take what that leaves (consumer_regs).
PRODUCER_REGS = 40
REALLOC_GROUPS = (2, 3)  # MMA warpgroups of a block that may reallocate


def consumer_regs(groups: int) -> int:
    """Registers an MMA thread takes in a block of ``groups`` MMA warpgroups that reallocates: the
    register file less the producer warpgroup's :data:`PRODUCER_REGS`, shared out in steps of 8
    (232 for two: 40 + 2 * 232 = 3 * 168, the even share of 384 threads the kernel starts with;
    152 for three)."""
    return min(256, (REGISTERS - PRODUCER_REGS * 128) // (128 * groups) // 8 * 8)


WGMMA_MAX_N = 256  # wgmma's widest N: a transposed tile's rows, a warpgroup's columns (multiples of 8)


def fitted_heights(m: int, parts: Iterable[int], listed: Iterable[int] = ()) -> tuple[int, ...]:
    """Tile heights that cut ``m`` rows into each count of ``parts`` tiles of whole 8-row groups,
    up to :data:`WGMMA_MAX_N` (a transposed tile's rows, any multiple of 8), less those that a
    ``listed`` height matches: as few tiles or fewer, and no more rows computed. 200 tokens make
    one tile of 200 or two of 104, where the listed 8-256 and 160 pad one of 256 or cut 128 + 72;
    600 make three of 200 or four of 152, where 256 computes 768 rows and 160 four tiles of 640.
    What fitted heights gained: studies/notes/design-figures.md."""
    listed = tuple(listed)
    out: list[int] = []
    for j in parts:
        h = cut_height(m, j)
        matched = any(cdiv(m, g) <= j and cdiv(m, g) * g <= j * h for g in listed)
        if h <= WGMMA_MAX_N and h not in out and not matched:
            out.append(h)
    return tuple(out)


def even_share(threads: int) -> int:
    """Registers per thread when ``threads`` share the register file: ptxas hands them out per
    warpgroup (a lone producer warp costs a whole warpgroup's share), in steps of 8."""
    return REGISTERS // (-(-threads // 128) * 128) // 8 * 8


def whole_clusters(sms: int, cluster: int) -> int:
    """One block per SM, in whole clusters of ``cluster`` blocks: the blocks of a persistent stage
    resident at once on ``sms`` SMs."""
    return sms // cluster * cluster


def may_persist(mma: str, split_k: int) -> bool:
    """Whether a tiling of this MMA and split count may run persistent blocks, as far as its own
    fields go: a TMA-fed tile (the ring carries from tile to tile) of one split (a block computes
    whole tiles). Whether its stage has more tiles than blocks resident at once is the stage's
    question (:func:`tuner.search.constraints.persistence`)."""
    return mma in TMA_MMAS and split_k == 1


def tile_value(field: str, value: Any) -> Any:
    """A tile field's value in its own type (choices are names, the rest counts)."""
    if value is None:
        raise KeyError(field)
    return str(value) if field in TILE_CHOICES else int(value)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def whole_groups(rows: int) -> int:
    """``rows`` rounded up to whole 8-row groups: the rows of a swizzle atom, and the step of a
    transposed tile's rows (wgmma's N)."""
    return cdiv(rows, 8) * 8


def cut_height(rows: int, tiles: int) -> int:
    """The least height, in whole 8-row groups, that cuts ``rows`` into ``tiles`` tiles."""
    return whole_groups(cdiv(rows, tiles))


def refitted(t: "StageTiles", m_from: int, m_to: int) -> "StageTiles":
    """``t``, picked at ``m_from`` rows, cutting ``m_to`` rows into as many tiles of whole 8-row
    groups where its height may be any such multiple (a transposed tile, up to
    :data:`WGMMA_MAX_N`): a neighbouring size's tile of 200 rows at 200 tokens is one of 208 at
    208, the height that size's ``bm_fit`` holds, where 200 rows would leave a second tile of 8."""
    if not t.transposed or m_from == m_to:
        return t
    h = cut_height(m_to, cdiv(m_from, t.bm))
    return replace(t, bm=h) if h <= WGMMA_MAX_N else t


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass(frozen=True)
class StoreLayout:
    """A TMA-stored epilogue's parking (:meth:`StageTiles.tma_store_layout`): ``rounds`` a tile,
    each parking ``boxes`` boxes of ``box_rows`` rows by 64 columns in one slice; two slices take
    turns where there are several rounds."""

    rounds: int
    box_rows: int
    boxes: int

    @property
    def slices(self) -> int:
        return 2 if self.rounds > 1 else 1

    @property
    def bytes(self) -> int:
        """The slices' shared memory (halves, 64 a box row)."""
        return self.slices * self.boxes * self.box_rows * 64 * 2


@dataclass(frozen=True)
class StageTiles:
    """Tiling of one GEMM stage: block tile, warp grid, pipeline depth, split-K, MMA instruction
    and thread-block cluster.

    With a warpgroup MMA (``wgmma``, ``wgmma_tma``), ``wm`` x ``wn`` counts warpgroups (four warps
    each, 64 rows apiece); transposed (``wgmma_tma_t``), one row of ``wn`` warpgroups of 64
    columns each. ``cm`` x ``cn`` blocks computing neighbouring tiles form one cluster (TMA-fed
    tiles only): each A slab is fetched once and multicast to the ``cn`` blocks that read
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
    persist: int = 0

    def short(self) -> str:
        """A compact description, e.g. ``256x128x64 T1x2 s4 k2 c2x1 p`` (the letter: the MMA
        instruction, w/g/t/T for mma.sync, wgmma, TMA-fed wgmma and its transposed tile)."""
        letter = dict(wgmma="g", wgmma_tma="t", wgmma_tma_t="T").get(self.mma, "w")
        return (f"{self.bm}x{self.bn}x{self.bk} {letter}{self.wm}x{self.wn} s{self.stages}"
                + (f" k{self.split_k}" if self.split_k > 1 else "")
                + (f" c{self.cm}x{self.cn}" if self.cluster > 1 else "")
                + (" ts" if self.tail_split else " p" if self.persistent else ""))

    @property
    def cluster(self) -> int:
        """Blocks per cluster."""
        return self.cm * self.cn

    @property
    def warpgroup(self) -> bool:
        """Whether the stage computes with Hopper warpgroup MMAs."""
        return self.mma in WARPGROUP_MMAS

    @property
    def tma(self) -> bool:
        """Whether the Tensor Memory Accelerator fills the ring (a producer warp issues the copies)."""
        return self.mma in TMA_MMAS

    @property
    def transposed(self) -> bool:
        """Whether the tile is computed transposed (``wgmma_tma_t``): each warpgroup holds 64 of its
        BN columns for all BM rows."""
        return self.mma == "wgmma_tma_t"

    @property
    def wgmma_n(self) -> int:
        """The N of the tile's wgmma instruction: columns per warpgroup, or, transposed, the rows."""
        return self.bm if self.transposed else self.bn // self.wn

    @property
    def acc_regs(self) -> int:
        """A warpgroup MMA thread's fp32 accumulators: its 64 x wgmma_n share of the tile over 128 threads."""
        return 64 * self.wgmma_n // 128

    @property
    def realloc(self) -> bool:
        """Whether the block moves registers from its producer to its MMA warpgroups (setmaxnreg): a
        TMA-fed tile of two or three warpgroups whose accumulators do not fit the even share beside a
        producer warp (128x256 does not: 128 accumulators past 168; nor a transposed tile of 192
        weight rows and 184 tokens in three: 92 past 128). Its producer is then a whole warpgroup,
        which leaves the tile after its copies, and the MMA warpgroups get :attr:`consumer_regs`."""
        groups = self.wm * self.wn
        return (self.tma and groups in REALLOC_GROUPS
                and self.acc_regs + WG_OVERHEAD_REGS > even_share(groups * 128 + 32))

    @property
    def consumer_regs(self) -> int:
        """Registers an MMA thread takes where the block reallocates (:func:`consumer_regs`)."""
        return consumer_regs(self.wm * self.wn)

    @property
    def warps(self) -> int:
        """Warps per block; the TMA variants add one producer warp that only issues copies (a whole
        producer warpgroup where the tile reallocates registers)."""
        producer = (4 if self.realloc else 1) if self.tma else 0
        return self.wm * self.wn * (4 if self.warpgroup else 1) + producer

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def ring_bytes(self) -> int:
        """The ring of A and B tiles: swizzled unpadded rows for wgmma, rows padded by 16 bytes for mma.sync."""
        row = self.bk * 2 if self.warpgroup else self.bk * 2 + 16
        return self.stages * (self.bm + self.bn) * row

    @property
    def persistent(self) -> bool:
        """Whether the stage runs persistent blocks (``persist`` = 1 or 2, TMA-fed tiles of one
        split, :func:`may_persist`): as many blocks as the device holds at once, each looping over
        tiles with its ring carried from one tile to the next, so the producer fills the ring for
        the next tile while the MMA warps store this one's epilogue. Without it every tile is a
        block of its own, which fills its ring from empty and stores its epilogue with no copy in
        flight."""
        return bool(self.persist)

    @property
    def tail_split(self) -> bool:
        """Whether a persistent stage splits its partial last wave along K (``persist`` = 2): the
        tiles past the last whole wave are each cut at one common K chunk (:data:`TAIL_SPLIT`),
        their first parts computed by as many blocks, the rests shared by the blocks the wave
        leaves free, so those SMs do not idle through it; the two parts of a tile are summed through
        the workspace (``PersistentWork`` in ``wgmma.cuh``, ``meet_parts`` in ``gemm.cuh``). Every part of the
        wave covers the same K range as the others of its kind, so the wave reads its operands from
        L2 together as whole tiles do (stream-K's even shares, cut anywhere, did not: 1.2-2x
        slower, studies/README.md)."""
        return self.persist == 2

    def resident_blocks(self, sms: int) -> int:
        """Blocks of this tiling resident at once on ``sms`` SMs, one per SM in whole clusters: what
        a persistent stage launches."""
        return whole_clusters(sms, self.cluster)

    def smem_bytes(self, out_cols: int | None = None, n_out: int | None = None, residual: bool = False) -> int:
        """Shared memory of a block: the ring, plus for wgmma 1 KiB of alignment slack and, when the
        TMA fills the ring, two 8-byte mbarriers (full, empty) per slot; a persistent tile adds what
        its epilogue parks its output in (the ring is busy with the next tile by then), for
        ``out_cols`` stored columns (default BN) of an output ``n_out`` halves wide (``residual``: the
        stage adds one, see :meth:`stores_by_tma`)."""
        if self.warpgroup:
            return (self.ring_bytes() + 1024 + (16 * self.stages if self.tma else 0)
                    + self.persistent_epilogue_bytes(self.bn if out_cols is None else out_cols, n_out, residual))
        return self.ring_bytes()

    # Rows of a transposed tile that a persistent block parks at a time for its epilogue.
    SLICE_ROWS = 64

    @property
    def slice_rows(self) -> int:
        """Rows of a persistent transposed tile parked at a time: :data:`SLICE_ROWS`, or BM if fewer."""
        return min(self.bm, self.SLICE_ROWS)

    def persistent_epilogue_bytes(self, out_cols: int, n_out: int | None = None, residual: bool = False) -> int:
        """Shared memory beside the ring that a persistent tile parks its output in: stored through
        the TMA (:meth:`stores_by_tma`, given ``n_out``), the slices of :meth:`tma_store_layout`
        and 1024 bytes to align the first; else a transposed tile's fp32 rows of
        :attr:`transposed_pitch`, :data:`SLICE_ROWS` (or BM, if fewer) at a time, and any other
        tile's whole output as halves, ``out_cols`` wide and padded by 8, when it stores 16-byte
        pieces (else it stores from its registers and parks nothing)."""
        if not self.persistent:
            return 0
        if n_out is not None and self.stores_by_tma(out_cols, n_out, residual):
            return 1024 + self.tma_store_layout(out_cols).bytes
        if self.transposed:
            return self.slice_rows * self.transposed_pitch * 4
        return self.bm * (out_cols + 8) * 2 if out_cols % 8 == 0 else 0

    def stores_by_tma(self, out_cols: int, n_out: int, residual: bool = False) -> bool:
        """Whether a persistent tile's epilogue leaves through the TMA: parked in the loads' box
        layout (64-column boxes, 128-byte swizzle; :meth:`tma_store_layout`), then stored by the
        copy engine while the MMA warps go on. The boxes need ``out_cols`` (the tile's stored
        columns) in whole boxes and an output row pitch (``n_out`` halves) of whole 16 bytes; a
        transposed tile (parked by stmatrix, 16 rows at a time) its every column stored (no
        folded pairs, which lie in other threads) and its rows in whole slices of 16 rows or more, and
        no residual add (stmatrix takes the fragments as they are)."""
        if not self.persistent or out_cols % 64 or n_out % 8:
            return False
        if self.transposed:
            return not residual and out_cols == self.bn and self.slice_rows % 16 == 0 and self.bm % self.slice_rows == 0
        return True

    def tma_store_layout(self, out_cols: int) -> "StoreLayout":
        """How a TMA-stored epilogue (:meth:`stores_by_tma`) parks a tile of ``out_cols`` stored
        columns, in rounds through slices that take turns: a slice is parked again once the copy of
        two rounds back has read it, while the one just issued may still read the other.

        A transposed tile parks :data:`SLICE_ROWS` rows (or BM) of every column a round. Any other
        tile, where each warp column's share of the columns is two 64-column boxes or more, parks
        one box of each share a round, so that the epilogue needs two boxes' room where the whole
        tile would need all of them (128x256 tiles then keep a fourth ring slot); else it parks the
        whole tile in one round."""
        if self.transposed:
            return StoreLayout(rounds=self.bm // self.slice_rows, box_rows=self.slice_rows, boxes=out_cols // 64)
        share = out_cols // self.wn
        rounds = share // 64 if out_cols % self.wn == 0 and share % 64 == 0 and share >= 128 else 1
        return StoreLayout(rounds=rounds, box_rows=self.bm, boxes=out_cols // 64 // rounds)

    @property
    def transposed_pitch(self) -> int:
        """Floats per row of a transposed tile parked for its epilogue: BN, padded by 4 so that a
        warp's stores (8 rows two apart, 8 columns) fall on 32 distinct banks."""
        return self.bn + 4

    def transposed_out_bytes(self) -> int:
        """A transposed tile's fp32 accumulators parked in the ring for its epilogue: BM rows."""
        return self.bm * self.transposed_pitch * 4


# The first K chunk of split s of KC chunks in S splits, here and in the kernels: the chunks are
# dealt as evenly as they go (split sizes differ by at most one), so any split count up to the
# chunk count leaves no split empty: 17 chunks make 8 splits of 2 or 3, where ceil-sized splits
# of 3 would fill only 6.
SPLIT_BEGIN = Expr("s * KC // S")

# The partial last wave of a persistent stage of `tiles` tiles of KC chunks on `grid` blocks, split
# along K (persist = 2), here and in the kernels: its `tail` tiles are each cut at chunk `split`;
# block i < tail computes tile i's first part, and the grid - tail spare blocks share the rests,
# `parts` at most each. The cut balances the two (split ~ parts x (KC - split)), and the wave is
# split only where that ends it sooner than a whole tile would (TAIL_GAINS).
TAIL = Expr("tiles % grid if tiles > grid and KC > 1 else 0")
TAIL_PARTS = Expr("(grid - 1) // (grid - tail)")
TAIL_SPLIT = Expr("(KC * parts + (parts + 1) // 2) // (parts + 1)")
TAIL_GAINS = Expr("split < KC and parts * (KC - split) < KC")


def tail_split(tiles: int, kc: int, grid: int) -> tuple[int, int, int]:
    """``(tail, split, parts)`` of a persistent stage whose partial last wave is split along K
    (:data:`TAIL`): ``(0, KC, 0)`` where nothing is split."""
    env = {"tiles": tiles, "grid": grid, "KC": kc}
    tail = TAIL.values(env)
    if tail:
        env["tail"] = tail
        env["parts"] = TAIL_PARTS.values(env)
        env["split"] = TAIL_SPLIT.values(env)
        if TAIL_GAINS.values(env):
            return tail, env["split"], env["parts"]
    return 0, kc, 0


@dataclass(frozen=True)
class StageGrid:
    """How a stage's output is cut into tiles, derived from its size and tiling."""

    stage: Shaped
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
        """K chunks of the largest split."""
        return cdiv(self.kc, self.tiles.split_k)

    @property
    def blocks(self) -> int:
        return self.mt * self.nt * self.tiles.split_k

    def launched(self, sms: int) -> int:
        """The blocks the stage's kernel launches on ``sms`` SMs: one per tile (and split), or for a
        persistent stage one per SM in whole clusters, block b taking tiles b, b + grid, ... (any
        count is correct; more than the device holds at once only queue)."""
        return min(self.blocks, self.tiles.resident_blocks(sms)) if self.tiles.persistent else self.blocks

    def split_begin(self, s):
        """First K chunk of split ``s`` (an int or an integer array): :data:`SPLIT_BEGIN`."""
        return SPLIT_BEGIN.values({"s": s, "KC": self.kc, "S": self.tiles.split_k})

    def split_of(self, kc):
        """The split that chunk ``kc`` (an int or an integer array) belongs to."""
        return ((kc + 1) * self.tiles.split_k - 1) // self.kc

    def split_chunks(self, s: int) -> range:
        return range(self.split_begin(s), self.split_begin(s + 1))
