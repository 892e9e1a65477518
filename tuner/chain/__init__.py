"""What is tuned: a chain of stages, each of a kind, and everything a stage is made of.

- :mod:`.workloads`: the built-in workloads and their sizes; :class:`Chain`, a chain at one size.
- :mod:`.kinds`: the stage kinds (:mod:`.gemm`, :mod:`.conv`, :mod:`.attention`), each one module,
  found through :func:`kind_of`; :mod:`.kind` holds what every kind shares.
- :mod:`.epilogues`: what a stage does to its accumulators before it stores them.
- :mod:`.tiling`: how a stage is cut into block tiles; :mod:`.expr`: index formulas, written once.
"""
from .kinds import KINDS, Stage, WorkloadError, kind_of
from .workloads import WORKLOADS, Chain, Workload, get_workload

__all__ = ["KINDS", "WORKLOADS", "Chain", "Stage", "Workload", "WorkloadError", "get_workload", "kind_of"]
