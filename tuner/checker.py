"""A model checker for the tile-synchronization protocol, run before anything compiles.

The kernels synchronize stages tile by tile through semaphores whose formulas live
in :mod:`tuner.sync`. This module evaluates the *same* formulas against facts it
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
"""
from __future__ import annotations

import ast
import random
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from .config import Config, StageGrid
from .expr import Expr
from .stages import kind_of
from .stages.gemm import first_read, producer_cols
from .sync import (DISPATCHES, LAUNCHES, ORDERS, POLICIES, STREAM_ORDERED, SyncPolicy, TileOrder, launch_allowed,
                   order_env, pair_env, persistent_allowed, policy_for)
from .workloads import Chain

_NEVER = np.iinfo(np.int64).max
_FEW_SLOTS = (1, 2, 3)


# ---------------------------------------------------------------------------
# Vectorized evaluation of the formulas


@lru_cache(maxsize=None)
def _tree(expr: Expr) -> ast.expr:
    expr.names  # noqa: B018 - validates the formula against the accepted subset first
    return ast.parse(expr.text, mode="eval").body


def _ev(node: ast.expr, env: Mapping[str, Any]) -> np.ndarray:
    # Python's reading of the formula, over arrays: `a or b` is a if a is true else b, and
    # comparisons give 0/1, exactly as Expr.__call__ computes them one value at a time.
    if isinstance(node, ast.Constant):
        return np.int64(node.value)
    if isinstance(node, ast.Name):
        return np.asarray(env[node.id], dtype=np.int64)
    if isinstance(node, ast.BinOp):
        a, b = _ev(node.left, env), _ev(node.right, env)
        op = type(node.op)
        if op is ast.Add:
            return a + b
        if op is ast.Sub:
            return a - b
        if op is ast.Mult:
            return a * b
        with np.errstate(divide="ignore"):  # a divisor can be 0 only where np.where discards the lane
            return np.floor_divide(a, b) if op is ast.FloorDiv else np.mod(a, b)
    if isinstance(node, ast.UnaryOp):
        v = _ev(node.operand, env)
        return (v == 0).astype(np.int64) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BoolOp):
        out = _ev(node.values[0], env)
        for sub in node.values[1:]:
            nxt = _ev(sub, env)
            out = np.where(out == 0, out, nxt) if isinstance(node.op, ast.And) else np.where(out != 0, out, nxt)
        return out
    if isinstance(node, ast.Compare):
        ops = {ast.Eq: np.equal, ast.NotEq: np.not_equal, ast.Lt: np.less, ast.LtE: np.less_equal,
               ast.Gt: np.greater, ast.GtE: np.greater_equal}
        left, out = _ev(node.left, env), None
        for op, right_node in zip(node.ops, node.comparators):
            right = _ev(right_node, env)
            cmp = ops[type(op)](left, right)
            out = cmp if out is None else out & cmp
            left = right
        return out.astype(np.int64)
    if isinstance(node, ast.Call):
        a, b = (_ev(x, env) for x in node.args)
        return np.minimum(a, b) if node.func.id == "min" else np.maximum(a, b)
    if isinstance(node, ast.IfExp):
        return np.where(_ev(node.test, env) != 0, _ev(node.body, env), _ev(node.orelse, env))
    raise TypeError(f"unexpected node {ast.dump(node)}")  # _tree validated the formula


