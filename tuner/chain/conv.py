"""The convolution stage kind: a 3x3 convolution, stride 1, padding 1, NHWC fp16, as an implicit GEMM.

Output pixel ``p = (n, h, w)`` (row-major over batch, height, width) is GEMM row ``p``; output
channel ``o`` is column ``o``; the reduction runs over ``k = tap * C + c`` with ``tap = 3 * dh
+ dw`` and input channel ``c``, so ``M = N*H*W``, ``N = C_out``, ``K = 9 * C_in``. The weights are
stored ``[C_out, 3, 3, C_in]``, i.e. ``[N, K]`` with K contiguous like a GEMM's. The A operand is
never materialized: the kernel loads it through the ``Im2col3x3`` view (``conv.cuh``), reading
input pixel ``p + (dh - 1) * W + (dw - 1)``, and zeros where that falls off the image.

Index map: a convolution that reads an earlier stage's output reads, at chunk ``kc`` (one tap,
since ``C % BK == 0``), the producer rows of its own pixels shifted by the tap's offset, and the
channels ``kc * BK % C ..``: the rows above and below its tile (the halo) included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from .expr import Expr
from .gemm import GemmKind, producer_cols
from .kind import TensorCoreStage, WorkloadError

if TYPE_CHECKING:
    from .tiling import StageGrid

TAPS = 9


@dataclass(frozen=True)
class ConvStage(TensorCoreStage):
    """One 3x3 convolution of a chain, at a concrete size."""

    kind: ClassVar[str] = "conv"
    name: str
    batch: int
    height: int
    width: int
    c_in: int
    c_out: int
    epilogue: str = "relu"
    a_from: int | None = None  # index of the producer stage, or None for an external input

    def __post_init__(self) -> None:
        if min(self.batch, self.height, self.width, self.c_in, self.c_out) < 1:
            raise WorkloadError(f"stage {self.name}: sizes must be positive, got batch={self.batch} "
                                f"{self.height}x{self.width}, channels {self.c_in} -> {self.c_out}")
        if self.c_in % 8:
            # 16-byte pieces of one tap's channels: 8 halves never straddle two taps.
            raise WorkloadError(f"stage {self.name}: {self.c_in} input channels; accepted: a multiple of 8")
        self.check_epilogue(self.name)

    # The implicit GEMM's sizes, which the tiling, the space and the kernels read.
    @property
    def m(self) -> int:
        return self.batch * self.height * self.width

    @property
    def n(self) -> int:
        return self.c_out

    @property
    def k(self) -> int:
        return TAPS * self.c_in

    @property
    def a_shape(self) -> tuple[int, int]:
        """The stored A operand: one row of channels per input pixel."""
        return (self.m, self.c_in)


# The tap of chunk kc, and the producer-row offset it reads at.
_TAP = "(kc * BK2 // C2)"
_OFF = f"({_TAP} // 3 - 1) * W2 + {_TAP} % 3 - 1"
# The index map as formulas in the consumer's names (see tuner.sync.policies.INDEX_MAP_NAMES). The rows of a
# chunk are the tile's own rows shifted by its tap's offset; the tile's rows over all chunks reach
# one image row and one pixel past its own on either side (the halo).
INDEX_MAP: dict[str, Expr] = {
    "A_ANY": Expr("1"), "A_FRESH": Expr("0"),  # a new tap starts at channel 0: A_COL % BN1 == 0 re-waits
    "A_ROW_LO": Expr(f"max(m2 * BM2 + {_OFF}, 0)"),
    "A_ROW_HI": Expr(f"max(min(m2 * BM2 + BM2 - 1 + {_OFF}, M2 - 1), 0)"),
    "A_TILE_LO": Expr("max(m2 * BM2 - W2 - 1, 0)"),
    "A_TILE_HI": Expr("min(m2 * BM2 + BM2 + W2, M2 - 1)"),
    "A_COL": Expr("kc * BK2 % C2"),
    "A_COL_HI": Expr("kc * BK2 % C2 + BK2 - 1"),
}


def im2col(xp, a, stage: ConvStage):
    """The ``[M, 9*C]`` matrix the implicit GEMM reads, materialized (for references and baselines)."""
    img = a.reshape(stage.batch, stage.height, stage.width, stage.c_in)
    pad = xp.zeros((stage.batch, stage.height + 2, stage.width + 2, stage.c_in), dtype=a.dtype)
    pad[:, 1:-1, 1:-1, :] = img
    cols = [pad[:, dh:dh + stage.height, dw:dw + stage.width, :] for dh in range(3) for dw in range(3)]
    return xp.concatenate(cols, axis=3).reshape(stage.m, stage.k)


class ConvKind(GemmKind):
    """The 3x3 convolution: an implicit GEMM, whose tile, shared memory, split-K partials,
    weights and cost-model work are the GEMM's; its A operand is gathered, so its index map, its
    tilings, its reference and its baselines are its own."""

    name = "conv"
    HEADER = "conv.cuh"  # the A operand's view, pasted into sources that hold a convolution
    REGIONS = (INDEX_MAP,)  # the GEMM's tile (TILE_TEMPLATE) and warp split, reading gathered rows
    PADS_ROWS = False  # rows are pixels of images of one size, which the input's shape alone does not tell
    STORED_A = False  # A is gathered from the image (im2col), never stored
    MIN_CASE_ROWS = 64  # the cases' 16-row tiles are the GEMMs' for a few tokens; pixels come in images

    def env(self, stage: ConvStage, idx: str) -> dict[str, int]:
        """Constants the index map reads: the image width, the input channels and the pixel count;
        ``CSTEP`` 1: chunks walk along the producer's columns (channels)."""
        return {f"W{idx}": stage.width, f"C{idx}": stage.c_in, f"M{idx}": stage.m, f"CSTEP{idx}": 1}

    def tiling_problem(self, grid: "StageGrid") -> str | None:
        """Why this tiling cannot compute the convolution, or None."""
        t, st = grid.tiles, grid.stage
        if st.c_in % t.bk:
            return f"a K chunk must hold one tap: {st.c_in} input channels are not a multiple of BK={t.bk}"
        if t.tma:
            return "the gathered A operand is loaded by cp.async; the TMA copies plain matrices"
        return None

    def a_arg(self, stage: ConvStage) -> str:
        """The A operand the kernel's mainloop reads (``A`` is the input pointer)."""
        return f"Im2col3x3<{stage.height}, {stage.width}, {stage.c_in}>{{A}}"

    def reference(self, xp, a, w, stage: ConvStage):
        """float32 convolution before the epilogue, for arrays of module ``xp`` (numpy or cupy)."""
        return im2col(xp, a, stage) @ w.T

    def cupy_stage(self, cp, a, w, stage: ConvStage):
        """The stage before its epilogue as a CuPy user writes it: im2col, then one cuBLAS GEMM."""
        return im2col(cp, a, stage) @ w.T

    def torch_input(self, torch, x, stage: ConvStage):
        """The input as an NCHW tensor in channels-last memory (a view of our NHWC buffer, no copy)."""
        return x.view(stage.batch, stage.height, stage.width, stage.c_in).permute(0, 3, 1, 2)

    def torch_weight(self, torch, w, stage: ConvStage):
        """The weight as ``[C_out, C_in, 3, 3]`` in channels-last memory (a view, no copy)."""
        return w.view(stage.c_out, 3, 3, stage.c_in).permute(0, 3, 1, 2)

    def torch_stage(self, F, h, w, stage: ConvStage):
        """The convolution before its epilogue in PyTorch (cuDNN)."""
        return F.conv2d(h, w, padding=1)

    def torch_output(self, h, stage: ConvStage):
        """PyTorch's NCHW channels-last output as our ``[pixels, channels]`` matrix."""
        return h.permute(0, 2, 3, 1).reshape(stage.m, -1)

    def check_shapes(self, producer: "StageGrid", consumer: "StageGrid") -> str | None:
        """Why the consumer cannot read the producer's output as its input image, or None."""
        p, c = producer.stage, consumer.stage
        if c.m != p.m or c.c_in != p.n_out:
            return (f"{c.name} reads {p.name}'s {p.m}x{p.n_out} output as its {c.batch}x{c.height}x{c.width} image "
                    f"of {c.c_in} channels: the pixel counts and channels must agree")
        return None

    def reads(self, producer: "StageGrid", consumer: "StageGrid") -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The true dependencies, from the index map: per consumer tile row ``m2``, arrays ``(s, m1, n1, kc)``:
        split ``s`` of that row first reads producer tile ``(m1, n1)`` at chunk ``kc``. Exact: a tap's
        pixels that fall off the image (padding) read nothing."""
        st, bm2, bk = consumer.stage, consumer.tiles.bm, consumer.tiles.bk
        H, W, C, M = st.height, st.width, st.c_in, st.m
        bm1 = producer.tiles.bm
        kcs = np.arange(consumer.kc, dtype=np.int64)
        tap, c0 = kcs * bk // C, kcs * bk % C
        split = consumer.split_of(kcs)
        lo, hi = producer_cols(producer)
        # Producer tile columns each chunk reads: the channels [c0, c0 + bk).
        chunk_n1 = [np.flatnonzero((lo < c + bk) & (hi > c)) for c in c0.tolist()]
        out = []
        for m2 in range(consumer.mt):
            p = np.arange(m2 * bm2, min((m2 + 1) * bm2, M), dtype=np.int64)
            h, w = (p // W) % H, p % W
            rows_of_tap = []
            for t in range(TAPS):
                dh, dw = t // 3 - 1, t % 3 - 1
                ok = (h + dh >= 0) & (h + dh < H) & (w + dw >= 0) & (w + dw < W)
                rows_of_tap.append(np.unique((p[ok] + dh * W + dw) // bm1))
            parts = [(np.full(m1.size * n1.size, split[k]), np.repeat(m1, n1.size), np.tile(n1, m1.size),
                      np.full(m1.size * n1.size, k))
                     for k in range(consumer.kc) for m1 in (rows_of_tap[tap[k]],) for n1 in (chunk_n1[k],)]
            s_, m1_, n1_, k_ = (np.concatenate([x[j] for x in parts]) if parts else np.zeros(0, np.int64)
                                for j in range(4))
            # The first chunk per (split, producer tile): chunks are listed in order.
            key = (s_ * producer.mt + m1_) * producer.nt + n1_
            _, first = np.unique(key, return_index=True)
            out.append((s_[first], m1_[first], n1_[first], k_[first]))
        return out

    def chunk_columns(self, consumer: "StageGrid", kc: int) -> str:
        """Which part of the reduction chunk ``kc`` loads, for messages."""
        st, bk = consumer.stage, consumer.tiles.bk
        tap, c0 = kc * bk // st.c_in, kc * bk % st.c_in
        return f"tap ({tap // 3 - 1:+d}, {tap % 3 - 1:+d}), channels {c0}..{min(c0 + bk, st.c_in) - 1}"
