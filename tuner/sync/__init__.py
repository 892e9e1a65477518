"""How stages synchronize: the one definition of each sync policy, tile order, dispatch and launch mode
(:mod:`.policies`) and of the L2 prefetch choice (:mod:`.prefetch`). The checker proves them; the
kernels are rendered from the same formulas.
"""
from .policies import DISPATCHES, LAUNCHES, ORDERS, POLICIES, STREAM_ORDERED, SyncPolicy, TileOrder
from .prefetch import PREFETCHES

__all__ = ["DISPATCHES", "LAUNCHES", "ORDERS", "POLICIES", "PREFETCHES", "STREAM_ORDERED", "SyncPolicy", "TileOrder"]
