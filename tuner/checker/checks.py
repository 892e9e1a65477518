"""A model checker for the tile-synchronization protocol, run before anything compiles.

The kernels synchronize stages tile by tile through semaphores whose formulas live
in :mod:`tuner.sync.policies`. This module evaluates the *same* formulas against facts it
derives on its own from the index maps and the tilings, and answers three questions
for one chain and config:

soundness
    Before a consumer block loads K chunk ``kc`` of its A operand, the waits it has
    issued so far (in its split) cover every producer tile that writes any element
    of that chunk. A wait on semaphore ``S`` for ``epoch * V`` covers producer tile
    ``p`` iff ``p`` posts to ``S`` and ``V`` is exactly the number of producer tiles
    that post to ``S`` per run. Which tiles write a chunk comes from the identity
    index map and the producer's tiling, never from the policy.
deadlock freedom
    A discrete-event simulation of resident blocks in a fixed number of slots, under
    adversarial and seeded random schedules and several slot counts. A block is
    modelled by the waits it issues (in chunk order) and the post it makes when it
    finishes; chunks without a wait do not matter to scheduling and are skipped.
    This tests the schedules it runs; unlike soundness it is not exhaustive.
epochs
    Several runs back to back with counters never reset (semaphores, split-K
    arrival counters, guard start counters): a wait of run ``e`` must not pass
    before every producer tile it covers has posted in run ``e``, and a block must
    not load a chunk before the producer tiles writing it have posted in run ``e``.
    The second half re-checks soundness in the simulation, independently of the
    coverage rule above.

Modelling choices, where the hardware leaves room:

* Blocks of a kernel start in any order ("block" dispatch); a block's ticket is
  taken when it starts, so with "ticket" dispatch tiles start in ticket order.
* Time is abstract: a resident block that can go on may still be held back, so
  the simulation chooses, adversarially or at random, when blocks start and finish.
* The guard of a two-stream launch is a block too and holds a slot while it waits,
  so a two-stream launch needs two slots; smaller slot counts are not tried for it.
* A pdl launch under a sync policy runs its kernels on one stream, each after the first
  free to start blocks once every block of the one before has started.
* Runs follow one another: run ``e + 1`` starts when run ``e`` has finished (the
  backend joins both streams at the end of a run).
* A persistent stage's block ``b`` of ``G`` takes tickets ``b``, ``b + G``, ... one after
  another in its slot: a tile's successor starts where the tile finishes, and its waits
  hold the slot like any block's. A started block counts its tiles for the guard, as the
  kernels do.
* Blocks of one consumer class (same tile row ``m`` and split ``s``) issue the same
  waits, so the simulation tracks the progress of a class, not of each block. When
  a class passes a wait early, any of its blocks resident at that moment would.
* A normed consumer's block issues the waits of all its tile's chunks before its first
  (tuner.chain.norm); the simulation keeps them in chunk order. That is no new way to
  deadlock: in every launch a sync policy runs in, each producer block has started (or
  holds its ticket) before any consumer block can wait, so every wait is on tiles that run.
  Their soundness is checked exhaustively (``check_norm_rows``).
* A residual read from an earlier stage has no waits of its own: it is checked statically
  (``check_residual``), from the index maps, never simulated.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..chain.workloads import Chain
from ..config import Config
from ..sync.policies import (
    STREAM_ORDERED,
    launch_allowed,
    pair_env,
    persistent_allowed,
)
from .model import Protocol
from .simulator import make_schedules, simulate
from .soundness import check_norm_rows, check_order, check_residual, check_soundness


def check_protocol(protocol: Protocol, *, slots: int = 132, runs: int = 2, seed: int = 0,
                   schedules: int = 2) -> str | None:
    """Tile orders and residuals, then soundness of every pair (a normed consumer's rows too), then
    deadlock freedom and epochs."""
    for g in protocol.grids:
        msg = check_order(g, protocol.order)
        if msg:
            return msg
    for c in range(len(protocol.grids)):
        msg = check_residual(protocol.grids, c)
        if msg:
            return msg
    if protocol.policy is None:
        if protocol.launch not in STREAM_ORDERED:
            return f"a {protocol.launch} launch needs a sync policy: without one nothing orders the stages"
        return None  # kernel boundaries order everything: nothing waits, nothing can deadlock
    for p, c in protocol.pairs():
        msg = (check_soundness(protocol.grids[p], protocol.grids[c], protocol.policy)
               or check_norm_rows(protocol.grids[p], protocol.grids[c], protocol.policy))
        if msg:
            return msg
    # Deadlock under every schedule; the full-slot adversarial and the first random one also run
    # `runs` times back to back, which is the epochs check.
    for sch in make_schedules(protocol, slots, schedules, seed):
        many = sch.name in ("adversarial", "random #0")
        msg = simulate(protocol, sch, runs=runs if many else 1)
        if msg:
            return msg
    return None


def check(chain: Chain, config: Config, *, sms: int = 132, blocks_per_sm: int = 1, runs: int = 2, seed: int = 0,
          schedules: int = 2) -> str | None:
    """None if the sync protocol of ``config`` passes every check for ``chain``, else one message saying why not.

    Soundness is checked exhaustively (every consumer block, every chunk); deadlock
    freedom and epochs are checked on the simulated schedules, the adversarial ones
    and ``schedules`` random ones. ``sms * blocks_per_sm`` is the number of blocks resident at once; ``runs`` how many
    runs share never-reset counters; ``schedules`` how many seeded random schedules run
    beside the adversarial ones. Warp layout and pipeline depth do not change the
    protocol, so configs that differ only there share one cached answer.
    """
    same = tuple(replace(t, wm=1, wn=1, stages=2) for t in config.tiles)
    return _check(chain, replace(config, tiles=same), sms * blocks_per_sm, runs, seed, schedules, sms)


@lru_cache(maxsize=4096)
def _check(chain: Chain, config: Config, slots: int, runs: int, seed: int, schedules: int, sms: int) -> str | None:
    why = launch_allowed(config.policy, config.launch, config.dispatch)
    if why:
        return why
    # The simulation models persistent blocks only where they may run.
    for t in config.tiles:
        why = persistent_allowed(config.dispatch, config.launch, t.tail_split, config.policy) if t.persistent else None
        if why:
            return why
    try:
        protocol = Protocol.of(chain, config, sms=sms)
    except ValueError as exc:
        return str(exc)
    if protocol.policy is not None:
        for p, c in protocol.pairs():
            env = pair_env(protocol.grids[p], protocol.grids[c])
            if not protocol.policy.requires(env):
                return (f"policy {protocol.policy.name!r} on {protocol.grids[c].stage.name}: "
                        f"{protocol.policy.requires_doc or protocol.policy.requires.text}")
    return check_protocol(protocol, slots=slots, runs=runs, seed=seed, schedules=schedules)


def clear_caches() -> None:
    """Forget every cached answer, for a caller that changed what the answers derive from (an index map)."""
    from ..sync.policies import _bound  # noqa: PLC0415
    from .model import pair_model, tile_order  # noqa: PLC0415
    from .simulator import _layout_of  # noqa: PLC0415

    for cached in (_bound, pair_model, tile_order, _layout_of, _check):
        cached.cache_clear()
