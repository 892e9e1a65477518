"""``grid``: every feasible config once, in a shuffled order fixed by the seed."""
from __future__ import annotations

from ...config import Config
from .base import SearchContext, WholeChainStrategy


class GridSearch(WholeChainStrategy):
    name = "grid"
    batch = 4

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self._walk = ctx.feasible.grid(ctx.seed)

    def draw(self) -> Config | None:
        return self.first_usable(self._walk)
