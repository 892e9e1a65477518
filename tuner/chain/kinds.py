"""Stage kinds: each one module holding everything that differs between kinds of stage.

A kind module defines its stage (shape, validation, FLOPs and bytes), its **index map** (which
producer elements a consumer tile's K chunk reads: once as formulas per region, ``REGIONS``,
for the sync policies and the kernels, once as arrays, ``reads``, for the model checker;
``PER_COLUMN`` where they depend on the tile's column), its tile in the kernel template
(``TILE_TEMPLATE``, ``HEADER``, ``a_arg``, ``smem_bytes``, ``partial_floats``), its second
operand (``b_operand``: weights, or an attention's KV cache), its cost-model work
(``block_work``), its float32 reference and its CuPy and PyTorch baselines, whether fewer
rows run padded (``PADS_ROWS``), and whether its tiling problem judges its warps' tile itself
(``OWN_WARP_TILE``) instead of the shared split of ``BM x BN`` among warps. Everything else
finds a stage's kind through :func:`kind_of`.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Union

from . import attention, conv, gemm
from .kind import WorkloadError

KINDS: dict[str, ModuleType] = {"gemm": gemm, "conv": conv, "attention": attention}
Stage = Union[gemm.GemmStage, conv.ConvStage, attention.AttentionStage]  # every kind's stage class

__all__ = ["KINDS", "Stage", "WorkloadError", "kind_of"]


def kind_of(stage: Any) -> ModuleType:
    """The module of a stage's kind."""
    return KINDS[stage.kind]
