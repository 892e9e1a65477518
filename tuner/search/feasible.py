"""The feasible set: every config of a search space that satisfies the hard constraints.

The full product is far too large to enumerate (two stages of a few thousand tilings each, times
the sync choices), so :class:`FeasibleSet` works in structure: it enumerates each stage's
feasible tilings (:mod:`tuner.search.constraints`), groups them by the few values the cross-stage
constraints read, and counts, ranks and samples exactly through those groups.
"""
from __future__ import annotations

import bisect
import copy
import hashlib
import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Container, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..chain.expr import Expr
from ..chain.tiling import may_persist
from ..chain.workloads import Chain
from ..config import GLOBAL_FIELDS, TILE_FIELDS, Config, StageGrid, StageTiles
from ..device import DeviceInfo
from ..sync.policies import POLICIES, cluster_allowed, grid_env, persistent_allowed
from .constraints import (
    BLOCK_CONSTRAINTS,
    BLOCK_FIELDS,
    PLACEMENT_CONSTRAINTS,
    chain_problem,
    combo_problem,
    stage_problem,
)


class SpaceView(Protocol):
    """What the feasible set reads of a search space (:class:`tuner.search.space.SearchSpace`): below the
    space, so that the space can build its feasible set without an import circle."""

    globals: Mapping[str, tuple[str, ...]]
    limits: Any

    def stage_domain(self, stage_name: str, m: int | None = None) -> dict[str, tuple[Any, ...]]: ...


@dataclass
class _Group:
    """Stage tilings that look alike to every cross-stage constraint."""

    tiles: list[StageTiles]
    key_in: tuple[int, ...]  # values read as the consumer of the previous stage
    key_out: tuple[int, ...]  # values read as the producer of the next stage
    threads: int | None  # only when a fused launch compares thread counts

    @property
    def state(self) -> tuple[tuple[int, ...], int | None]:
        return self.key_out, self.threads


