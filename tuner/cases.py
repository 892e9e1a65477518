"""Hand-picked configs that cover every policy x order x dispatch x launch mode.

Used by the GPU tests, the CPU compile test and ``bench`` (as the seed set before
tuning); each is a valid point of the default search space for the chain it is made for.
"""
from __future__ import annotations

from itertools import product

from .config import Config, StageTiles
from .sync import DISPATCHES, LAUNCHES, ORDERS, POLICIES, launch_allowed
from .workloads import Chain


def combos() -> list[tuple[str, str, str, str]]:
    """Every allowed (policy, order, dispatch, launch)."""
    return [(p, o, d, l) for p, o, d, l in product(POLICIES, ORDERS, DISPATCHES, LAUNCHES)
            if launch_allowed(p, l, d) is None]


def tiles_for(chain: Chain, split: tuple[int, int] = (1, 1), mma: str = "sync") -> tuple[StageTiles, ...]:
    """A reasonable tiling for the chain's token count: short tiles at small M."""
    m = chain.stages[0].m
    if mma != "sync":
        wm = 1 if m <= 64 else 2
        return tuple(StageTiles(64 * wm, 128, 64, wm, 1, 4, s, mma) for s in split)
    if m <= 16:
        return (StageTiles(16, 128, 64, 1, 4, 4, split[0]), StageTiles(16, 128, 64, 1, 4, 4, split[1]))
    if m <= 64:
        return (StageTiles(64, 128, 32, 2, 2, 4, split[0]), StageTiles(64, 128, 32, 2, 2, 4, split[1]))
    return (StageTiles(128, 128, 32, 2, 2, 4, split[0]), StageTiles(64, 128, 32, 2, 2, 4, split[1]))


def coverage(chain: Chain, mma: str = "sync") -> list[Config]:
    """One config per allowed combination, alternating split-K and uneven M tiles across them."""
    out = []
    for i, (p, o, d, l) in enumerate(combos()):
        split = (2, 2) if i % 3 == 1 else (1, 1)
        out.append(Config(tiles_for(chain, split, mma), p, o, d, l))
    return out
