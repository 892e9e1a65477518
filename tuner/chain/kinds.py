"""The registry of stage kinds: every kind, by name, and the kind of a stage.

A kind is one module (:mod:`.gemm`, :mod:`.conv`, :mod:`.attention`) holding its stage class and
its :class:`~tuner.chain.kind.StageKind`; a new kind is its own module and one entry here.
"""
from __future__ import annotations

from typing import Any, Union

from .attention import AttentionKind, AttentionStage
from .conv import ConvKind, ConvStage
from .gemm import GemmKind, GemmStage
from .kind import StageKind, WorkloadError

KINDS: dict[str, StageKind] = {k.name: k for k in (GemmKind(), ConvKind(), AttentionKind())}
Stage = Union[GemmStage, ConvStage, AttentionStage]  # every built-in kind's stage class

__all__ = ["KINDS", "Stage", "StageKind", "WorkloadError", "kind_of"]


def kind_of(stage: Any) -> StageKind:
    """The kind of a stage."""
    try:
        return KINDS[stage.kind]
    except KeyError:
        raise WorkloadError(f"stage {stage.name}: unknown stage kind {stage.kind!r}; "
                            f"accepted: {', '.join(KINDS)}") from None