class _Plan:
    """Exact counting and ranking of the stage tilings for one (policy, fused?) pair.

    ``ways[j][state]`` is the number of ways to complete stages j+1.. given stage
    j's state; ranks are then mixed-radix numbers over (group, tile in group). ``envs(g)``: a
    grid's values as producer and as consumer (:func:`tuner.sync.policies.grid_env`'s).
    """

    def __init__(self, chain: Chain, tilings: Sequence[Sequence[StageGrid]], requires: Expr | None, fused: bool,
                 envs: Callable[[StageGrid], tuple[Mapping[str, Any], Mapping[str, Any]]]):
        self.chain = chain
        self.requires = requires
        self.fused = fused
        names = sorted(requires.names) if requires is not None else []
        self.out_names = [n for n in names if n.endswith("1")]
        self.in_names = [n for n in names if n.endswith("2")]
        self.groups: list[list[_Group]] = []
        for grids in tilings:
            by_sig: dict[tuple, _Group] = {}
            for g in grids:
                out_env, in_env = envs(g)
                key_in = tuple(in_env[n] for n in self.in_names)
                key_out = tuple(out_env[n] for n in self.out_names)
                thr = g.tiles.threads if fused else None
                grp = by_sig.setdefault((key_in, key_out, thr), _Group([], key_in, key_out, thr))
                grp.tiles.append(g.tiles)
            self.groups.append(sorted(by_sig.values(), key=lambda x: (x.key_in, x.key_out, x.threads or 0)))
        self._cands: dict[tuple[int, Any], list[_Group]] = {}
        n = len(tilings)
        self.ways: list[dict[Any, int]] = [dict() for _ in range(n)]
        for grp in self.groups[n - 1]:
            self.ways[n - 1][grp.state] = 1
        for j in range(n - 2, -1, -1):
            for grp in self.groups[j]:
                s = grp.state
                if s not in self.ways[j]:
                    self.ways[j][s] = sum(len(c.tiles) * self.ways[j + 1][c.state] for c in self.candidates(j + 1, s))
        self.total = sum(len(c.tiles) * self.ways[0][c.state] for c in self.candidates(0, None))

    def _compatible(self, j: int, prev: Any, grp: _Group) -> bool:
        key_out, thr = prev
        if self.fused and thr != grp.threads:
            return False
        if self.requires is not None and self.chain.stages[j].a_from == j - 1:
            env = {**dict(zip(self.out_names, key_out)), **dict(zip(self.in_names, grp.key_in))}
            return bool(self.requires(env))
        return True

    def candidates(self, j: int, prev: Any) -> list[_Group]:
        """Groups of stage j that may follow a stage j-1 in state ``prev`` (None for the first stage)."""
        key = (j, prev)
        if key not in self._cands:
            self._cands[key] = [g for g in self.groups[j] if prev is None or self._compatible(j, prev, g)]
        return self._cands[key]

    def unrank(self, i: int) -> tuple[StageTiles, ...]:
        out: list[StageTiles] = []
        prev = None
        for j in range(len(self.groups)):
            for grp in self.candidates(j, prev):
                rest = self.ways[j][grp.state]
                weight = len(grp.tiles) * rest
                if i < weight:
                    out.append(grp.tiles[i // rest])
                    i %= rest
                    prev = grp.state
                    break
                i -= weight
            else:  # pragma: no cover - ranks are always below total
                raise IndexError("rank out of range")
        return tuple(out)


def _feistel(n: int, seed: int) -> Callable[[int], int]:
    """A seeded bijection of range(n), computed lazily (a small Feistel network with cycle walking)."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    keys = [hashlib.blake2b(f"tuner-grid:{seed}:{r}".encode(), digest_size=8).digest() for r in range(4)]

    def rnd(r: int, x: int) -> int:
        h = hashlib.blake2b(x.to_bytes(8, "little"), key=keys[r], digest_size=8).digest()
        return int.from_bytes(h, "little") & mask

    def enc(x: int) -> int:
        left, right = x >> half, x & mask
        for r in range(4):
            left, right = right, left ^ rnd(r, right)
        return (left << half) | right

    def perm(i: int) -> int:
        x = enc(i)
        while x >= n:  # stays inside range(n) because enc permutes the larger power-of-two range
            x = enc(x)
        return x

    return perm


# nearest() weighs this many of the closest global combinations, and of the closest tilings per stage.
_NEAR_COMBOS = 4
_NEAR_TILINGS = 8


def baseline_key(g: StageGrid, sms: int) -> tuple:
    """Ranks tilings for a stream baseline: fill up to two waves of SMs with as many blocks as possible."""
    t = g.tiles
    fits = g.blocks <= 2 * sms
    return (not fits, -g.blocks if fits else g.blocks, t.split_k, abs(t.warps - 4), -t.bk, abs(t.stages - 3),
            t.bm, t.bn, t.wm, t.wn, t.cluster)


class FeasibleSet:
    """The configs of a search space that satisfy every hard constraint for one chain and device.

    Optionally narrowed to an explicit list (what a replay backend has recordings for).
    """

    def __init__(self, chain: Chain, device: DeviceInfo, space: SpaceView):
        for j, st in enumerate(chain.stages):
            # The solver chains pair constraints stage to stage, so a consumer must read its direct predecessor.
            if st.a_from not in (None, j - 1):
                raise NotImplementedError(f"stage {st.name} reads stage {st.a_from}, not the one just before it")
        self.chain = chain
        self.device = device
        self.space = space
        self.stage_names = chain.stage_names
        self.domains_space: list[dict[str, tuple[int, ...]]] = [space.stage_domain(s.name, s.m) for s in chain.stages]
        self._rejections: list[dict[str, int]] = []
        self.tilings: list[list[StageGrid]] = []
        for stage, dom in zip(chain.stages, self.domains_space):
            ok, rejected = self._stage_tilings(stage, dom)
            self.tilings.append(ok)
            self._rejections.append(rejected)
        self.combos: list[tuple[str, ...]] = [
            combo for combo in itertools.product(*(space.globals[f] for f in GLOBAL_FIELDS))
            if combo_problem(combo, chain, device) is None]
        self._plans: dict[tuple[str, bool, bool, bool], _Plan] = {}
        self._env_cache: dict[int, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
        counts = [self._plan(c).total for c in self.combos]
        self._combo_counts = counts
        self._prefix = list(itertools.accumulate(counts))
        self._explicit: list[Config] | None = None  # set by restricted_to
        self._explicit_from = 0

    # -- construction helpers

    def _stage_reason(self, g: StageGrid) -> tuple[str, str] | None:
        return stage_problem(g, self.space.limits, self.device)

    def _stage_tilings(self, stage: Any, dom: Mapping[str, Sequence[Any]]) -> tuple[list[StageGrid], dict[str, int]]:
        """The tilings of ``dom`` that every per-stage constraint accepts, in the order of the
        product of TILE_FIELDS' values, and how many each constraint rejected first.

        The block constraints are judged once per block shape: where one rejects it, every split
        and cluster of it counts as rejected by that one (reading none of those fields, it would
        have been the first to reject each). A persistent tile that may not persist (not TMA-fed,
        or split along K) is rejected as such before the rest are asked."""
        lim, dev = self.space.limits, self.device
        rest = tuple(f for f in TILE_FIELDS if f not in BLOCK_FIELDS)
        per_shape = int(np.prod([len(dom[f]) for f in rest]))
        ok: list[StageGrid] = []
        rejected: dict[str, int] = {}
        for shape in itertools.product(*(dom[f] for f in BLOCK_FIELDS)):
            base = dict(zip(BLOCK_FIELDS, shape))
            why = stage_problem(StageGrid(stage, StageTiles(**base)), lim, dev, BLOCK_CONSTRAINTS)
            if why is not None:
                rejected[why[0]] = rejected.get(why[0], 0) + per_shape
                continue
            for values in itertools.product(*(dom[f] for f in rest)):
                tiles = StageTiles(**base, **dict(zip(rest, values)))
                if tiles.persist and not may_persist(tiles.mma, tiles.split_k):
                    why = ("persistence", "")
                else:
                    g = StageGrid(stage, tiles)
                    why = stage_problem(g, lim, dev, PLACEMENT_CONSTRAINTS)
                if why is None:
                    ok.append(g)
                else:
                    rejected[why[0]] = rejected.get(why[0], 0) + 1
        position = {f: {v: i for i, v in enumerate(dom[f])} for f in TILE_FIELDS}
        ok.sort(key=lambda g: tuple(position[f][getattr(g.tiles, f)] for f in TILE_FIELDS))
        return ok, rejected

    def _envs(self, g: StageGrid) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """``g``'s values as a producer and as a consumer (grid_env), computed once for all plans."""
        key = id(g)  # the grids live in self.tilings as long as the set
        if key not in self._env_cache:
            self._env_cache[key] = (grid_env(g, "1"), grid_env(g, "2"))
        return self._env_cache[key]

    def _plan(self, combo: tuple[str, ...]) -> _Plan:
        policy, _order, dispatch, launch, _prefetch = combo
        clusters = cluster_allowed(dispatch, launch) is None
        persistent = persistent_allowed(dispatch, launch) is None
        tail = persistent_allowed(dispatch, launch, tail_split=True, policy=policy) is None
        fused = launch == "fused"
        key = (policy, fused, clusters, persistent, tail)
        if key not in self._plans:
            pol = POLICIES[policy]
            # A fused launch takes no tile that reallocates registers (see fused_threads).
            tilings = [[g for g in gs if (clusters or g.tiles.cluster == 1) and (persistent or not g.tiles.persistent)
                        and (tail or not g.tiles.tail_split) and not (fused and g.tiles.realloc)]
                       for gs in self.tilings]
            self._plans[key] = _Plan(self.chain, tilings, pol.requires if pol else None, key[1], self._envs)
        return self._plans[key]

    # -- public interface

    def accepts_tiling(self, j: int, tiles: StageTiles) -> bool:
        """Whether stage ``j`` may use ``tiles`` (every per-stage constraint holds; the domain is not asked)."""
        return self._stage_reason(StageGrid(self.chain.stages[j], tiles)) is None

    @property
    def explicit(self) -> bool:
        """True when narrowed to a list of configs."""
        return self._explicit is not None

    @property
    def size(self) -> int:
        """Exact number of feasible configs."""
        if self._explicit is not None:
            return len(self._explicit)
        return self._prefix[-1] if self._prefix else 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Config) and self.contains(config) is None

    def __iter__(self) -> Iterator[Config]:
        return self.grid(0)

    @cached_property
    def reasons(self) -> list[str]:
        """When the set is empty: which constraints emptied it (empty list otherwise)."""
        if self.size:
            return []
        out = []
        for name, tilings, rej in zip(self.stage_names, self.tilings, self._rejections):
            if not tilings:
                detail = ", ".join(f"{k} rejected {v}" for k, v in sorted(rej.items(), key=lambda kv: -kv[1]))
                out.append(f"stage {name} has no feasible tiling ({detail})")
        if not self.combos:
            out.append("no policy/order/dispatch/launch/prefetch combination is allowed (launch_mode: the stream "
                       "policy runs only in the serial and pdl launches, the others in two_stream or fused, and fused "
                       "needs ticket dispatch; prefetch_fits: an L2 prefetch needs Hopper and inputs that fit L2)")
        if not out and self._explicit is None:
            out.append("every combination of stage tilings breaks a cross-stage constraint "
                       "(policy_requires, fused_threads, cluster_launch or persistent_launch)")
        if not out and self._explicit is not None:
            out.append(f"none of the {self._explicit_from} recorded configs is inside the search space")
        return out

    def contains(self, config: Config) -> str | None:
        """Why ``config`` is not in the set (naming the constraint), or None when it is."""
        why = self._structural_reason(config)
        if why is None and self._explicit is not None and config not in self._explicit_set:
            why = "recorded: no recorded measurement of this config for " + self.chain.label
        return why

    @cached_property
    def _explicit_set(self) -> frozenset[Config]:
        return frozenset(self._explicit or ())

    def _structural_reason(self, config: Config) -> str | None:
        if len(config.tiles) != len(self.stage_names):
            return f"stages: {self.chain.workload} has {len(self.stage_names)} stages, the config {len(config.tiles)}"
        for name, t, dom in zip(self.stage_names, config.tiles, self.domains_space):
            for f in TILE_FIELDS:
                if getattr(t, f) not in dom[f]:
                    return (f"domain: {name}.{f}={getattr(t, f)} is outside the search space "
                            f"(accepted: {', '.join(map(str, dom[f]))})")
        for f in GLOBAL_FIELDS:
            if getattr(config, f) not in self.space.globals[f]:
                return (f"domain: {f}={getattr(config, f)} is outside the search space "
                        f"(accepted: {', '.join(self.space.globals[f])})")
        grids = config.grids(self.chain)
        for g in grids:
            why = self._stage_reason(g)
            if why is not None:
                return f"{why[0]}: {g.stage.name}: {why[1]}"
        problem = chain_problem(config, self.chain, self.device, grids)
        return f"{problem[0]}: {problem[1]}" if problem is not None else None

    def unrank(self, i: int) -> Config:
        """The i-th feasible config in canonical order, 0 <= i < size."""
        if not 0 <= i < self.size:
            raise IndexError(f"rank {i} outside 0..{self.size - 1}")
        if self._explicit is not None:
            return self._explicit[i]
        c = bisect.bisect_right(self._prefix, i)
        combo = self.combos[c]
        local = i - (self._prefix[c - 1] if c else 0)
        return Config(self._plan(combo).unrank(local), *combo)

    def sample(self, rng: np.random.Generator, combo: tuple[str, ...] | None = None) -> Config:
        """One config drawn uniformly from the set, or from its configs of one sync ``combo``."""
        if combo is None:
            if not self.size:
                raise ValueError("cannot sample from an empty feasible set")
            return self.unrank(int(rng.integers(self.size)))
        if self._explicit is not None:
            mine = [c for c in self._explicit if c.globals == combo]
            if not mine:
                raise ValueError(f"no feasible config with sync choice {combo}")
            return mine[int(rng.integers(len(mine)))]
        c = self.combos.index(combo)
        if not self._combo_counts[c]:
            raise ValueError(f"no feasible config with sync choice {combo}")
        return Config(self._plan(combo).unrank(int(rng.integers(self._combo_counts[c]))), *combo)

    def grid(self, seed: int = 0) -> Iterator[Config]:
        """Every feasible config exactly once, in a shuffled order fixed by ``seed``; lazy."""
        n = self.size
        if n == 0:
            return
        perm = _feistel(n, seed)
        for k in range(n):
            yield self.unrank(perm(k))

    def nearest(self, config: Config, exclude: Container[Config] = (),
                accept: Callable[[Config], bool] | None = None) -> Config | None:
        """A feasible config differing from ``config`` in as few parameters as possible.

        Configs in ``exclude`` and those ``accept`` refuses are passed over. Ties go to the
        canonical order, so the answer is deterministic. On a structured set the search
        weighs the closest few global combinations and stage tilings only, and may return
        None although a farther config is left; callers then draw one at random.
        """
        target = config.params(self.stage_names)

        def distance(c: Config) -> int:
            return sum(target.get(k) != v for k, v in c.params(self.stage_names).items())

        def usable(c: Config) -> bool:
            return c not in exclude and (accept is None or accept(c))

        if self._explicit is not None:
            ranked = sorted((distance(c), i) for i, c in enumerate(self._explicit) if c not in exclude)
            return next((self._explicit[i] for _, i in ranked if usable(self._explicit[i])), None)
        wanted = tuple(getattr(config, f) for f in GLOBAL_FIELDS)
        combos = sorted((c for c, n in zip(self.combos, self._combo_counts) if n),
                        key=lambda c: sum(a != b for a, b in zip(c, wanted)))[:_NEAR_COMBOS]
        per_stage = []
        for j, grids in enumerate(self.tilings):
            t = config.tiles[j] if j < len(config.tiles) else None
            per_stage.append(sorted(grids, key=lambda g: 0 if t is None else
                                    sum(getattr(g.tiles, f) != getattr(t, f) for f in TILE_FIELDS))[:_NEAR_TILINGS])
        candidates = [Config(tuple(g.tiles for g in tiles), *combo)
                      for combo in combos for tiles in itertools.product(*per_stage)]
        for _, i in sorted((distance(c), i) for i, c in enumerate(candidates)):
            if self.contains(candidates[i]) is None and usable(candidates[i]):
                return candidates[i]
        return None

    def baselines(self, limit: int = 3) -> list[Config]:
        """Stream-policy configs to measure first: serial kernels with tilings that fill the GPU.

        Per stage, the tilings are ranked by :func:`baseline_key`; baseline k pairs
        each stage's k-th best. Deterministic; empty when the space has no stream policy.
        """
        sms = self.device.sms
        if self._explicit is not None:
            streams = [c for c in self._explicit if c.policy == "stream"]
            streams.sort(key=lambda c: tuple(baseline_key(g, sms) for g in c.grids(self.chain))
                         + ((c.order, c.dispatch) != ("row", "block"), c.order, c.dispatch))
            return streams[:limit]
        combo = self._stream_combo()
        if combo is None:
            return []
        ranked = [sorted(grids, key=lambda g: baseline_key(g, sms)) for grids in self.tilings]
        out: list[Config] = []
        for k in range(limit):
            cfg = Config(tuple(r[min(k, len(r) - 1)].tiles for r in ranked), *combo)
            if cfg not in out:
                out.append(cfg)
        return out

    def _stream_combo(self) -> tuple[str, ...] | None:
        """The plainest stream combination: serial kernels, row order, block dispatch, no prefetch."""
        streams = [c for c in self.combos if c[0] == "stream"]
        if not streams or not all(self.tilings):
            return None
        return min(streams, key=lambda c: (c[3] != "serial", c[4] != "none", (c[1], c[2]) != ("row", "block"), c))

    def domains(self) -> dict[str, list]:
        """Per Optuna parameter, the values some feasible config uses, in the space's order.

        A superset is fine (a sampler may still propose infeasible combinations), but
        every feasible value is present, and the result depends only on the space,
        chain, device (and the explicit list), so it is stable across resumed runs.
        """
        out: dict[str, list] = {}
        if self._explicit is not None:
            used: dict[str, set] = {}
            for c in self._explicit:
                for k, v in c.params(self.stage_names).items():
                    used.setdefault(k, set()).add(v)
            order = self.param_order()
            return {k: [v for v in order[k] if v in used.get(k, ())] for k in order}
        live = [c for c, n in zip(self.combos, self._combo_counts) if n]
        for name, grids, dom in zip(self.stage_names, self.tilings, self.domains_space):
            for f in TILE_FIELDS:
                present = {getattr(g.tiles, f) for g in grids}
                out[f"{name}.{f}"] = [v for v in dom[f] if v in present]
        for k, f in enumerate(GLOBAL_FIELDS):
            present = {c[k] for c in live}
            out[f] = [v for v in self.space.globals[f] if v in present]
        return out

    def param_order(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for name, dom in zip(self.stage_names, self.domains_space):
            for f in TILE_FIELDS:
                out[f"{name}.{f}"] = list(dom[f])
        for f in GLOBAL_FIELDS:
            out[f] = list(self.space.globals[f])
        return out

    def restricted_to(self, configs: Iterable[Config]) -> "FeasibleSet":
        """The feasible configs among ``configs`` (order kept, duplicates dropped)."""
        narrowed = copy.copy(self)
        for cached in ("reasons", "_explicit_set"):
            narrowed.__dict__.pop(cached, None)
        configs = list(configs)
        keep, seen = [], set()
        for c in configs:
            if c not in seen and self._structural_reason(c) is None:
                seen.add(c)
                keep.append(c)
        narrowed._explicit = keep
        narrowed._explicit_from = len(configs)
        return narrowed