def evaluate(expr: Expr, env: Mapping[str, Any], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``expr`` over arrays: every name may be an int or a broadcastable integer array."""
    missing = expr.names - env.keys()
    if missing:
        raise KeyError(f"{expr.text!r}: no value for {', '.join(sorted(missing))}")
    out = np.asarray(_ev(_tree(expr), env), dtype=np.int64)
    return np.broadcast_to(out, shape) if shape is not None else out


# ---------------------------------------------------------------------------
# What the config is: stages, policy, order, dispatch, launch


@dataclass(frozen=True)
class Protocol:
    """Everything the checker looks at: the stage grids and how they synchronize and launch.

    ``policy`` and ``order`` are objects, not names, so that tests can hand in broken
    ones. ``guard=False`` drops the two-stream guard kernel; it exists to show that
    the guard is what keeps that launch mode free of deadlock. ``sms``: the device's SMs,
    which size a persistent stage's grid (:meth:`StageGrid.launched`).
    """

    grids: tuple[StageGrid, ...]
    policy: SyncPolicy | None
    order: TileOrder
    dispatch: str
    launch: str
    guard: bool = True
    sms: int = 132

    @classmethod
    def of(cls, chain: Chain, config: Config, **override: Any) -> "Protocol":
        """The protocol a config describes; keyword arguments replace fields (``policy=``, ``guard=``...)."""
        if len(config.tiles) != len(chain.stages):
            raise ValueError(f"{chain.label} has {len(chain.stages)} stages but the config tiles {len(config.tiles)}")
        if config.policy not in POLICIES or config.order not in ORDERS:
            raise ValueError(f"unknown policy {config.policy!r} or order {config.order!r}")
        if config.dispatch not in DISPATCHES or config.launch not in LAUNCHES:
            raise ValueError(f"unknown dispatch {config.dispatch!r} or launch {config.launch!r}")
        proto = cls(config.grids(chain), POLICIES[config.policy], ORDERS[config.order], config.dispatch, config.launch)
        return replace(proto, **override)

    def pairs(self) -> list[tuple[int, int]]:
        """(producer, consumer) stage indices, one per stage that reads an earlier stage's output."""
        return [(g.stage.a_from, i) for i, g in enumerate(self.grids) if g.stage.a_from is not None]


def _tile(grid: StageGrid, m: int, n: int | str, s: int | None = None) -> str:
    split = f", s={s}" if s is not None else ""
    return f"{grid.stage.name} tile (m={m}, n={n}{split})"


def wait_columns(consumer: StageGrid) -> int:
    """How many tile columns of the consumer wait differently: all of them where its kind's reads
    depend on the tile's column (``PER_COLUMN``), else one. A consumer **wait row** ``cr`` is then
    tile row ``cr // wait_columns`` and, where they differ, column ``cr % wait_columns``."""
    return consumer.nt if kind_of(consumer.stage).PER_COLUMN else 1


def _wait_row_tile(consumer: StageGrid, cr: int, s: int | None = None) -> str:
    nc = wait_columns(consumer)
    return _tile(consumer, cr // nc, cr % nc, s)


# ---------------------------------------------------------------------------
# Tile orders


@lru_cache(maxsize=256)
def tile_order(grid: StageGrid, order: TileOrder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tile (m, n, s) of every ticket 0..blocks-1 of one stage."""
    t = np.arange(grid.blocks, dtype=np.int64)
    env = {**order_env(grid), "t": t}
    return tuple(evaluate(e, env, t.shape).copy() for e in (order.m, order.n, order.s))  # type: ignore[return-value]


def check_order(grid: StageGrid, order: TileOrder) -> str | None:
    """Whether ``order`` hands out every tile and split of the stage exactly once."""
    m, n, s = tile_order(grid, order)
    mt, nt, sk = grid.mt, grid.nt, grid.tiles.split_k
    bad = np.flatnonzero((m < 0) | (m >= mt) | (n < 0) | (n >= nt) | (s < 0) | (s >= sk))
    if bad.size:
        t = int(bad[0])
        return (f"{grid.stage.name}: tile order {order.name!r} maps ticket {t} to (m={m[t]}, n={n[t]}, s={s[t]}), "
                f"outside the {mt}x{nt} tiles x {sk} splits")
    key = (m * nt + n) * sk + s
    seen = np.bincount(key, minlength=grid.blocks)
    if (seen > 1).any():  # blocks tickets into as many (tile, split) slots: a repeat means a miss too
        k = int(np.flatnonzero(seen > 1)[0])
        t1, t2 = np.flatnonzero(key == k)[:2]
        return (f"{grid.stage.name}: tile order {order.name!r} gives tickets {t1} and {t2} the same "
                f"{_tile(grid, k // (nt * sk), (k // sk) % nt, k % sk)}, so another tile never runs")
    return None


# ---------------------------------------------------------------------------
# Data dependencies, from the index map and the producer's tiling


def _check_shapes(producer: StageGrid, consumer: StageGrid) -> str | None:
    return kind_of(consumer.stage).check_shapes(producer, consumer)


# ---------------------------------------------------------------------------
# The policy's waits and posts for one producer/consumer pair


@dataclass(frozen=True, eq=False)
class PairModel:
    """A policy evaluated on one producer/consumer pair.

    ``post[m1, n1]`` is the semaphore producer tile ``(m1, n1)`` posts to and ``posts[S]``
    how many tiles post to ``S`` per run. The waits are flat arrays in consumer chunk
    order: consumer wait row ``m2`` (its tile row, and its column where the waits depend on
    it: see :func:`wait_columns`), chunk ``kc`` (its split is ``kc // ks``), producer row ``r``,
    semaphore ``sem`` and per-run count ``count``.
    """

    producer: StageGrid
    consumer: StageGrid
    sems: int
    post: np.ndarray
    posts: np.ndarray
    m2: np.ndarray
    kc: np.ndarray
    r: np.ndarray
    sem: np.ndarray
    count: np.ndarray
    error: str | None = None  # a formula misbehaved before the waits could be listed

    def classes(self) -> list[list[tuple[int, int, int, int]]]:
        """Per consumer class ``m2 * splits + s`` (``m2`` a wait row): its waits ``(sem, count, kc, r)`` in
        order, repeats dropped."""
        splits = self.consumer.tiles.split_k
        rows = self.consumer.mt * wait_columns(self.consumer)
        out: list[list[tuple[int, int, int, int]]] = [[] for _ in range(rows * splits)]
        cls = self.m2 * splits + self.consumer.split_of(self.kc)
        seen: set[tuple[int, int, int]] = set()
        for c, s, v, k, r in zip(cls.tolist(), self.sem.tolist(), self.count.tolist(), self.kc.tolist(),
                                 self.r.tolist()):
            if (c, s, v) not in seen:  # counters only grow: a second identical wait passes at once
                seen.add((c, s, v))
                out[c].append((s, v, k, r))
        return out


@lru_cache(maxsize=64)
def pair_model(producer: StageGrid, consumer: StageGrid, policy: SyncPolicy) -> PairModel:
    """Evaluate ``policy`` for every producer tile and every consumer (wait row, chunk, region,
    producer row, producer column)."""
    regions = policy_for(policy, consumer)
    env = pair_env(producer, consumer)
    empty = np.zeros(0, dtype=np.int64)

    def fail(msg: str) -> PairModel:
        return PairModel(producer, consumer, 0, np.zeros((0, 0), np.int64), empty, empty, empty, empty, empty, empty,
                         msg)

    head = regions[0]  # the posts read no index map: every region's are the same
    sems = int(evaluate(head.sems, env))
    mt1, nt1 = producer.mt, producer.nt
    post = evaluate(head.post_sem, {**env, "m1": np.arange(mt1)[:, None], "n1": np.arange(nt1)[None, :]},
                    (mt1, nt1)).copy()
    bad = np.argwhere((post < 0) | (post >= sems))
    if bad.size:
        m1, n1 = map(int, bad[0])
        return fail(f"{_tile(producer, m1, n1)} posts to semaphore {post[m1, n1]}, outside the policy's "
                    f"{sems} semaphores [0, {sems})")
    posts = np.bincount(post.ravel(), minlength=sems)

    nc = wait_columns(consumer)
    rows, kc2 = consumer.mt * nc, consumer.kc
    cr = np.arange(rows, dtype=np.int64)[:, None]
    kc = np.arange(kc2, dtype=np.int64)[None, :]
    genv = {**env, "m2": cr // nc, "n2": cr % nc, "kc": kc, "first": (kc == consumer.split_begin(consumer.split_of(kc))).astype(np.int64)}
    shape = (rows, kc2)
    parts: list[tuple[np.ndarray, ...]] = []
    for g, pol in enumerate(regions):
        when = evaluate(pol.wait_when, genv, shape) != 0
        lo, hi = evaluate(pol.wait_row_lo, genv, shape), evaluate(pol.wait_row_hi, genv, shape)
        clo, chi = evaluate(pol.wait_col_lo, genv, shape), evaluate(pol.wait_col_hi, genv, shape)
        rspan = np.where(when, np.maximum(hi - lo + 1, 0), 0)
        cspan = np.where(when, np.maximum(chi - clo + 1, 0), 0)
        live = (rspan > 0) & (cspan > 0)
        for what, a, b, n in (("rows", lo, hi, mt1), ("columns", clo, chi, nt1)):
            wild = live & ((a < 0) | (b >= n))
            if wild.any():
                i, k = map(int, np.argwhere(wild)[0])
                return fail(f"{_wait_row_tile(consumer, i, consumer.split_of(k))} chunk {k}: waits on producer tile "
                            f"{what} {a[i, k]}..{b[i, k]}, outside {producer.stage.name}'s {n} tile {what}")
        for d in range(int(rspan.max(initial=0))):
            for e in range(int(cspan.max(initial=0))):
                r, c = lo + d, clo + e
                sel = np.nonzero((d < rspan) & (e < cspan))
                renv = {**genv, "r": r, "c": c}
                sem = evaluate(pol.wait_sem, renv, shape)[sel]
                cnt = evaluate(pol.wait_count, renv, shape)[sel]
                parts.append((sel[0], sel[1], r[sel], sem, cnt, np.full(sem.shape, g), np.full(sem.shape, d),
                              np.full(sem.shape, e)))
    if not parts:
        return PairModel(producer, consumer, sems, post, posts, empty, empty, empty, empty, empty)
    m2s, kcs, rs, semv, cntv, gs, ds, es = (np.concatenate(x) for x in zip(*parts))
    # Chunk order within a consumer wait row; within a chunk, regions in order, then a wait's loops.
    order = np.lexsort((es, ds, gs, kcs, m2s))
    model = PairModel(producer, consumer, sems, post, posts, m2s[order], kcs[order], rs[order], semv[order],
                      cntv[order])
    bad_sem = np.flatnonzero((model.sem < 0) | (model.sem >= sems))
    if bad_sem.size:
        j = int(bad_sem[0])
        k = int(model.kc[j])
        return fail(f"{_wait_row_tile(consumer, int(model.m2[j]), consumer.split_of(k))} chunk {k}: waits (row "
                    f"{model.r[j]}) on semaphore {model.sem[j]}, outside the policy's {sems} semaphores [0, {sems})")
    return model


# ---------------------------------------------------------------------------
# Soundness


def check_soundness(producer: StageGrid, consumer: StageGrid, policy: SyncPolicy) -> str | None:
    """Whether every chunk a consumer block loads is covered by the waits it issued up to that chunk.

    The tiles a chunk reads come from the consumer kind's index map and the producer's tiling;
    a wait covers a tile only if it waits for exactly the number of tiles posting to
    its semaphore. Blocks of one tile row and split issue the same waits (the formulas
    do not read ``n2``), so the message names column ``n=0`` for all of them.
    """
    shapes = _check_shapes(producer, consumer)
    if shapes:
        return shapes
    model = pair_model(producer, consumer, policy)
    if model.error:
        return model.error
    splits, sems = consumer.tiles.split_k, max(model.sems, 1)

    # When each (consumer row, split, semaphore) is first covered: the earliest chunk with a wait
    # on it for the right count.
    ok = model.count == model.posts[model.sem] if model.sem.size else np.zeros(0, bool)
    cov_key = ((model.m2 * splits + consumer.split_of(model.kc)) * sems + model.sem)[ok]
    cov_kc = model.kc[ok]
    keys, first = np.unique(cov_key, return_index=True)  # waits are in chunk order: first index = earliest
    cov_at = cov_kc[first]

    # When each producer tile is first read by each (consumer row, split), from the index map.
    per_row = kind_of(consumer.stage).reads(producer, consumer)
    misses: list[tuple[int, int, int, int, int]] = []  # (m2, s, kc, m1, n1) of reads not covered in time
    if per_row:
        m2v = np.concatenate([np.full(r[0].size, i, dtype=np.int64) for i, r in enumerate(per_row)])
        sv, m1v, n1v, kreq = (np.concatenate([r[j] for r in per_row]) for j in range(4))
        key = (m2v * splits + sv) * sems + model.post[m1v, n1v]
        covered = np.full(key.shape, _NEVER)
        if keys.size:
            pos = np.minimum(np.searchsorted(keys, key), keys.size - 1)
            found = keys[pos] == key
            covered[found] = cov_at[pos[found]]
        bad = np.flatnonzero(covered > kreq)
        if bad.size:
            j = bad[np.lexsort((n1v[bad], m1v[bad], kreq[bad], sv[bad], m2v[bad]))[0]]
            misses.append((int(m2v[j]), int(sv[j]), int(kreq[j]), int(m1v[j]), int(n1v[j])))
    if misses:
        m2_, s_, kc_, m1_, n1_ = min(misses)
        return _unsound(model, policy, m2_, s_, kc_, m1_, n1_)
    return None


def _unsound(model: PairModel, policy: SyncPolicy, m2: int, s: int, kc: int, m1: int, n1: int) -> str:
    # Explain one uncovered read (of consumer wait row m2), re-evaluating the formulas one value at
    # a time with Expr.
    prod, cons = model.producer, model.consumer
    regions = policy_for(policy, cons)
    env = pair_env(prod, cons)
    sem = regions[0].post_sem({**env, "m1": m1, "n1": n1})
    need = int(model.posts[sem])
    lo, hi = producer_cols(prod)
    nc = wait_columns(cons)
    where = (f"{_wait_row_tile(cons, m2, s)} chunk {kc} ({kind_of(cons.stage).chunk_columns(cons, kc)}) reads "
             f"{_tile(prod, m1, n1)} (rows {m1 * prod.tiles.bm}..{min((m1 + 1) * prod.tiles.bm, prod.stage.m) - 1}, "
             f"columns {lo[n1]}..{hi[n1] - 1}), which posts to semaphore {sem}")
    waits = []
    for k in cons.split_chunks(s):
        wenv = {**env, "m2": m2 // nc, "n2": m2 % nc, "kc": k, "first": int(k == cons.split_chunks(s).start)}
        for pol in regions:
            if pol.wait_when(wenv):
                for r in range(pol.wait_row_lo(wenv), pol.wait_row_hi(wenv) + 1):
                    for c in range(pol.wait_col_lo(wenv), pol.wait_col_hi(wenv) + 1):
                        if pol.wait_sem({**wenv, "r": r, "c": c}) == sem:
                            waits.append((k, pol.wait_count({**wenv, "r": r, "c": c})))
    right = [k for k, v in waits if v == need]
    if right and right[0] <= kc:
        raise AssertionError(f"the array and the scalar readings of policy {policy.name!r} disagree at {where}")
    wrong = [(k, v) for k, v in waits if v != need and k <= kc]
    if wrong:
        k, v = wrong[0]
        return (f"{where}; the wait on it at chunk {k} is for {v} post(s) per run, but {need} producer "
                f"tile(s) post to it, so that wait covers none of them")
    if right:
        return f"{where}, but this split first waits on it at chunk {right[0]}, after reading it"
    return f"{where}, but this split never waits on that semaphore before reading it"


# ---------------------------------------------------------------------------
# Simulation: deadlock freedom and epochs


@dataclass(frozen=True)
class Schedule:
    """How the simulation resolves the choices the hardware leaves open.

    ``pick`` chooses among kernels that may start a block (``late``: the latest stage
    first, which starts consumers and guards as early as allowed; ``early``; ``random``).
    ``blocks`` is the order a kernel's blocks start in under "block" dispatch
    (``reverse``, ``forward``, ``random``); ticket dispatch always starts tickets in
    order. ``eager`` fills every free slot before any block finishes, then lets every
    runnable block finish, newest first; otherwise the simulation alternates at random
    between starting and finishing a random number of blocks, picked at random.
    """

    name: str
    slots: int
    pick: str = "late"
    blocks: str = "reverse"
    eager: bool = True
    seed: int = 0


def make_schedules(protocol: Protocol, slots: int, count: int = 2, seed: int = 0) -> list[Schedule]:
    """The adversarial schedules at ``slots`` and at a few small slot counts, then ``count`` random ones."""
    least = 2 if protocol.launch == "two_stream" and protocol.guard else 1
    out = [Schedule("adversarial", slots)]
    out += [Schedule(f"adversarial/{n} slots", n) for n in _FEW_SLOTS if least <= n < slots]
    rng = random.Random(seed)
    for i in range(count):
        n = rng.choice([slots, *(c for c in _FEW_SLOTS if least <= c < slots), rng.randint(min(least, slots), slots)])
        out.append(Schedule(f"random #{i}", n, "random", "random", eager=False, seed=seed * 7919 + i))
    return out


@dataclass
class _Kernel:
    """One launch of one run: its blocks in the order this schedule starts them."""

    name: str
    stream: int
    units: list[int]  # block ids in start order for this schedule; guards are -(producer stage) - 1
    done: int = 0
    next: int = 0
    released: bool = False  # the next kernel on its stream may start blocks


@dataclass(frozen=True)
class _Layout:
    """Every block of every stage under one global id (its fused ticket), with its class and tile."""

    base: tuple[int, ...]  # first global id of each stage
    stage: list[int]
    cls: list[int]  # consumer class id, -1 for a stage that never waits
    tile: list[int]  # global producer tile id
    tile_splits: list[int]
    tile_post: list[tuple[int, ...]]  # global semaphores a finished tile posts to
    tile_name: list[tuple[int, int, int]]  # (stage, m, n)
    waits: list[list[tuple[int, int, int, int]]]  # per class: (global sem, count, kc, r)
    # per class, per wait f (and one past the last): the (producer tile, chunk) pairs the class
    # first reads after passing the waits before f and before reaching wait f
    reads: list[list[tuple[tuple[int, int], ...]]]
    class_info: list[tuple[int, int, int]]  # (stage, m2, s)
    sem_pair: list[tuple[int, int]]  # per global semaphore: (pair index, local semaphore)
    posts: list[int]  # per global semaphore: tiles posting to it per run
    blk_m: list[int]
    blk_n: list[int]
    blk_s: list[int]
    stage_posts: tuple[bool, ...]  # whether a stage's finished tiles post to any semaphore


def _layout(protocol: Protocol) -> _Layout:
    return _layout_of(protocol.grids, protocol.policy, protocol.order)


@lru_cache(maxsize=32)
def _layout_of(grids: tuple[StageGrid, ...], policy: SyncPolicy | None, order: TileOrder) -> _Layout:
    pairs = [(g.stage.a_from, i) for i, g in enumerate(grids) if g.stage.a_from is not None]
    base, tile_base, total, tiles = [], [], 0, 0
    for g in grids:
        base.append(total)
        tile_base.append(tiles)
        total += g.blocks
        tiles += g.mt * g.nt
    stage, cls, tile, blk_m, blk_n, blk_s = [], [], [], [], [], []
    tile_splits = [0] * tiles
    tile_post: list[list[int]] = [[] for _ in range(tiles)]
    tile_name: list[tuple[int, int, int]] = [(0, 0, 0)] * tiles
    waits: list[list[tuple[int, int, int, int]]] = []
    class_info: list[tuple[int, int, int]] = []
    reads: list[list[tuple[tuple[int, int], ...]]] = []
    sem_pair: list[tuple[int, int]] = []
    posts: list[int] = []
    class_base = {}
    if policy is not None:
        for p_i, (p, c) in enumerate(pairs):
            model = pair_model(grids[p], grids[c], policy)
            sem_base = len(posts)
            sem_pair += [(p_i, j) for j in range(model.sems)]
            posts += model.posts.tolist()
            for (m1, n1), sem in np.ndenumerate(model.post):
                tile_post[tile_base[p] + m1 * grids[p].nt + n1].append(sem_base + int(sem))
            class_base[c] = len(waits)
            splits = grids[c].tiles.split_k
            per_row = kind_of(grids[c].stage).reads(grids[p], grids[c])
            for k, lst in enumerate(model.classes()):
                m2, s2 = divmod(k, splits)  # m2: the consumer's wait row (see wait_columns)
                waits.append([(sem_base + s, v, kc, r) for s, v, kc, r in lst])
                class_info.append((c, m2, s2))
                # Split the tiles this class reads by the wait that must pass before the first read.
                bounds = [kc for _, _, kc, _ in lst]
                segs: list[list[tuple[int, int]]] = [[] for _ in range(len(lst) + 1)]
                sv, m1v, n1v, kcv = per_row[m2]
                mine = np.flatnonzero(sv == s2)
                for m1, n1, kc in zip(m1v[mine].tolist(), n1v[mine].tolist(), kcv[mine].tolist()):
                    segs[bisect_right(bounds, kc)].append((tile_base[p] + m1 * grids[p].nt + n1, kc))
                reads.append([tuple(x) for x in segs])
    for i, g in enumerate(grids):
        m, n, s = (a.tolist() for a in tile_order(g, order))
        nt, splits = g.nt, g.tiles.split_k
        stage += [i] * g.blocks
        blk_m += m
        blk_n += n
        blk_s += s
        tile += [tile_base[i] + a * nt + b for a, b in zip(m, n)]
        cb = class_base.get(i)
        nc = wait_columns(g)
        cls += [-1] * g.blocks if cb is None else [cb + (a * nc + b % nc) * splits + c for a, b, c in zip(m, n, s)]
        for a in range(g.mt):
            for b in range(nt):
                tile_splits[tile_base[i] + a * nt + b] = splits
                tile_name[tile_base[i] + a * nt + b] = (i, a, b)
    stage_posts = tuple(any(p == i for p, _ in pairs) and policy is not None for i in range(len(grids)))
    return _Layout(tuple(base), stage, cls, tile, tile_splits, [tuple(x) for x in tile_post], tile_name, waits,
                   reads, class_info, sem_pair, posts, blk_m, blk_n, blk_s, stage_posts)


class _Stop(Exception):
    """The simulation found a problem; the message says which."""


class _Sim:
    """One schedule, ``runs`` runs, of one protocol."""

    def __init__(self, protocol: Protocol, schedule: Schedule):
        self.p, self.sch, self.lay = protocol, schedule, _layout(protocol)
        self.rng = random.Random(schedule.seed)
        lay = self.lay
        self.sem = [0] * len(lay.posts)
        self.arrivals = [0] * len(lay.tile_splits)
        self.started = [0] * len(protocol.grids)
        self.guarded = {p for p, _ in protocol.pairs()} if protocol.launch == "two_stream" and protocol.guard else set()
        # A persistent block's tiles: the one after each (-1 past its last), and, at its first, how
        # many it computes (what it adds to the guard's count when it starts).
        total = sum(g.blocks for g in protocol.grids)
        self.grid = [g.launched(protocol.sms) for g in protocol.grids]
        self.succ, self.weight = [-1] * total, [1] * total
        for i, g in enumerate(protocol.grids):
            G, b0 = self.grid[i], lay.base[i]
            if G < g.blocks:
                for t in range(g.blocks - G):
                    self.succ[b0 + t] = b0 + t + G
                for t in range(G):
                    self.weight[b0 + t] = (g.blocks - 1 - t) // G + 1

    # -- kernels -----------------------------------------------------------------------------
    def _order(self, ids: range) -> list[int]:
        if self.p.dispatch == "ticket" or self.sch.blocks == "forward":
            return list(ids)
        if self.sch.blocks == "reverse":
            return list(reversed(ids))
        return np.random.default_rng(self.rng.getrandbits(64)).permutation(np.arange(ids.start, ids.stop)).tolist()

    def _kernels(self) -> list[_Kernel]:
        grids, base, launch = self.p.grids, self.lay.base, self.p.launch
        if launch == "fused":
            return [_Kernel("fused", 0, self._order(range(sum(g.blocks for g in grids))))]
        out = []
        for i, g in enumerate(grids):
            stream = i % 2 if launch == "two_stream" else 0
            a_from = g.stage.a_from
            if a_from is not None and a_from in self.guarded:
                out.append(_Kernel(f"guard of {g.stage.name}", stream, [-a_from - 1]))
            out.append(_Kernel(g.stage.name, stream, self._order(range(base[i], base[i] + self.grid[i]))))
        return out

    def _tiles_open(self, u: int) -> bool:
        # Whether every tile of the block starting at unit u has passed all its waits.
        succ, cls, opened = self.succ, self.lay.cls, self.open
        while u >= 0:
            if cls[u] >= 0 and not opened[cls[u]]:
                return False
            u = succ[u]
        return True

    # -- one run -----------------------------------------------------------------------------
    def run(self, epoch: int) -> None:
        """Simulate run number ``epoch``; raises _Stop on a deadlock or an early wait."""
        lay, sch = self.lay, self.sch
        self.epoch = epoch
        kernels = self.kernels = self._kernels()
        stage_kernel = [0] * len(self.p.grids)  # the kernel running each stage's blocks
        guard_kernel: dict[int, int] = {}
        for k, kern in enumerate(kernels):
            if kern.units[0] < 0:
                guard_kernel[kern.units[0]] = k
            elif self.p.launch != "fused":
                stage_kernel[lay.stage[kern.units[0]]] = k
        # A guard ranks with the consumer it holds back, so "late" starts it as early as allowed.
        rank = [-kern.units[0] if kern.units[0] < 0 else lay.stage[kern.units[0]] for kern in kernels]
        active = self.active = []
        for k, kern in enumerate(kernels):
            if all(kernels[j].stream != kern.stream for j in range(k)):
                active.append(k)
        runnable: list[int] = []
        self.runnable = runnable
        self.frontier = [0] * len(lay.waits)
        self.open = [False] * len(lay.waits)
        self.blocked = [[] for _ in lay.waits]
        self.waiters: dict[int, list[int]] = {}  # classes stopped at a wait, by semaphore
        self.need = [_NEVER] * len(lay.posts)  # the lowest value one of them waits for
        self.guard_waiting: dict[int, int] = {}
        self.posted = [0] * len(lay.posts)  # posts made in this run, per semaphore
        for c in range(len(lay.waits)):
            self._reads(c, 0)  # chunks before a class's first wait: any block of it may load them now
            self._advance(c)

        random_, pick, eager = self.rng.random, sch.pick, sch.eager
        stage_of, cls_of, tile_of, tile_splits, tile_post = lay.stage, lay.cls, lay.tile, lay.tile_splits, lay.tile_post
        opened, blocked, started, arrivals, sem, posted = self.open, self.blocked, self.started, self.arrivals, \
            self.sem, self.posted
        waiters, need, guard_waiting = self.waiters, self.need, self.guard_waiting
        blocks = [g.blocks for g in self.p.grids]
        weight, succ = self.weight, self.succ
        # the tiles (or the guard) each kernel finishes; it starts len(units) blocks
        sizes = [sum(weight[u] if u >= 0 else 1 for u in kern.units) for kern in kernels]
        left = sum(sizes)
        free = sch.slots
        inert = [not posts and i not in self.guarded for i, posts in enumerate(lay.stage_posts)]
        # A tile policy's pdl launch: the next kernel may start once every block of this one has.
        dependent = self.p.launch == "pdl" and self.p.policy is not None
        inert_kernel = [self.p.launch == "fused" or (kern.units[0] >= 0 and inert[stage_of[kern.units[0]]])
                        for kern in kernels]
        while left:
            if free and active and (eager or not runnable or random_() < 0.5):
                if len(active) == 1:
                    i = 0
                elif pick == "random":
                    i = int(random_() * len(active))
                else:
                    ranks = [rank[k] for k in active]
                    i = ranks.index(max(ranks) if pick == "late" else min(ranks))
                k = active[i]
                kern = kernels[k]
                units, nxt, n = kern.units, kern.next, len(kern.units)
                if inert_kernel[k]:
                    # A block that can run to its end when it starts and posts nothing changes nothing
                    # but counts when it finishes; holding its slot longer never leads anywhere that
                    # finishing at once does not (a deadlock needs every resident block waiting). So
                    # a stretch of them starts and finishes in one tight loop.
                    j, tiles = nxt, 0
                    while j < n:
                        u = units[j]
                        if u < 0 or not inert[stage_of[u]]:
                            break
                        c = cls_of[u]
                        if (c >= 0 and not opened[c]) or (succ[u] >= 0 and not self._tiles_open(u)):
                            break
                        started[stage_of[u]] += weight[u]
                        tiles += weight[u]
                        j += 1
                    if j > nxt:
                        kern.next = j
                        kern.done += tiles
                        left -= tiles
                        if j == n:
                            active.pop(i)
                            if kern.done == sizes[k] or dependent:
                                self._next_on_stream(k)
                        continue
                # Eager: fill every free slot from this kernel; otherwise start a random number of blocks.
                end = nxt + (free if eager else 1 + int(random_() * free))
                if end >= n:
                    end = n
                    active.pop(i)
                kern.next = end
                free -= end - nxt
                for u in units[nxt:end]:
                    if u < 0:
                        p = -u - 1
                        if started[p] >= epoch * blocks[p]:
                            runnable.append(u)
                        else:
                            guard_waiting[p] = u
                        continue
                    st = stage_of[u]
                    started[st] += weight[u]
                    if guard_waiting and st in guard_waiting and started[st] >= epoch * blocks[st]:
                        runnable.append(guard_waiting.pop(st))
                    c = cls_of[u]
                    if c < 0 or opened[c]:
                        runnable.append(u)
                    else:
                        blocked[c].append(u)
                if dependent and end == n:
                    self._next_on_stream(k)  # every block of it has started: its dependent launch may go
            elif runnable:
                # Eager: every runnable block finishes, newest first (freed slots are then refilled,
                # consumers first). Otherwise a random number of them, picked at random.
                if eager:
                    batch = runnable[::-1]
                    runnable.clear()
                else:
                    batch = []
                    for _ in range(1 + int(random_() * len(runnable))):
                        j = int(random_() * len(runnable))
                        runnable[j], runnable[-1] = runnable[-1], runnable[j]
                        batch.append(runnable.pop())
                left -= len(batch)
                for u in batch:
                    k = guard_kernel[u] if u < 0 else stage_kernel[stage_of[u]]
                    kern = kernels[k]
                    kern.done += 1
                    if kern.done == sizes[k]:
                        self._next_on_stream(k)
                    if u < 0:
                        free += 1
                        continue
                    t = tile_of[u]
                    arrivals[t] += 1
                    if arrivals[t] == epoch * tile_splits[t]:  # the last split to arrive posts
                        for gs in tile_post[t]:
                            sem[gs] += 1
                            posted[gs] += 1
                            if sem[gs] >= need[gs]:
                                need[gs] = _NEVER
                                for c in waiters.pop(gs):
                                    self._advance(c)
                    v = succ[u]
                    if v < 0:
                        free += 1
                        continue
                    # A persistent block goes on to its next tile in the same slot.
                    c = cls_of[v]
                    if c < 0 or opened[c]:
                        runnable.append(v)
                    else:
                        blocked[c].append(v)
            else:
                self.free = free
                raise _Stop(self._deadlock())

    def _next_on_stream(self, k: int) -> None:
        # Stream order: kernel k has finished (or, in a dependent launch, started every block), so
        # the next kernel on its stream may start blocks.
        kernels = self.kernels
        if kernels[k].released:
            return
        kernels[k].released = True
        for j in range(k + 1, len(kernels)):
            if kernels[j].stream == kernels[k].stream:
                self.active.append(j)
                return

    def _advance(self, c: int) -> None:
        waits, f, sem, epoch = self.lay.waits[c], self.frontier[c], self.sem, self.epoch
        while f < len(waits):
            gs, count, kc, r = waits[f]
            if sem[gs] < epoch * count:
                self.frontier[c] = f
                self.waiters.setdefault(gs, []).append(c)
                self.need[gs] = min(self.need[gs], epoch * count)
                return
            if self.posted[gs] < self.lay.posts[gs]:
                raise _Stop(self._early(c, f))
            f += 1
            self._reads(c, f)
        self.frontier[c] = f
        self.open[c] = True
        if self.blocked[c]:
            self.runnable.extend(self.blocked[c])
            self.blocked[c] = []

    def _reads(self, c: int, f: int) -> None:
        # A resident block of class c that has passed waits < f loads these chunks next.
        arrivals, splits, epoch = self.arrivals, self.lay.tile_splits, self.epoch
        for t, kc in self.lay.reads[c][f]:
            if arrivals[t] < epoch * splits[t]:
                raise _Stop(self._race(c, f, t, kc))

    # -- reports -----------------------------------------------------------------------------
    def _where(self, c: int) -> tuple[str, int, int]:
        st, cr, s = self.lay.class_info[c]
        grid = self.p.grids[st]
        nc = wait_columns(grid)
        if nc > 1:
            return _wait_row_tile(grid, cr, s), st, cr // nc
        resident = self.blocked[c]
        n = self.lay.blk_n[resident[0]] if resident else 0
        return _tile(grid, cr, n, s), st, cr

    def _early(self, c: int, f: int) -> str:
        lay = self.lay
        gs, count, kc, r = lay.waits[c][f]
        local = lay.sem_pair[gs][1]
        missing = next(t for t, sems in enumerate(lay.tile_post)
                       if gs in sems and self.arrivals[t] < self.epoch * lay.tile_splits[t])
        st, m1, n1 = lay.tile_name[missing]
        where, _, _ = self._where(c)
        return (f"{where} chunk {kc}: in run {self.epoch} its wait on semaphore {local} (row {r}) for "
                f"{self.epoch} x {count} passes with the counter at {self.sem[gs]}, but only {self.posted[gs]} of the "
                f"{lay.posts[gs]} producer tiles posting to it have posted in this run "
                f"({_tile(self.p.grids[st], m1, n1)} has not) [{self._context()}]")

    def _race(self, c: int, f: int, t: int, kc: int) -> str:
        st, m1, n1 = self.lay.tile_name[t]
        where, _, _ = self._where(c)
        passed = self.lay.waits[c][:f]
        waits = ", ".join(f"semaphore {self.lay.sem_pair[gs][1]} at chunk {k}" for gs, _, k, _ in passed[-3:])
        return (f"{where} chunk {kc}: in run {self.epoch} loads {_tile(self.p.grids[st], m1, n1)} before that tile "
                f"has posted in this run (waits passed so far: {waits or 'none'}) [{self._context()}]")

    def _deadlock(self) -> str:
        lay = self.lay
        stuck = []
        for c, blocks in enumerate(self.blocked):
            for b in blocks:
                gs, count, kc, r = lay.waits[c][self.frontier[c]]
                st = lay.stage[b]
                stuck.append(f"{_tile(self.p.grids[st], lay.blk_m[b], lay.blk_n[b], lay.blk_s[b])} at chunk {kc} "
                             f"waits on semaphore {lay.sem_pair[gs][1]} (row {r}) for {self.epoch * count}, "
                             f"it holds {self.sem[gs]}")
        for p in self.guard_waiting:
            g = self.p.grids[p]
            stuck.append(f"the guard waits for the blocks of all {g.blocks} {g.stage.name} tiles to start, "
                         f"those of {self.started[p] - (self.epoch - 1) * g.blocks} have")
        pending = [f"{k.name}: {len(k.units) - k.next}" for k in self.kernels if k.next < len(k.units)]
        shown = "; ".join(stuck[:3]) + (f"; and {len(stuck) - 3} more" if len(stuck) > 3 else "")
        state = (f"every one of the {self.sch.slots} slots holds a waiting block" if self.free == 0
                 else "no block can start or finish")
        return (f"deadlock: {state}: {shown}; blocks not yet "
                f"started: {', '.join(pending) or 'none'} [{self._context()}]")

    def _context(self) -> str:
        return f"{self.p.launch} launch, {self.p.dispatch} dispatch, schedule {self.sch.name}, {self.sch.slots} slots"


def simulate(protocol: Protocol, schedule: Schedule, runs: int = 1) -> str | None:
    """Run ``runs`` consecutive runs of ``protocol`` under ``schedule``; a message for the first problem, or None.

    The stream policy's launches are not simulated: their kernel boundaries finish every
    producer tile before a consumer block reads it, which is all the simulation would find.
    """
    if protocol.policy is None and protocol.launch in STREAM_ORDERED:
        return None
    for g in protocol.grids:
        msg = check_order(g, protocol.order)
        if msg:
            return msg
    if protocol.policy is not None:
        for p, c in protocol.pairs():
            msg = _check_shapes(protocol.grids[p], protocol.grids[c]) or \
                pair_model(protocol.grids[p], protocol.grids[c], protocol.policy).error
            if msg:
                return msg
    sim = _Sim(protocol, schedule)
    try:
        for epoch in range(1, runs + 1):
            sim.run(epoch)
    except _Stop as stop:
        return str(stop)
    return None


def check_deadlock(protocol: Protocol, *, slots: int, schedules: int = 2, seed: int = 0) -> str | None:
    """One run under every adversarial schedule and ``schedules`` random ones: can the blocks always finish?"""
    for sch in make_schedules(protocol, slots, schedules, seed):
        msg = simulate(protocol, sch, runs=1)
        if msg:
            return msg
    return None


def check_epochs(protocol: Protocol, *, slots: int, runs: int = 2, seed: int = 0) -> str | None:
    """``runs`` runs back to back, counters never reset, under the adversarial and one random schedule."""
    least = 2 if protocol.launch == "two_stream" and protocol.guard else 1
    rng = random.Random(seed)
    for sch in (Schedule("adversarial", slots),
                Schedule("random", rng.randint(min(least, slots), slots), "random", "random", eager=False, seed=seed)):
        msg = simulate(protocol, sch, runs=runs)
        if msg:
            return msg
    return None


# ---------------------------------------------------------------------------
# Everything, for one config


def check_protocol(protocol: Protocol, *, slots: int = 132, runs: int = 2, seed: int = 0,
                   schedules: int = 2) -> str | None:
    """Tile orders, then soundness of every pair, then deadlock freedom and epochs."""
    for g in protocol.grids:
        msg = check_order(g, protocol.order)
        if msg:
            return msg
    if protocol.policy is None:
        if protocol.launch not in STREAM_ORDERED:
            return f"a {protocol.launch} launch needs a sync policy: without one nothing orders the stages"
        return None  # kernel boundaries order everything: nothing waits, nothing can deadlock
    for p, c in protocol.pairs():
        msg = check_soundness(protocol.grids[p], protocol.grids[c], protocol.policy)
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
