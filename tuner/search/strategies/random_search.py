"""``random``: feasible configs drawn uniformly (the constraint solver samples the set exactly)."""
from __future__ import annotations

import numpy as np

from ...config import Config
from .base import SearchContext, WholeChainStrategy

MISSES = 1000  # draws that hit seen or refused configs in a row before the rest of the set is walked in order


class RandomSearch(WholeChainStrategy):
    name = "random"
    batch = 4

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self.rng = np.random.default_rng(ctx.seed)
        self._walk = None

    def draw(self) -> Config | None:
        fs = self.ctx.feasible
        if self._walk is None:
            for _ in range(MISSES):
                c = fs.sample(self.rng)
                if c not in self.seen and self.ctx.accept(c):
                    return c
            self._walk = fs.grid(self.ctx.seed)  # nearly everything seen: finish the set in grid order
        return self.first_usable(self._walk)
