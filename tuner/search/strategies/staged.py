"""``staged`` (the default): the structure of a chain, exploited.

1. **Stage pass.** Each stage is timed alone (its own Optuna study; stages that compute the
   same thing alone, like VGG's four convolutions, once for all), over the feasible
   tilings ranked first by the cost model, corrected by its fit to recorded stage timings
   (:func:`tuner.search.cost_model.rank_seconds`). No model ranks tile shapes well enough to skip timing
   them, so every shape gets a turn: first a probe of the best few shapes of every MMA instruction
   (8 each, fewer where four instructions share the probe's 24; the first three of each, then the
   rest only for the instructions whose first three came within :data:`LIVE_PROBE` of the best),
   then more shapes of the instructions whose probe came within :data:`LIVE_KIND` of the
   best, each shape with its two best pipeline/split variants, then the fastest tilings again
   in thread-block clusters, then the fastest (clustered or not, and plain) again with
   persistent blocks (where the stage has more tiles than SMs), with and without the partial last
   wave split along K, and the ring variants of the fastest persistent one. A stage dominates
   the chain's time and its best tiling barely depends on the sync choice, so this is where
   most of the budget goes, though never the last
   :data:`CHAIN_RESERVE` of it (a small budget cuts the probe, the stages and each stage's
   instructions taking turns, and the follow-ups).
2. **Chain pass.** The fastest tilings of each stage, paired in the order of their summed
   stage times, under every policy and launch the space holds and the checker accepts, each in
   the tile order that suits its policy (:func:`preferred_order`). Right after the fastest
   pairing, under the sync choices that served it best: that pairing with one stage's tiling
   swapped for the fastest of another MMA instruction that came within :data:`LIVE_KIND` of it
   alone. The fastest tiling alone is not always the fastest in the chain (at LLaMA decode a
   64-row TMA tile of the QKV projection was faster alone and an 8-row transposed one faster in
   the chain), and the pairings by summed time would reach the other instruction only after
   many of the first's. Then the fastest pairing in the other tile orders, where the rule of
   thumb may be wrong.
3. **Refinement.** A neighbourhood search around the best chains measured: one stage's
   tiling swapped for another fast one, for a tiling one field away or for its ring in chunks
   half or twice as deep (:func:`ring_variants`), or another sync
   choice; candidates ranked by the parent's time corrected by the stage times measured
   alone. Where no neighbour of the best chains is left untried, a batch of TPE over the
   joint space (told every chain measured) explores further, and the neighbourhood of
   whatever it finds comes next, until the budget is spent.

The finalists (the fastest few of each kind timed again in interleaved rounds) are the
study loop's, for every strategy. Every proposal is feasible and checker-accepted, and the
plan depends only on the budget and the outcomes, so a rerun of a finished study proposes
only what its history already answers.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Iterable

from ...config import TILE_FIELDS, Config, StageTiles
from ...sync.policies import ORDERS
from ..cost_model import rank_seconds
from .base import STAGE_ALONE, Outcome, Proposal, SearchContext, Strategy, opening, stage_config

STAGE_SHARE = 0.5  # of the budget, for the stage pass (all stages together)
CHAIN_SHARE = 0.3  # for the chain pass; refinement gets the rest
CHAIN_RESERVE = 0.2  # of the budget, never spent on the stage pass: the follow-ups below have
# fixed sizes, and 60 trials of llama at 200 tokens all went to stages alone, leaving no chain
PROBE = 8  # model-best shapes per MMA instruction in the probe, at most
PROBE_SHAPES = 24  # per stage, shared among its MMA instructions: a fourth instruction (the
# transposed TMA tile) took the stage pass past its share, and the chain pass of llama at 320
# tokens got 13 of 100 trials
PROBE_FIRST = 3  # of those, probed first; the rest only for instructions within LIVE_PROBE of the best
LIVE_PROBE = 1.25  # looser than LIVE_KIND: three shapes say less of an instruction than the whole probe.
# Recorded stage times put mma.sync at 1.35-2.7 times the best from 128 tokens on, and wgmma without
# TMA at 1.2-1.5 at llama 200-1100: six shapes of each took a quarter of a stage's probe
PER_SHAPE = 2  # pipeline/split variants per tile shape, the model's best
RING_TOP = 2  # fastest probed tilings per stage whose ring variants (ring_variants) are timed
# too: the model ranks neighbouring depths within a hair of each other, and at gpt3 256 and 2048
# tokens it had two variants of the best shape timed that both missed the faster depth
LIVE_KIND = 1.10  # an instruction whose probe's best is within this of the best probe gets more shapes
TOP_PER_STAGE = 3  # fastest tilings per stage that the chain pass pairs
FIT_PAIRINGS = 256  # pairings, fastest first, searched for one a sync choice accepts where the fastest breaks it
ALT_COMBOS = 2  # sync choices, the best for the fastest pairing, under which its instruction swaps are tried
CLUSTER_TOP = 3  # fastest tilings per stage tried again in clusters
CLUSTERS = ((2, 1), (1, 2))
PERSIST_TOP = 3  # fastest tilings per stage, clustered or not and plain, tried again with persistent blocks
PARENTS = 4  # best chains whose neighbours refinement tries
SWAP_TOP = 8  # fastest stage tilings a neighbour may swap in
REFINE_BATCH = 8
EXPLORE_BATCH = 8  # TPE proposals per batch once the neighbourhood is exhausted


def _shape(t: StageTiles) -> tuple:
    return (t.mma, t.bm, t.bn, t.bk, t.wm, t.wn)


def _plain(t: StageTiles) -> bool:
    """Without a cluster or persistent blocks: what the probe times first, and what every sync
    choice takes (clusters and persistent blocks rule out ticket dispatch and the fused launch)."""
    return t.cluster == 1 and not t.persistent


def ring_variants(t: StageTiles) -> list[StageTiles]:
    """The rings timed beside one of a stage's fastest probed tilings: one slot shorter and one
    longer, and the same bytes in flight in chunks half and twice as deep. The probe's variants
    of a shape differ in depth or chunk, rarely in both, and the fastest ring can need both
    (studies/notes/design-figures.md)."""
    return [replace(t, stages=t.stages - 1), replace(t, stages=t.stages + 1),
            replace(t, bk=t.bk // 2, stages=t.stages * 2), replace(t, bk=t.bk * 2, stages=t.stages // 2)]


def preferred_order(policy: str) -> str:
    """The tile order a chain is paired in first under ``policy``. Where kernel boundaries order
    the stages (the stream policy), the stage pass's own (:data:`STAGE_ALONE`: column order, in
    which a wave of several M rows reads each weight slab once; studies/notes/design-figures.md
    has the figures). Under a sync policy,
    row order: a producer completes its rows, what consumers wait for, one after another."""
    return STAGE_ALONE[1] if policy == "stream" else "row"


def core_combos(combos: Iterable[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """One global combination per (policy, launch, prefetch), stream first, in the policy's
    preferred tile order and block dispatch: pairing every order and dispatch with every tiling
    left the chain pass one or two pairings (the fastest pairing is tried in the other orders
    next, and refinement tries the rest on the best chains)."""
    best: dict[tuple[str, ...], tuple[str, ...]] = {}
    for c in sorted(combos, key=lambda c: (c[1] != preferred_order(c[0]), c[2] != "block", c)):
        best.setdefault((c[0], c[3], c[4]), c)
    return sorted(best.values(), key=lambda c: (c[0] != "stream", c[4] != "none", c[3] != "serial"))


def other_orders(combo: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``combo`` in every other tile order."""
    return [(combo[0], o, *combo[2:]) for o in ORDERS if o != combo[1]]


