"""Soundness, checked exhaustively: every consumer chunk is read only after waits that cover every producer
tile writing it; a residual is read only from producer tiles those waits reach; a normed stage's rows
are read whole only after waits that cover them; and every tile order visits each tile once.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ..chain import norm, residual
from ..chain.gemm import producer_cols
from ..chain.kinds import kind_of
from ..config import StageGrid
from ..sync.policies import (
    SyncPolicy,
    TileOrder,
    pair_env,
    policy_for,
)
from .model import NEVER, PairModel, check_shapes, pair_model, tile_name, tile_order, wait_columns, wait_row_tile


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
                f"{tile_name(grid, k // (nt * sk), (k // sk) % nt, k % sk)}, so another tile never runs")
    return None


def check_soundness(producer: StageGrid, consumer: StageGrid, policy: SyncPolicy) -> str | None:
    """Whether every chunk a consumer block loads is covered by the waits it issued up to that chunk.

    The tiles a chunk reads come from the consumer kind's index map and the producer's tiling;
    a wait covers a tile only if it waits for exactly the number of tiles posting to
    its semaphore. Blocks of one tile row and split issue the same waits (the formulas
    do not read ``n2``), so the message names column ``n=0`` for all of them.
    """
    shapes = check_shapes(producer, consumer)
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
        covered = np.full(key.shape, NEVER)
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
    where = (f"{wait_row_tile(cons, m2, s)} chunk {kc} ({kind_of(cons.stage).chunk_columns(cons, kc)}) reads "
             f"{tile_name(prod, m1, n1)} (rows {m1 * prod.tiles.bm}..{min((m1 + 1) * prod.tiles.bm, prod.stage.m) - 1}, "
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


def tiles_read(producer: StageGrid, consumer: StageGrid) -> np.ndarray:
    """``[consumer tile, producer tile]`` (tiles numbered ``m * NT + n``): whether any split of the
    consumer tile reads the producer tile, from the consumer kind's index map."""
    out = np.zeros((consumer.mt * consumer.nt, producer.mt * producer.nt), bool)
    nc = wait_columns(consumer)
    for cr, (_, m1, n1, _) in enumerate(kind_of(consumer.stage).reads(producer, consumer)):
        m2, n2 = cr // nc, cr % nc
        cols = np.arange(consumer.nt) if nc == 1 else np.array([n2])
        out[np.ix_(m2 * consumer.nt + cols, m1 * producer.nt + n1)] = True
    return out


def residual_tiles(producer: StageGrid, consumer: StageGrid) -> np.ndarray:
    """``[consumer tile, producer tile]``: whether the consumer tile's residual add reads the producer
    tile's output (the same rows, and the stored columns of the tile's accumulator columns)."""
    st, t = consumer.stage, consumer.tiles
    lo, hi = producer_cols(producer)
    bm1 = producer.tiles.bm
    out = np.zeros((consumer.mt * consumer.nt, producer.mt * producer.nt), bool)
    for m2 in range(consumer.mt):
        r0, r1 = m2 * t.bm, min(m2 * t.bm + t.bm, st.m) - 1
        m1 = np.arange(r0 // bm1, r1 // bm1 + 1)
        for n2 in range(consumer.nt):
            c0, c1 = n2 * t.bn // st.fold, min((n2 + 1) * t.bn, st.n) // st.fold  # stored columns [c0, c1)
            n1 = np.flatnonzero((lo < c1) & (hi > c0))
            out[np.ix_([m2 * consumer.nt + n2], (m1[:, None] * producer.nt + n1[None, :]).ravel())] = True
    return out


def check_residual(grids: Sequence[StageGrid], c: int) -> str | None:
    """Whether stage ``c`` reads its residual (an earlier stage ``p``'s output) only from tiles of ``p``
    that its A operand's reads reach: the tiles its A producer ``q`` read before posting, and so on
    back to ``p``. The pairs' soundness proves each of those reads waited for before it, so the
    waits that precede a tile's epilogue (every split's, met before the epilogue) are released
    after ``p``'s stores, through the chain of posts between."""
    st = grids[c].stage
    p = residual.source(st)
    if p is None or p == residual.INPUT:
        return None
    reach, cur = None, c
    while cur != p:
        q = grids[cur].stage.a_from
        if q is None or q < p:
            return (f"{st.name}: its residual is {grids[p].stage.name}'s output, which its A operand does not "
                    f"read, directly or through the stages between; accepted: a stage its A operand comes from")
        step = tiles_read(grids[q], grids[cur])
        reach = step if reach is None else (reach.astype(np.int64) @ step.astype(np.int64)) > 0
        cur = q
    miss = np.argwhere(residual_tiles(grids[p], grids[c]) & ~reach)
    if miss.size:
        t2, t1 = (int(v) for v in miss[0])
        cons, prod = grids[c], grids[p]
        return (f"{tile_name(cons, t2 // cons.nt, t2 % cons.nt)} adds {tile_name(prod, t1 // prod.nt, t1 % prod.nt)} "
                f"as its residual, which none of the tiles its A operand reads has read before posting")
    return None


def check_norm_rows(producer: StageGrid, consumer: StageGrid, policy: SyncPolicy) -> str | None:
    """Whether a normed consumer's row read is covered: before its mainloop, every split of a tile
    issues the waits of all the tile's chunks, the first as its first, then reads the rows whole, so
    those are the waits of the tile unsplit, which must cover every chunk's reads."""
    if not norm.has(consumer.stage) or consumer.tiles.split_k == 1:
        return None  # unsplit, the prologue's waits are the mainloop's, which check_soundness covers
    whole = StageGrid(consumer.stage, replace(consumer.tiles, split_k=1))  # a normed tile is never persistent
    msg = check_soundness(producer, whole, policy)
    return f"{consumer.stage.name}'s norm reads its rows whole: {msg}" if msg else None
