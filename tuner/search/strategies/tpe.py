"""``tpe``: Optuna's TPE sampler over the whole joint space, kept inside the feasible set.

TPE runs on an in-memory Optuna study of its own. A suggestion outside the feasible set (or
that the checker refuses, or that was measured already) is replaced by the closest usable
config not yet seen, and TPE is told the time of what was measured under that config's
parameters: it learns from the measured neighbour, and no refused suggestion reaches the
study's storage.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ...config import Config
from .base import Outcome, Proposal, SearchContext, WholeChainStrategy


class TPESearch(WholeChainStrategy):
    name = "tpe"
    batch = 1  # TPE conditions each suggestion on every outcome before it

    def start(self, ctx: SearchContext) -> None:
        import optuna  # noqa: PLC0415 - slow import
        from optuna.distributions import CategoricalDistribution  # noqa: PLC0415

        super().start(ctx)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.names = ctx.chain.stage_names
        self.domains = ctx.feasible.domains()
        self.dists = {k: CategoricalDistribution(v) for k, v in self.domains.items()}
        self.mem = optuna.create_study(direction="minimize",
                                       sampler=optuna.samplers.TPESampler(seed=ctx.seed, n_startup_trials=10))
        self.rng = np.random.default_rng([ctx.seed, 7])

    def continue_after(self, measured: dict[Config, float | None]) -> None:
        """Start from another strategy's chains instead of the opening: none proposed again, all learnt."""
        self._opening = []
        self.seen |= set(measured)
        self.observe(Outcome(Proposal(c, "history"), us) for c, us in measured.items())

    def draw(self) -> Config | None:
        from optuna.trial import TrialState  # noqa: PLC0415

        t = self.mem.ask()
        cfg = Config.from_params({p: t.suggest_categorical(p, ch) for p, ch in self.domains.items()}, self.names)
        self.mem.tell(t, state=TrialState.FAIL)  # what it proposed is not what is measured: see observe
        if cfg not in self.seen and self.ctx.usable(cfg):
            return cfg
        fs = self.ctx.feasible
        usable = lambda c: self.ctx.accept(c)  # noqa: E731 - nearest() only offers feasible configs
        near = fs.nearest(cfg, self.seen, usable)
        if near is not None:
            return near
        for _ in range(200):
            c = fs.sample(self.rng)
            if c not in self.seen and usable(c):
                return c
        return None

    def observe(self, outcomes: Iterable[Outcome]) -> None:
        import optuna  # noqa: PLC0415
        from optuna.trial import TrialState  # noqa: PLC0415

        for o in outcomes:
            if o.proposal.stage is not None:
                continue
            params = o.proposal.config.params(self.names)
            if set(params) != set(self.dists) or any(v not in self.dists[k].choices for k, v in params.items()):
                continue
            ok = o.us is not None
            self.mem.add_trial(optuna.trial.create_trial(
                params=params, distributions=self.dists, value=o.us if ok else None,
                state=TrialState.COMPLETE if ok else TrialState.FAIL))