class Staged(Strategy):
    name = "staged"
    stage_pass = True

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        n = len(ctx.chain.stages)
        self.n = n
        # Stages that compute the same thing when timed alone (VGG's four convolutions) share one
        # stage pass: the first of them is timed, the others read its times.
        alone = [replace(st, name="", a_from=None) for st in ctx.chain.stages]
        self.twin_of = [alone.index(a) for a in alone]
        self.timed = sorted(set(self.twin_of))
        shared: dict[int, dict[StageTiles, float | None]] = {j: {} for j in self.timed}
        self.alone: list[dict[StageTiles, float | None]] = [shared[self.twin_of[j]] for j in range(n)]
        self.times: dict[Config, float | None] = {}
        self.stage_cap = max(PROBE, int(ctx.budget * STAGE_SHARE / len(self.timed)))
        self.chain_cap = max(1, int(ctx.budget * CHAIN_SHARE))
        self.stage_limit = max(2 * len(self.timed), int(ctx.budget * (1 - CHAIN_RESERVE)))  # all stages together
        self.grids = [list(g) for g in ctx.stage_tilings]
        self.allowed = [{g.tiles for g in gs} for gs in self.grids]
        self.ranked = [sorted(gs, key=lambda g: (rank_seconds(g, ctx.device), _shape(g.tiles), g.tiles.stages,
                                                 g.tiles.split_k)) for gs in self.grids]
        self._steps = iter(self._plan())
        self._phase = "baseline"
        self._tpe = None  # the exploration's TPE, once the neighbourhood is exhausted

    # -- the plan, one batch per step

    def _plan(self):
        # The stream-order baseline first, whatever the budget: every study holds one, and every
        # speedup it reports is against a chain it measured.
        self._phase = "baseline"
        lead = opening(self.ctx)[:1]
        for c in lead:
            self.times[c] = None
        yield [Proposal(c, "opening") for c in lead]
        yield from self._stage_pass()
        yield from self._chain_pass()
        yield from self._refinement()

    def _stage_batch(self, per_stage: list[list[StageTiles]]) -> list[Proposal]:
        fresh = [list(dict.fromkeys(t for t in tilings if t not in self.alone[j] and t in self.allowed[j]))
                 if self.twin_of[j] == j else []  # a twin's times stand for it
                 for j, tilings in enumerate(per_stage)]
        # Where the stage pass's share runs out, the stages take turns, so that none is starved.
        room = self.stage_limit - sum(len(self.alone[j]) for j in self.timed)
        turns = itertools.zip_longest(*[[(j, t) for t in ts] for j, ts in enumerate(fresh)])
        kept = set(itertools.islice((x for turn in turns for x in turn if x is not None), max(room, 0)))
        out = []
        for j, tilings in enumerate(fresh):
            for t in tilings:
                if (j, t) in kept:
                    self.alone[j][t] = None
                    out.append(Proposal(stage_config(t), "stage pass", stage=j, screen=True))
        return out

    def _stage_pass(self):
        self._phase = "stage pass"
        prior = [[t for t in (self.ctx.prior.stages[j] if j < len(self.ctx.prior.stages) else [])
                  if t in self.allowed[j]] for j in range(self.n)]
        probe, kinds = [], []
        for j in range(self.n):
            by_kind: dict[str, list[StageTiles]] = {}
            shapes: set[tuple] = set()
            per_kind = min(PROBE, max(2, PROBE_SHAPES // max(1, len({g.tiles.mma for g in self.ranked[j]}))))
            for g in self.ranked[j]:
                t = g.tiles
                if _plain(t) and _shape(t) not in shapes and len(by_kind.setdefault(t.mma, [])) < per_kind:
                    shapes.add(_shape(t))
                    by_kind[t.mma].append(t)
            kinds.append(by_kind)
            # Instruction by instruction in turn, so that a small budget's cut keeps each one's best.
            turns = itertools.zip_longest(*(ts[:PROBE_FIRST] for ts in by_kind.values()))
            probe.append(prior[j] + [t for turn in turns for t in turn if t is not None])
        yield self._stage_batch(probe)
        # The rest of the probe, for the instructions whose first shapes came near the best.
        probe = []
        for j in range(self.n):
            best_kind = self._best_kind(j, kinds[j])
            top = min(best_kind.values(), default=float("inf"))
            live = [ts[PROBE_FIRST:] for k, ts in kinds[j].items() if best_kind[k] <= top * LIVE_PROBE]
            probe.append([t for turn in itertools.zip_longest(*live) for t in turn if t is not None])
        yield self._stage_batch(probe)
        rest = []
        for j in range(self.n):
            best_kind = self._best_kind(j, kinds[j])
            top = min(best_kind.values(), default=float("inf"))
            live = {k for k, v in best_kind.items() if v <= top * LIVE_KIND}
            room = self.stage_cap - len(self.alone[j])
            variants: dict[tuple, int] = {}
            for t in self.alone[j]:
                variants[_shape(t)] = variants.get(_shape(t), 0) + 1
            more = list(dict.fromkeys(u for t in self.fastest(j, RING_TOP) for u in ring_variants(t)
                                      if u in self.allowed[j] and u not in self.alone[j]))
            for g in self.ranked[j]:
                t = g.tiles
                if len(more) >= room - CLUSTER_TOP * len(CLUSTERS) - 2 * PERSIST_TOP:
                    break
                if not _plain(t) or t.mma not in live or t in self.alone[j] or t in more:
                    continue
                if variants.get(_shape(t), 0) < PER_SHAPE:
                    variants[_shape(t)] = variants.get(_shape(t), 0) + 1
                    more.append(t)
            rest.append(more)
        yield self._stage_batch(rest)
        clustered = []
        for j in range(self.n):
            vs = []
            for t in self.fastest(j, CLUSTER_TOP, plain=True):
                for cm, cn in CLUSTERS:
                    v = replace(t, cm=cm, cn=cn)
                    if v != t and v not in vs:
                        vs.append(v)
            clustered.append(vs)
        yield self._stage_batch(clustered)
        # Persistent blocks (where the space allows them: TMA-fed whole tiles outnumbering the SMs),
        # and the partial last wave split along K (where that ends it sooner).
        yield self._stage_batch([[replace(t, persist=p) for t in self.persist_bases(j) for p in (1, 2)]
                                 for j in range(self.n)])
        # The fastest persistent tiling's ring variants: a persistent ring's best depth differs from
        # the plain one's, and the plain depth it came from may not be one the pass made persistent.
        top = [[t for t in self.fastest(j, len(self.alone[j])) if t.persistent][:1] for j in range(self.n)]
        yield self._stage_batch([[u for t in ts for u in ring_variants(t)] for ts in top])

    def _best_kind(self, j: int, by_kind: dict[str, list[StageTiles]]) -> dict[str, float]:
        """Stage ``j``'s fastest time alone per MMA instruction among ``by_kind``'s tilings (inf
        where none was timed or none ran)."""
        return {k: min((self.alone[j].get(t) or float("inf")) for t in ts) for k, ts in by_kind.items()}

    def fastest(self, j: int, k: int, plain: bool = False) -> list[StageTiles]:
        """Stage ``j``'s ``k`` fastest tilings timed alone; with ``plain``, of those without clusters
        or persistent blocks."""
        timed = [(us, t) for t, us in self.alone[j].items() if us is not None and (not plain or _plain(t))]
        return [t for _, t in sorted(timed, key=lambda x: (x[0], _shape(x[1]), x[1].stages, x[1].split_k))][:k]

    def persist_bases(self, j: int) -> list[StageTiles]:
        """The tilings of stage ``j`` tried again with persistent blocks: of those that the space
        lets persist (a persistent block parks its output beside the ring, which a deep ring leaves
        no room for), the :data:`PERSIST_TOP` fastest, clustered or not, and as many fastest
        without a cluster. A persistent block hides its epilogue behind the next tile and keeps
        its ring, which reorders tilings timed within a percent or two of each other: at gpt3 2048
        tokens gemm2's fourth-fastest plain tiling ran fastest persistent on an H100, and of the
        three before it one could not persist."""
        ranked = [t for t in self.fastest(j, len(self.alone[j])) if replace(t, persist=1) in self.allowed[j]]
        return list(dict.fromkeys(ranked[:PERSIST_TOP] + [t for t in ranked if _plain(t)][:PERSIST_TOP]))

    def _top_tilings(self, j: int) -> list[StageTiles]:
        best = self.fastest(j, TOP_PER_STAGE)
        if not any(_plain(t) for t in best):  # clusters and persistent blocks rule out sync choices
            best += self.fastest(j, 1, plain=True)
        return best

    def _alone_us(self, j: int, t: StageTiles) -> float | None:
        return self.alone[j].get(t)

    def _instruction_swaps(self, tiles: tuple[StageTiles, ...]) -> list[tuple[StageTiles, ...]]:
        """``tiles`` with one stage's tiling swapped for the fastest tiling alone of each other MMA
        instruction within :data:`LIVE_KIND` of that stage's tiling."""
        out = []
        for j, t in enumerate(tiles):
            top = self._alone_us(j, t)
            seen = {t.mma}
            for u in self.fastest(j, len(self.alone[j])):
                if u.mma not in seen:
                    seen.add(u.mma)
                    if top is not None and self.alone[j][u] <= top * LIVE_KIND:
                        out.append(tiles[:j] + (u,) + tiles[j + 1:])
        return out

    def _chain_pass(self):
        self._phase = "chain pass"
        planned: list[Config] = []

        def batch(configs: Iterable[Config]) -> list[Config]:
            out: list[Config] = []
            for c in configs:
                if len(planned) + len(out) >= self.chain_cap:
                    break
                if c not in out and c not in self.times and self.ctx.usable(c):  # planned ones are in times
                    out.append(c)
            planned.extend(out)
            for c in out:
                self.times[c] = None
            return out

        tops = [self._top_tilings(j) for j in range(self.n)]
        pairings = sorted(itertools.product(*tops),
                          key=lambda ts: sum(self._alone_us(j, t) or 0.0 for j, t in enumerate(ts)))
        combos = core_combos(self.ctx.feasible.combos)
        best = tuple(pairings[0]) if pairings else None
        first = batch([*opening(self.ctx), *(Config(best, *c) for c in combos if best is not None)])
        yield [Proposal(c, "chain pass") for c in first]
        if best is not None:
            served = sorted(combos, key=lambda c: (self.times.get(Config(best, *c)) is None,
                                                    self.times.get(Config(best, *c)) or 0.0))
            swaps = batch(Config(alt, *c) for alt in self._instruction_swaps(best) for c in
                          [c for c in served if self.ctx.usable(Config(alt, *c))][:ALT_COMBOS])
            # The order a policy prefers is a rule of thumb; the fastest pairing tries the others.
            flipped = batch(Config(best, *o) for c in combos for o in other_orders(c))
            # A sync choice the fastest pairing breaks (a policy's constraint on one of its boundaries)
            # gets the fastest pairing it accepts: with a boundary per stage the product of the
            # stages' tops grows as TOP_PER_STAGE^stages, and its first usable entry may lie past the cap.
            fitted = batch(next((Config(tuple(t), *c) for t in pairings[1:FIT_PAIRINGS]
                                 if self.ctx.usable(Config(tuple(t), *c))), Config(best, *c))
                           for c in combos if not self.ctx.usable(Config(best, *c)))
            rest = batch(Config(tuple(tiles), *c) for tiles in pairings[1:] for c in combos)
            yield [Proposal(c, "chain pass") for c in swaps + flipped + fitted + rest]

    def _neighbours(self, parent: Config) -> Iterable[Config]:
        for j, t in enumerate(parent.tiles):
            swaps = self.fastest(j, SWAP_TOP)
            near = [g.tiles for g in self.grids[j]
                    if sum(getattr(g.tiles, f) != getattr(t, f) for f in TILE_FIELDS) == 1]
            rings = [u for u in ring_variants(t) if u in self.allowed[j]]
            for u in dict.fromkeys([*swaps, *near, *rings]):
                if u != t:
                    yield Config(parent.tiles[:j] + (u,) + parent.tiles[j + 1:], *parent.globals)
        for combo in self.ctx.feasible.combos:
            if combo != parent.globals:
                yield Config(parent.tiles, *combo)

    def _predict(self, parent: Config, child: Config) -> tuple[float, int]:
        us = self.times[parent] or 0.0
        unknown = 0
        for j, (a, b) in enumerate(zip(parent.tiles, child.tiles)):
            if a != b:
                ua, ub = self._alone_us(j, a), self._alone_us(j, b)
                if ua is None or ub is None:
                    unknown += 1
                else:
                    us += ub - ua
        return us, unknown

    def _refinement(self):
        while True:
            measured = sorted(((us, c) for c, us in self.times.items() if us is not None), key=lambda x: x[0])
            cands: dict[Config, tuple] = {}
            for rank, (_, parent) in enumerate(measured[:PARENTS]):
                for child in self._neighbours(parent):
                    if child in self.times or child in cands or not self.ctx.usable(child):
                        continue
                    us, unknown = self._predict(parent, child)
                    cands[child] = (unknown, us, rank)
            if cands:
                self._phase = "refinement"
                batch = [c for c, _ in sorted(cands.items(), key=lambda kv: kv[1])[:REFINE_BATCH]]
                phase = "refinement"
            else:
                self._phase = "exploration"
                batch, phase = self._explore(), "exploration"
                if not batch:
                    return
            for c in batch:
                self.times[c] = None
            yield [Proposal(c, phase) for c in batch]

    def _explore(self) -> list[Config]:
        """The next few configs of a TPE search over the joint space that has learnt every chain measured."""
        if self._tpe is None:
            from .tpe import TPESearch  # noqa: PLC0415

            self._tpe = TPESearch()
            self._tpe.start(self.ctx)
            self._tpe.continue_after(self.times)
        out: list[Config] = []
        while len(out) < EXPLORE_BATCH:
            c = self._tpe.draw()
            if c is None:
                break
            self._tpe.seen.add(c)
            if c not in self.times:
                out.append(c)
        return out

    # -- the interface

    def propose(self, left: int) -> list[Proposal]:
        for batch in self._steps:
            if batch:
                return batch
        return []

    def observe(self, outcomes: Iterable[Outcome]) -> None:
        outcomes = list(outcomes)
        for o in outcomes:
            if o.proposal.stage is not None:
                self.alone[o.proposal.stage][o.proposal.tiles] = o.us
            else:
                self.times[o.proposal.config] = o.us
        if self._tpe is not None:
            self._tpe.observe(o for o in outcomes if o.proposal.stage is None)

    def phase(self) -> str:
        return self._phase
