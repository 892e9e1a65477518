"""Search strategies: each proposes feasible measurements and observes their outcomes.

``staged`` (the default) times stages alone, pairs their fastest tilings under every sync
choice, then refines around the best chains; ``tpe``, ``random`` and ``grid`` search the
joint space of whole-chain configs. The study loop (:mod:`tuner.study.loop`) runs any of them.
"""
from __future__ import annotations

from .base import STAGE_ALONE, Outcome, Prior, Proposal, SearchContext, Strategy, stage_config
from .grid import GridSearch
from .random_search import RandomSearch
from .staged import Staged
from .tpe import TPESearch

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Staged, TPESearch, RandomSearch, GridSearch)}
DEFAULT = "staged"

__all__ = ["DEFAULT", "STAGE_ALONE", "STRATEGIES", "Outcome", "Prior", "Proposal", "SearchContext", "Strategy",
           "make", "stage_config"]


def make(name: str) -> Strategy:
    """A fresh strategy called ``name``."""
    return STRATEGIES[name]()
