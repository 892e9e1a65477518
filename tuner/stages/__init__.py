"""Stage kinds: each one module holding everything that differs between kinds of stage.

A kind module defines its stage (shape, validation, FLOPs and bytes), its **index map** (which
producer elements a consumer tile's K chunk reads, once as formulas for the sync policies and
the kernels, once as arrays for the model checker), the C++ view of its A operand the kernel
template loads through, and its float32 reference. Everything else finds a stage's kind
through :func:`kind_of`.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Union

from . import attention, conv, gemm
from .base import WorkloadError

KINDS: dict[str, ModuleType] = {"gemm": gemm, "conv": conv, "attention": attention}
Stage = Union[gemm.GemmStage, conv.ConvStage, attention.AttentionStage]  # every kind's stage class

__all__ = ["KINDS", "Stage", "WorkloadError", "kind_of"]


def kind_of(stage: Any) -> ModuleType:
    """The module of a stage's kind."""
    return KINDS[stage.kind]
