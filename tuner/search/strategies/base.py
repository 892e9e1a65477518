"""The interface every search strategy implements, and what the study loop hands it.

A strategy proposes batches of measurements and observes their outcomes. A proposal is
either a whole chain config or one stage's tiling timed alone; the study loop measures it
(or answers it from the study's history), stores it as an Optuna trial and tells the
strategy. Proposals must be feasible: the loop refuses, without storing anything, a
proposal that breaks a hard constraint or that the sync checker rejects.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ...chain.workloads import Chain
from ...config import Config, StageGrid, StageTiles
from ...device import DeviceInfo
from ..feasible import FeasibleSet

# A stage timed alone runs in column order: the same as row order when the stage is one wave,
# and the faster one when it is several (a wave then covers every M row of a few N columns and
# reads each weight slab once; the figures: studies/notes/design-figures.md).
STAGE_ALONE = ("stream", "col", "block", "serial", "none")


def stage_config(tiles: StageTiles) -> Config:
    """The single-stage config that times ``tiles`` alone."""
    return Config((tiles,), *STAGE_ALONE)


@dataclass(frozen=True)
class Proposal:
    """One measurement a strategy asks for: ``config`` of the whole chain, or of stage ``stage`` alone."""

    config: Config
    phase: str
    stage: int | None = None
    screen: bool = False  # a screening timing: fewer repetitions, good enough to rank tilings

    @property
    def tiles(self) -> StageTiles:
        return self.config.tiles[0]


@dataclass(frozen=True)
class Outcome:
    """What became of a proposal: its median µs, or None when it failed (``reason`` says why)."""

    proposal: Proposal
    us: float | None
    reason: str | None = None
    new: bool = True  # False when the study's history answered it


@dataclass
class Prior:
    """Configs known to be good before the search starts: a bench's picks, the nearest sizes' bests."""

    chain: list[Config] = field(default_factory=list)  # whole-chain configs, best first
    stages: list[list[StageTiles]] = field(default_factory=list)  # per stage, tilings best first


@dataclass
class SearchContext:
    """Everything a strategy may use: the chain, its feasible set, the checker, the budget."""

    chain: Chain
    feasible: FeasibleSet
    device: DeviceInfo
    accept: Callable[[Config], bool]  # the sync checker's verdict on a whole-chain config
    budget: int  # measured trials, stage and chain together
    seed: int = 0
    prior: Prior = field(default_factory=Prior)
    stage_tilings: Sequence[Sequence[StageGrid]] = ()  # per stage, the tilings that may be timed alone

    def usable(self, config: Config) -> bool:
        """Whether the loop will measure ``config``: inside the feasible set and accepted by the checker."""
        return self.feasible.contains(config) is None and self.accept(config)


class Strategy(ABC):
    """Proposes batches of measurements; hears their outcomes. One instance per study run."""

    name: str = "abstract"
    stage_pass: bool = False  # whether it times stages alone (in studies of their own)

    def start(self, ctx: SearchContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def propose(self, left: int) -> list[Proposal]:
        """The next batch, at most ``left`` proposals that are not yet known; empty when done."""

    def observe(self, outcomes: Iterable[Outcome]) -> None:
        """The outcomes of the last batch, in its order."""

    def phase(self) -> str:
        """The phase the next batch belongs to, for the progress bar."""
        return "search"


def opening(ctx: SearchContext) -> list[Config]:
    """The configs every study measures first: a stream-policy baseline leads, so the study always
    holds one, then the prior's configs (a bench's picks, the nearest sizes' bests)."""
    prior = [c for c in ctx.prior.chain if ctx.usable(c)]
    streams = [c for c in prior if c.policy == "stream"]
    lead = streams[:1] or [c for c in ctx.feasible.baselines() if ctx.accept(c)][:1]
    out: list[Config] = []
    for c in [*lead, *prior, *ctx.feasible.baselines()]:
        if c not in out and ctx.usable(c):
            out.append(c)
    return out


class WholeChainStrategy(Strategy):
    """A strategy that proposes whole-chain configs only, one batch at a time, never one twice."""

    batch = 1

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self.seen: set[Config] = set()
        self._opening = opening(ctx)
        self._opened = set(self._opening)

    def first_usable(self, walk: Iterable[Config]) -> Config | None:
        """The next config of ``walk`` not yet seen that the checker accepts (None at its end)."""
        return next((c for c in walk if c not in self.seen and self.ctx.accept(c)), None)

    @abstractmethod
    def draw(self) -> Config | None:
        """A usable config not in ``self.seen``; None when the strategy has none left."""

    def propose(self, left: int) -> list[Proposal]:
        out = []
        while len(out) < min(self.batch, max(left, 1)):
            c = self._opening.pop(0) if self._opening else self.draw()
            if c is None:
                break
            if c in self.seen:
                continue
            self.seen.add(c)
            out.append(Proposal(c, "opening" if c in self._opened else self.name))
        return out

    def phase(self) -> str:
        return "opening" if self._opening else self.name
