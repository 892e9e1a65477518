"""The GEMM stage kind: ``C[M,N] = epilogue(A[M,K] @ B[N,K]^T)``, B (the weights) stored N-major
with K contiguous, like ``nn.Linear``.

Index map: a GEMM that reads an earlier stage's output as its A operand reads it as is:
element ``A[r, c]`` is element ``C[r, c]`` of the producer. So consumer tile row ``m2`` reads
producer rows ``m2*BM2 .. m2*BM2+BM2-1`` at every chunk, and chunk ``kc`` the columns
``kc*BK2 ..``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from . import norm, residual, rope
from .expr import Expr
from .kind import StageKind, TensorCoreStage, WorkloadError

if TYPE_CHECKING:
    from .tiling import StageGrid

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class GemmStage(TensorCoreStage):
    """One GEMM of a chain, at a concrete size: ``C[M,N] = epilogue(A[M,K] @ B[N,K]^T)``."""

    kind: ClassVar[str] = "gemm"
    name: str
    m: int
    n: int
    k: int
    epilogue: str = "none"
    a_from: int | None = None  # index of the producer stage, or None for an external input
    residual: int | None = None  # what the stored output adds: residual.INPUT or an earlier stage (tuner.chain.residual)
    norm: str = "none"  # the row norm of A folded into the product (tuner.chain.norm)
    rope: rope.Rope | None = None  # the rotation of query and key columns in the epilogue (tuner.chain.rope)

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k) < 1:
            raise WorkloadError(f"stage {self.name}: sizes must be positive, got M={self.m} N={self.n} K={self.k}")
        if self.k % 8:
            # 16-byte cp.async chunks along K need K to be a multiple of 8 halves.
            raise WorkloadError(f"stage {self.name}: K={self.k} must be a multiple of 8")
        self.check_epilogue(self.name)
        norm.check(self)
        if self.rope is not None and self.fold != 1:
            raise WorkloadError(f"stage {self.name}: a rotated stage stores each accumulator column; the "
                                f"{self.epilogue} epilogue folds {self.fold} into one")
        rope.check(self)

    @property
    def a_shape(self) -> tuple[int, int]:
        """The stored A operand."""
        return (self.m, self.k)


# The index map as formulas in the consumer's names (see tuner.sync.policies.INDEX_MAP_NAMES): one region,
# the A operand, read at the same rows at every chunk, so a chunk's rows are the tile's, and its
# columns walk along with the chunks.
INDEX_MAP: dict[str, Expr] = {"A_ANY": Expr("1"), "A_FRESH": Expr("0"),
                              "A_ROW_LO": Expr("m2 * BM2"), "A_ROW_HI": Expr("m2 * BM2 + BM2 - 1"),
                              "A_TILE_LO": Expr("m2 * BM2"), "A_TILE_HI": Expr("m2 * BM2 + BM2 - 1"),
                              "A_COL": Expr("kc * BK2"), "A_COL_HI": Expr("kc * BK2 + BK2 - 1")}


def producer_cols(producer: "StageGrid") -> tuple[np.ndarray, np.ndarray]:
    """Stored output columns ``[lo, hi)`` each producer tile column writes.

    A folding epilogue (SwiGLU) stores the pair of accumulator columns ``2c, 2c+1`` as column
    ``c``, so tile ``n1`` writes the columns whose accumulator pair starts inside its ``BN``
    columns.
    """
    st, bn = producer.stage, producer.tiles.bn
    fold = st.fold
    n1 = np.arange(producer.nt, dtype=np.int64)
    acc_lo, acc_hi = n1 * bn, np.minimum((n1 + 1) * bn, st.n)
    return -(-acc_lo // fold), -(-acc_hi // fold)


def first_read(producer: "StageGrid", consumer: "StageGrid") -> np.ndarray:
    """``[s, n1]``: the first chunk of split ``s`` that reads columns of producer tile column ``n1``, or NEVER."""
    bk = consumer.tiles.bk
    lo, hi = producer_cols(producer)
    k_first, k_last = lo // bk, (hi - 1) // bk
    s = np.arange(consumer.tiles.split_k, dtype=np.int64)[:, None]
    a, b = consumer.split_begin(s), consumer.split_begin(s + 1)
    req = np.maximum(a, k_first[None, :])
    ok = (hi > lo)[None, :] & (req <= np.minimum(b - 1, k_last[None, :]))
    return np.where(ok, req, NEVER)


_TORCH_TABLES: dict = {}  # a rotation's cosines and sines, per rotation and shape, made once


class GemmKind(StageKind):
    """The GEMM stage kind: ``C[M,N] = epilogue(A[M,K] @ B[N,K]^T)``."""

    name = "gemm"
    HEADER = None  # the kind's own kernel header, beside the shared ones (none: RowMajor is shared)
    TILE_TEMPLATE = "tile_gemm.j2"  # the tile's type and body in the kernel template
    REGIONS = (INDEX_MAP,)
    PER_COLUMN = False  # a tile's reads do not depend on its column
    OWN_WARP_TILE = False  # a warp's tile is its share of BM x BN (space.warp_tile, space.accumulators)
    PADS_ROWS = True  # rows are independent: fewer can run zero-padded to a tuned count
    STORED_A = True  # A is a stored [M, K] matrix: TMA copies it, a library GEMM multiplies it

    def env(self, stage: GemmStage, idx: str) -> dict[str, int]:
        """Constants the kind's formulas read besides the tiling's: ``CSTEP`` (1: chunks walk along
        the producer's columns)."""
        return {f"CSTEP{idx}": 1}

    def smem_bytes(self, grid: "StageGrid") -> int:
        """Shared memory of a block: the tiling's ring of A and B slabs (and, for persistent blocks, the
        epilogue's output, whose stored width the stage's epilogue sets)."""
        st = grid.stage
        rows = 4 * grid.tiles.bm if norm.has(st) else 0  # a normed tile's row scales (tuner_rs)
        return grid.tiles.smem_bytes(grid.tiles.bn // st.fold, st.n_out, residual.has(st)) + rows

    def tiling_problem(self, grid: "StageGrid") -> str | None:
        """A normed stage's tile computes its rows' scales once, before its mainloop: a persistent block,
        which runs tile after tile, does not."""
        if norm.has(grid.stage) and grid.tiles.persistent:
            return f"stage {grid.stage.name}: a normed stage's tiles are not persistent"
        if rope.has(grid.stage) and grid.tiles.transposed:
            # A transposed tile's thread holds pairs of rows, not of the adjacent columns a rotation turns.
            return f"stage {grid.stage.name}: a rotated stage's tiles are not transposed"
        return None

    def partial_floats(self, grid: "StageGrid") -> int:
        """Workspace floats of one split's partial sums of one tile (split-K): the whole tile."""
        return grid.tiles.bm * grid.tiles.bn

    def b_operand(self, stage: GemmStage) -> tuple[tuple[int, int], float]:
        """The weights' shape ``[N, K]``, and the scale of random test weights (outputs stay near 1)."""
        return (stage.n, stage.k), 1.0 / stage.k ** 0.5

    def block_work(self, grid: "StageGrid") -> tuple[int, int, int]:
        """For the cost model: bytes one block reads (A and B slabs of its split), FLOPs it computes, and
        the bytes of one ring slot of the operand it streams (a weight slab)."""
        t = grid.tiles
        k_elems = grid.ks * t.bk
        return (min(t.bm, grid.stage.m) + t.bn) * k_elems * 2, 2 * t.bm * t.bn * k_elems, t.bn * t.bk * 2

    def reference(self, xp, a, w, stage: GemmStage):
        """float32 ``a @ w.T`` (``a``'s rows normed first where the stage has a norm) before the
        epilogue, for arrays of module ``xp`` (numpy or cupy)."""
        n, r = norm.of(stage), rope.of(stage)
        out = (a if n is None else norm.reference(xp, a, n)) @ w.T
        return out if r is None else rope.reference(xp, out, r)

    def cupy_stage(self, cp, a, w, stage: GemmStage):
        """The stage before its epilogue as a CuPy user writes it (cuBLAS; a rotation in float32)."""
        out = a @ w.T
        r = rope.of(stage)
        return out if r is None else rope.reference(cp, out.astype(cp.float32), r).astype(cp.float16)

    def torch_stage(self, F, h, w, stage: GemmStage):
        """The stage before its epilogue in PyTorch (a rotation with tables made at the first call)."""
        out = F.linear(h, w)
        r = rope.of(stage)
        if r is None:
            return out
        import torch  # noqa: PLC0415 - only where PyTorch runs the baseline

        key = (r, out.shape[0], out.shape[1])
        if key not in _TORCH_TABLES:
            _TORCH_TABLES[key] = rope.torch_tables(torch, out.shape[0], out.shape[1], r, str(out.device))
        return rope.torch(torch, out, r, _TORCH_TABLES[key])

    def check_shapes(self, producer: "StageGrid", consumer: "StageGrid") -> str | None:
        """Why the consumer cannot read the producer's output as its A operand, or None."""
        p, c = producer.stage, consumer.stage
        if c.m != p.m or c.k != p.n_out:
            return (f"{c.name} reads {p.name}'s {p.m}x{p.n_out} output as its {c.m}x{c.k} A operand: "
                    f"the identity index map needs equal shapes")
        return None

    def reads(self, producer: "StageGrid", consumer: "StageGrid") -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The true dependencies, from the index map: per consumer tile row ``m2``, arrays
        ``(s, m1, n1, kc)``: split ``s`` of that row first reads producer tile ``(m1, n1)`` at chunk ``kc``."""
        first = first_read(producer, consumer)  # rows and columns are independent under the identity map
        s_idx, n1_idx = np.nonzero(first != NEVER)
        kcs = first[s_idx, n1_idx]
        bm1, bm2, rows = producer.tiles.bm, consumer.tiles.bm, consumer.stage.m
        out = []
        for m2 in range(consumer.mt):
            lo, hi = m2 * bm2 // bm1, (min(m2 * bm2 + bm2, rows) - 1) // bm1
            m1 = np.repeat(np.arange(lo, hi + 1, dtype=np.int64), s_idx.size)
            k = hi - lo + 1
            out.append((np.tile(s_idx, k), m1, np.tile(n1_idx, k), np.tile(kcs, k)))
        return out

    def chunk_columns(self, consumer: "StageGrid", kc: int) -> str:
        """Which A columns chunk ``kc`` loads, for messages."""
        return f"columns {kc * consumer.tiles.bk}..{min((kc + 1) * consumer.tiles.bk, consumer.stage.k) - 1}"
