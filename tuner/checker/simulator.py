"""The discrete-event simulation of resident blocks: deadlock freedom and epochs under adversarial and
seeded random schedules (see :mod:`tuner.checker` for what it models).
"""
from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..chain.kinds import kind_of
from ..chain.workloads import edges
from ..config import StageGrid
from ..sync.policies import (
    STREAM_ORDERED,
    SyncPolicy,
    TileOrder,
)
from .model import NEVER, Protocol, check_shapes, pair_model, tile_name, tile_order, wait_columns, wait_row_tile
from .soundness import check_order

_FEW_SLOTS = (1, 2, 3)


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
    pairs = edges([g.stage for g in grids])
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
        self._begin(epoch)
        random_, eager, runnable = self.rng.random, self.sch.eager, self.runnable
        while self.left:
            if self.free and self.active and (eager or not runnable or random_() < 0.5):
                i = self._pick()
                if not self._skip_inert(i):
                    self._start(i)
            elif runnable:
                self._finish(self._batch())
            else:
                raise _Stop(self._deadlock())

    def _begin(self, epoch: int) -> None:
        """The kernels of run ``epoch`` and the state of every class, before any block starts."""
        lay = self.lay
        self.epoch = epoch
        kernels = self.kernels = self._kernels()
        self.stage_kernel = [0] * len(self.p.grids)  # the kernel running each stage's blocks
        self.guard_kernel: dict[int, int] = {}
        for k, kern in enumerate(kernels):
            if kern.units[0] < 0:
                self.guard_kernel[kern.units[0]] = k
            elif self.p.launch != "fused":
                self.stage_kernel[lay.stage[kern.units[0]]] = k
        # A guard ranks with the consumer it holds back, so "late" starts it as early as allowed.
        self.rank = [-kern.units[0] if kern.units[0] < 0 else lay.stage[kern.units[0]] for kern in kernels]
        self.active = [k for k, kern in enumerate(kernels) if all(kernels[j].stream != kern.stream for j in range(k))]
        self.runnable: list[int] = []
        self.frontier = [0] * len(lay.waits)
        self.open = [False] * len(lay.waits)
        self.blocked: list[list[int]] = [[] for _ in lay.waits]
        self.waiters: dict[int, list[int]] = {}  # classes stopped at a wait, by semaphore
        self.need = [NEVER] * len(lay.posts)  # the lowest value one of them waits for
        self.guard_waiting: dict[int, int] = {}
        self.posted = [0] * len(lay.posts)  # posts made in this run, per semaphore
        for c in range(len(lay.waits)):
            self._reads(c, 0)  # chunks before a class's first wait: any block of it may load them now
            self._advance(c)
        # the tiles (or the guard) each kernel finishes; it starts len(units) blocks
        self.sizes = [sum(self.weight[u] if u >= 0 else 1 for u in kern.units) for kern in kernels]
        self.left = sum(self.sizes)
        self.free = self.sch.slots
        self.blocks = [g.blocks for g in self.p.grids]
        self.inert = [not posts and i not in self.guarded for i, posts in enumerate(lay.stage_posts)]
        # A tile policy's pdl launch: the next kernel may start once every block of this one has.
        self.dependent = self.p.launch == "pdl" and self.p.policy is not None
        self.inert_kernel = [self.p.launch == "fused" or (kern.units[0] >= 0 and self.inert[lay.stage[kern.units[0]]])
                             for kern in kernels]

    def _pick(self) -> int:
        """Which active kernel starts blocks next: its index in ``active``."""
        active, pick = self.active, self.sch.pick
        if len(active) == 1:
            return 0
        if pick == "random":
            return int(self.rng.random() * len(active))
        ranks = [self.rank[k] for k in active]
        return ranks.index(max(ranks) if pick == "late" else min(ranks))

    def _skip_inert(self, i: int) -> bool:
        """Start and finish at once the inert blocks next in kernel ``active[i]``; whether any were.

        A block that can run to its end when it starts and posts nothing changes nothing but counts
        when it finishes; holding its slot longer never leads anywhere that finishing at once does
        not (a deadlock needs every resident block waiting). So a stretch of them starts and
        finishes in one tight loop.
        """
        k = self.active[i]
        if not self.inert_kernel[k]:
            return False
        kern = self.kernels[k]
        units, nxt, n = kern.units, kern.next, len(kern.units)
        stage_of, cls_of, inert, opened, succ = self.lay.stage, self.lay.cls, self.inert, self.open, self.succ
        started, weight = self.started, self.weight
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
        if j == nxt:
            return False
        kern.next = j
        kern.done += tiles
        self.left -= tiles
        if j == n:
            self.active.pop(i)
            if kern.done == self.sizes[k] or self.dependent:
                self._next_on_stream(k)
        return True

    def _start(self, i: int) -> None:
        """Start blocks of kernel ``active[i]``: eager, every free slot; otherwise a random number."""
        k = self.active[i]
        kern = self.kernels[k]
        units, nxt, n = kern.units, kern.next, len(kern.units)
        end = nxt + (self.free if self.sch.eager else 1 + int(self.rng.random() * self.free))
        if end >= n:
            end = n
            self.active.pop(i)
        kern.next = end
        self.free -= end - nxt
        stage_of, cls_of, opened, started, weight = self.lay.stage, self.lay.cls, self.open, self.started, self.weight
        runnable, blocked, guard_waiting, epoch = self.runnable, self.blocked, self.guard_waiting, self.epoch
        blocks = self.blocks
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
        if self.dependent and end == n:
            self._next_on_stream(k)  # every block of it has started: its dependent launch may go

    def _batch(self) -> list[int]:
        """The runnable blocks that finish next. Eager: every one, newest first (freed slots are then
        refilled, consumers first). Otherwise a random number of them, picked at random."""
        runnable, random_ = self.runnable, self.rng.random
        if self.sch.eager:
            batch = runnable[::-1]
            runnable.clear()
            return batch
        batch = []
        for _ in range(1 + int(random_() * len(runnable))):
            j = int(random_() * len(runnable))
            runnable[j], runnable[-1] = runnable[-1], runnable[j]
            batch.append(runnable.pop())
        return batch

    def _finish(self, batch: list[int]) -> None:
        """Blocks (or guards) finish: their tiles post, and a persistent block goes on to its next tile."""
        self.left -= len(batch)
        lay, kernels, sem, posted, need, waiters = self.lay, self.kernels, self.sem, self.posted, self.need, self.waiters
        arrivals, succ, opened, epoch = self.arrivals, self.succ, self.open, self.epoch
        for u in batch:
            k = self.guard_kernel[u] if u < 0 else self.stage_kernel[lay.stage[u]]
            kern = kernels[k]
            kern.done += 1
            if kern.done == self.sizes[k]:
                self._next_on_stream(k)
            if u < 0:
                self.free += 1
                continue
            t = lay.tile[u]
            arrivals[t] += 1
            if arrivals[t] == epoch * lay.tile_splits[t]:  # the last split to arrive posts
                for gs in lay.tile_post[t]:
                    sem[gs] += 1
                    posted[gs] += 1
                    if sem[gs] >= need[gs]:
                        need[gs] = NEVER
                        for c in waiters.pop(gs):
                            self._advance(c)
            v = succ[u]
            if v < 0:
                self.free += 1
                continue
            c = lay.cls[v]  # the same slot, the block's next tile
            if c < 0 or opened[c]:
                self.runnable.append(v)
            else:
                self.blocked[c].append(v)

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
            return wait_row_tile(grid, cr, s), st, cr // nc
        resident = self.blocked[c]
        n = self.lay.blk_n[resident[0]] if resident else 0
        return tile_name(grid, cr, n, s), st, cr

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
                f"({tile_name(self.p.grids[st], m1, n1)} has not) [{self._context()}]")

    def _race(self, c: int, f: int, t: int, kc: int) -> str:
        st, m1, n1 = self.lay.tile_name[t]
        where, _, _ = self._where(c)
        passed = self.lay.waits[c][:f]
        waits = ", ".join(f"semaphore {self.lay.sem_pair[gs][1]} at chunk {k}" for gs, _, k, _ in passed[-3:])
        return (f"{where} chunk {kc}: in run {self.epoch} loads {tile_name(self.p.grids[st], m1, n1)} before that tile "
                f"has posted in this run (waits passed so far: {waits or 'none'}) [{self._context()}]")

    def _deadlock(self) -> str:
        lay = self.lay
        stuck = []
        for c, blocks in enumerate(self.blocked):
            for b in blocks:
                gs, count, kc, r = lay.waits[c][self.frontier[c]]
                st = lay.stage[b]
                stuck.append(f"{tile_name(self.p.grids[st], lay.blk_m[b], lay.blk_n[b], lay.blk_s[b])} at chunk {kc} "
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
            msg = check_shapes(protocol.grids[p], protocol.grids[c]) or \
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
