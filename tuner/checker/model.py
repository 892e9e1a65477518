"""The checker's model of a chain: its formulas evaluated as arrays, its tiles in the order they run, and
which producer tiles each consumer chunk reads and waits on, derived from the index maps and the tilings.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..chain.expr import Expr
from ..chain.kinds import kind_of
from ..chain.workloads import Chain, edges
from ..config import Config, StageGrid
from ..sync.policies import (
    DISPATCHES,
    LAUNCHES,
    ORDERS,
    POLICIES,
    SyncPolicy,
    TileOrder,
    order_env,
    pair_env,
    policy_for,
)

NEVER = np.iinfo(np.int64).max


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
        return edges([g.stage for g in self.grids])


def tile_name(grid: StageGrid, m: int, n: int | str, s: int | None = None) -> str:
    split = f", s={s}" if s is not None else ""
    return f"{grid.stage.name} tile (m={m}, n={n}{split})"


def wait_columns(consumer: StageGrid) -> int:
    """How many tile columns of the consumer wait differently: all of them where its kind's reads
    depend on the tile's column (``PER_COLUMN``), else one. A consumer **wait row** ``cr`` is then
    tile row ``cr // wait_columns`` and, where they differ, column ``cr % wait_columns``."""
    return consumer.nt if kind_of(consumer.stage).PER_COLUMN else 1


def wait_row_tile(consumer: StageGrid, cr: int, s: int | None = None) -> str:
    nc = wait_columns(consumer)
    return tile_name(consumer, cr // nc, cr % nc, s)


@lru_cache(maxsize=256)
def tile_order(grid: StageGrid, order: TileOrder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tile (m, n, s) of every ticket 0..blocks-1 of one stage."""
    t = np.arange(grid.blocks, dtype=np.int64)
    env = {**order_env(grid), "t": t}
    return tuple(evaluate(e, env, t.shape).copy() for e in (order.m, order.n, order.s))  # type: ignore[return-value]


def check_shapes(producer: StageGrid, consumer: StageGrid) -> str | None:
    return kind_of(consumer.stage).check_shapes(producer, consumer)


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
        return fail(f"{tile_name(producer, m1, n1)} posts to semaphore {post[m1, n1]}, outside the policy's "
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
                return fail(f"{wait_row_tile(consumer, i, consumer.split_of(k))} chunk {k}: waits on producer tile "
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
        return fail(f"{wait_row_tile(consumer, int(model.m2[j]), consumer.split_of(k))} chunk {k}: waits (row "
                    f"{model.r[j]}) on semaphore {model.sem[j]}, outside the policy's {sems} semaphores [0, {sems})")
    return model
