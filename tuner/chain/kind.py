"""What every stage kind shares."""
from __future__ import annotations

from .epilogues import EPILOGUES


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
