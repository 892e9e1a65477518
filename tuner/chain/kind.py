"""What every stage kind shares: the interface a kind implements, and the sizes of a tensor-core stage."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .epilogues import EPILOGUES

if TYPE_CHECKING:
    from .expr import Expr
    from .tiling import StageGrid, StageTiles


class WorkloadError(ValueError):
    """A workload name or size the user gave is not usable."""


class TensorCoreStage:
    """Sizes derived for a stage computed as an ``M x N x K`` product on tensor cores (a GEMM, an
    implicit-GEMM convolution): the class defines ``m``, ``n``, ``k``, ``a_shape`` and ``epilogue``."""

    m: int
    n: int
    k: int
    epilogue: str
    a_shape: tuple[int, int]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def weight_bytes(self) -> int:
        return self.n * self.k * 2

    @property
    def input_bytes(self) -> int:
        """The stored A operand read once."""
        return self.a_shape[0] * self.a_shape[1] * 2

    @property
    def output_bytes(self) -> int:
        return self.m * self.n_out * 2

    @property
    def fold(self) -> int:
        """Accumulator columns per stored column (see :mod:`tuner.chain.epilogues`)."""
        return EPILOGUES[self.epilogue].fold

    @property
    def n_out(self) -> int:
        """Columns of the stored output: a folding epilogue (SwiGLU) makes one of each column pair."""
        return self.n // self.fold

    def check_epilogue(self, name: str) -> None:
        """Refuse an unknown epilogue, or one whose fold does not divide N."""
        if self.epilogue not in EPILOGUES:
            raise WorkloadError(f"stage {name}: unknown epilogue {self.epilogue!r}; accepted: {', '.join(EPILOGUES)}")
        fold = EPILOGUES[self.epilogue].fold
        if self.n % fold:
            raise WorkloadError(f"stage {name}: the {self.epilogue} epilogue folds {fold} accumulator columns "
                                f"into one, so N must be a multiple of {fold}, got {self.n}")


class StageKind:
    """The interface every stage kind implements: one subclass per kind (in the kind's own module),
    one instance of it in :data:`tuner.chain.kinds.KINDS`, found for a stage by ``kind_of``.

    A kind says what differs between kinds of stage, and nothing else branches on kind:

    - its **index map**: which producer elements a consumer tile's K chunk reads, once as formulas
      per region (``REGIONS``, :meth:`regions`) for the sync policies and the kernels, once as arrays (:meth:`reads`)
      for the model checker; ``PER_COLUMN`` where they depend on the tile's column;
    - its tile in the kernel template (``TILE_TEMPLATE``, ``HEADER``, :meth:`a_arg`,
      :meth:`template_constants`, :meth:`smem_bytes`, :meth:`partial_floats`) and the tilings it
      cannot run (:meth:`tiling_problem`; ``OWN_WARP_TILE`` where it judges its warps' tile itself
      instead of the shared split of ``BM x BN``);
    - its second operand (:meth:`b_operand`: weights, or an attention's KV cache), its work for the
      cost model (:meth:`block_work`, :meth:`heads_per_tile`);
    - its float32 reference, its CuPy and PyTorch baselines; whether fewer rows run zero-padded
      (``PADS_ROWS``); whether its A operand is a stored matrix that TMA copies and a library
      GEMM multiplies (``STORED_A``).
    """

    name: ClassVar[str]
    HEADER: ClassVar[str | None] = None  # the kind's own kernel header, beside the shared ones
    TILE_TEMPLATE: ClassVar[str]
    REGIONS: ClassVar[tuple[dict[str, "Expr"], ...]]
    PER_COLUMN: ClassVar[bool] = False
    OWN_WARP_TILE: ClassVar[bool] = False
    PADS_ROWS: ClassVar[bool] = True
    STORED_A: ClassVar[bool] = False
    MIN_CASE_ROWS: ClassVar[int] = 16  # the fewest rows of a hand-picked tile (tuner.search.cases)

    def __repr__(self) -> str:
        return f"<stage kind {self.name}>"

    def env(self, stage: Any, idx: str) -> dict[str, int]:
        """Constants the kind's formulas read besides the tiling's, suffixed by ``idx``."""
        raise NotImplementedError

    def regions(self, stage: Any) -> tuple[dict[str, "Expr"], ...]:
        """The index map's regions for this stage (``REGIONS``, unless a stage's form reads otherwise)."""
        return self.REGIONS

    def tiling_problem(self, grid: "StageGrid") -> str | None:
        """Why this tiling cannot compute the stage, beyond the constraints every kind shares."""
        return None

    def pads_rows(self, stage: Any) -> bool:
        """Whether this stage computes fewer rows right zero-padded to its own count (``PADS_ROWS``)."""
        return self.PADS_ROWS

    def heads_per_tile(self, grid: "StageGrid") -> int:
        """How many heads a tile packs side by side in its ``BN`` columns (1: the columns are columns)."""
        return 1

    def case_tiles(self, stage: Any, shared: "StageTiles", pack: bool) -> "StageTiles":
        """The tiling of this stage in a hand-picked config whose tensor-core stages take ``shared``
        (``pack``: where the kind can, its packed form)."""
        return shared

    def smem_bytes(self, grid: "StageGrid") -> int:
        raise NotImplementedError

    def partial_floats(self, grid: "StageGrid") -> int:
        """Workspace floats of one split's partial result of one tile."""
        raise NotImplementedError

    def b_operand(self, stage: Any) -> tuple[tuple[int, int], float]:
        """The second operand's shape and the scale of random test entries."""
        raise NotImplementedError

    def b_written(self, xp: Any, w: Any, stage: Any) -> Any:
        """The part of the second operand the stage writes (an attention's cache append), or None."""
        return None

    def b_expected(self, xp: Any, a: Any, stage: Any) -> Any:
        """What :meth:`b_written` holds after a run, in float32, from the stage's float32 input ``a``."""
        raise NotImplementedError

    def block_work(self, grid: "StageGrid") -> tuple[int, int, int]:
        """Bytes one block reads, FLOPs it computes, bytes of one ring slot (for the cost model)."""
        raise NotImplementedError

    def template_constants(self, stage: Any) -> dict[str, object]:
        """What the kernel template reads of the stage besides its sizes and tiling."""
        return {}

    def a_arg(self, stage: Any) -> str:
        """The A operand the kernel's mainloop reads."""
        return "A"

    def reference(self, xp: Any, a: Any, w: Any, stage: Any) -> Any:
        """float32 output before the epilogue, for arrays of module ``xp`` (numpy or cupy)."""
        raise NotImplementedError

    def cupy_stage(self, cp: Any, a: Any, w: Any, stage: Any) -> Any:
        raise NotImplementedError

    def torch_input(self, torch: Any, x: Any, stage: Any) -> Any:
        """The chain's input as a PyTorch model holds it."""
        return x

    def torch_weight(self, torch: Any, w: Any, stage: Any) -> Any:
        """The stage's second operand as a PyTorch model holds it."""
        return w

    def torch_stage(self, F: Any, h: Any, w: Any, stage: Any) -> Any:
        raise NotImplementedError

    def torch_output(self, h: Any, stage: Any) -> Any:
        """PyTorch's output as our ``[M, N_out]`` matrix."""
        return h

    def check_shapes(self, producer: "StageGrid", consumer: "StageGrid") -> str | None:
        """Why the consumer cannot read the producer's output, or None."""
        raise NotImplementedError

    def reads(self, producer: "StageGrid", consumer: "StageGrid") -> list[tuple[Any, Any, Any, Any]]:
        """Per consumer tile row, arrays ``(s, m1, n1, kc)``: split ``s`` first reads producer tile
        ``(m1, n1)`` at chunk ``kc``."""
        raise NotImplementedError

    def chunk_columns(self, consumer: "StageGrid", kc: int) -> str:
        """Which A columns chunk ``kc`` loads, for messages."""
        raise NotImplementedError
