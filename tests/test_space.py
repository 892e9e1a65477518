"""The search space file format and the hard-constraint solver."""
from __future__ import annotations

import itertools
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tuner.backends.base import DeviceInfo
from tuner.chain.gemm import GemmStage
from tuner.chain.tiling import fitted_heights
from tuner.chain.workloads import get_workload
from tuner.config import GLOBAL_FIELDS, TILE_DEFAULTS, TILE_FIELDS, Config, StageGrid, StageTiles
from tuner.paths import home
from tuner.search.constraints import BLOCK_CONSTRAINTS, BLOCK_FIELDS, STAGE_CONSTRAINTS, stage_problem
from tuner.search.space import SpaceError, load_space, parse_space

H200 = DeviceInfo("test H200")
# Small enough to enumerate every combination, tight enough that every constraint bites.
TINY = {
    "stage": {"bm": [16, 32], "bn": [64, 96, 256], "bk": [32, 64], "wm": [1, 2], "wn": [1, 2], "stages": [2],
              "split_k": [1, 3]},
    "global": {"policy": ["stream", "tile", "row"], "order": ["row"], "dispatch": ["block", "ticket"],
               "launch": ["serial", "two_stream", "fused"], "prefetch": ["none", "l2"]},
    "limits": {"max_threads": 64, "max_tile_regs": 128},
}
TINY_DEVICE = DeviceInfo("tiny", smem_per_block=48 * 1024)
# The same, mixing mma.sync and wgmma tilings.
TINY_WG = {**TINY, "stage": {"bm": [16, 64], "bn": [64, 256], "bk": [32, 64], "wm": [1], "wn": [1, 2],
                             "stages": [2, 3], "split_k": [1, 3], "mma": ["sync", "wgmma", "wgmma_tma", "wgmma_tma_t"]},
           "limits": {"max_threads": 256, "max_tile_regs": 128}}
WG_DEVICE = DeviceInfo("tiny hopper", smem_per_block=100 * 1024)


@lru_cache(maxsize=None)  # one enumeration per shipped space and size: the tests only read it
def shipped(name: str, tokens: int):
    return load_space(home() / "search_spaces" / f"{name}.toml").feasible(get_workload(name).chain(tokens=tokens), H200)


def tiny_chain():
    # gemm1: M=16 N=128 K=256, gemm2: M=16 N=256 K=128
    return get_workload("gpt3").chain(tokens=16, hidden=256, ffn=128)


def parked_bytes(t: StageTiles, st) -> int:
    """What a persistent tile's epilogue parks beside the ring, written out case by case."""
    out = t.bn // st.fold
    boxes_ok = out % 64 == 0 and st.n_out % 8 == 0
    if t.mma == "wgmma_tma_t":
        rows = min(t.bm, 64)
        if boxes_ok and out == t.bn and rows % 16 == 0 and t.bm % rows == 0:
            # by stmatrix for the TMA: 64 rows of every column at a time, two slices if the tile has more
            return 1024 + (2 if t.bm > rows else 1) * t.bn * rows * 2
        return rows * (t.bn + 4) * 4  # fp32 rows, padded by 4 floats
    if boxes_ok:
        share = out // t.wn  # one 64-column box of each warp column's share a round, two slices by turns
        if out % t.wn == 0 and share % 64 == 0 and share >= 128:
            return 1024 + 2 * t.wn * 64 * t.bm * 2
        return 1024 + t.bm * out * 2  # the whole tile in one round
    return t.bm * (out + 8) * 2 * (out % 8 == 0)  # halves, rows padded by 8


def reference_feasible(chain, cfg: Config, dev: DeviceInfo, max_threads: int, max_regs: int,
                       max_cluster: int = 8) -> bool:
    """The constraints restated from their definitions, independently of the solver."""
    shifts = []  # per stage: whether its tile moves registers from its producer (setmaxnreg)
    for st, t in zip(chain.stages, cfg.tiles):
        # persistent blocks: TMA-fed whole tiles, more of them than one block per SM in whole
        # clusters, block dispatch outside a fused launch; the last wave split along K (2) under
        # the stream policy without a cluster, where the tiles leave it partly empty and cutting
        # each of its tiles at one K chunk into a first part and a rest that the free blocks share
        # ends it sooner
        tiles, resident = -(-st.m // t.bm) * -(-st.n // t.bn), dev.sms // (t.cm * t.cn) * (t.cm * t.cn)
        if t.persist not in (0, 1, 2) or t.persist and (
                t.mma not in ("wgmma_tma", "wgmma_tma_t") or t.split_k > 1 or tiles <= resident
                or cfg.dispatch != "block" or cfg.launch == "fused"):
            return False
        if t.persist == 2 and cfg.policy != "stream":
            return False
        if t.persist == 2:
            kc, tail = -(-st.k // t.bk), tiles % resident
            rests_per_free_block = -(-tail // (resident - tail))  # ceil
            split = round(kc * rests_per_free_block / (rests_per_free_block + 1) + 1e-9)
            if t.cm * t.cn > 1 or tail == 0 or kc < 2 or not max(split, rests_per_free_block * (kc - split)) < kc:
                return False
        if t.cm * t.cn > 1 and (t.mma not in ("wgmma_tma", "wgmma_tma_t") or t.cm * t.cn > max_cluster or -(-st.m // t.bm) % t.cm
                                or -(-st.n // t.bn) % t.cn or cfg.dispatch != "block" or cfg.launch == "fused"):
            return False
        kc = -(-st.k // t.bk)
        m_cap = max(16, 1 << (st.m - 1).bit_length())
        n_cap = max(64, 1 << (st.n - 1).bit_length())
        if t.mma == "wgmma_tma_t":
            # transposed: warpgroups of 64 columns in one row, all BM rows (8..256, in 8s) as the
            # instruction's N, the fp32 tile parked in the ring for the epilogue
            threads = 128 * t.wn + 32
            # two warpgroups whose accumulators pass the even share take the registers of a whole
            # producer warpgroup: 232 each
            shift = t.wn == 2 and t.bm // 2 + 56 > 65536 // 384
            shifts.append(shift)
            threads += 96 * shift
            if (t.wm != 1 or t.bn != 64 * t.wn or t.bm % 8 or t.bm > 256 or t.bk % 64 or t.stages < 3
                    # a block's only tile parks its fp32 output in the ring; a persistent one 64 rows
                    # at a time beside it
                    or not t.persist and t.bm * (t.bn + 4) * 4 > t.stages * (t.bm + t.bn) * 2 * t.bk
                    or threads > max_threads or t.bm // 2 > max_regs
                    or t.bm // 2 + 56 > (232 if shift else 65536 // (-(-threads // 128) * 128))
                    or t.stages * (t.bm + t.bn) * 2 * t.bk + 1024 + 16 * t.stages
                    + (t.persist > 0) * parked_bytes(t, st) > dev.smem_per_block
                    or t.bm > max(8, -(-st.m // 8) * 8) or t.bn > n_cap or t.split_k > kc):
                return False
            continue
        if t.mma in ("wgmma", "wgmma_tma"):
            # warpgroups of 128 threads, 64 rows each, 8..256 columns each, whole 64-wide K atoms, >= 3 slots
            wgn = t.bn // t.wn
            tma = t.mma == "wgmma_tma"
            shift = tma and t.wm * t.wn == 2 and wgn // 2 + 56 > 65536 // 384  # as above
            shifts.append(shift)
            threads = 128 * t.wm * t.wn + (128 if shift else 32) * tma
            if (t.bm != 64 * t.wm or t.bn % t.wn or wgn % 8 or wgn > 256 or t.bk % 64 or t.stages < 3
                    or threads > max_threads or wgn // 2 > max_regs
                    # registers come per warpgroup: 65536 over the threads rounded up to 128, less 56 others
                    or wgn // 2 + 56 > (232 if shift else 65536 // (-(-threads // 128) * 128))
                    # a persistent tile parks its output beside the ring
                    or t.stages * (t.bm + t.bn) * 2 * t.bk + 1024 + 16 * t.stages * (t.mma == "wgmma_tma")
                    + (t.persist > 0) * parked_bytes(t, st) > dev.smem_per_block
                    or t.bm > max(64, m_cap) or t.bn > n_cap or t.split_k > kc):  # splits share the chunks evenly
                return False
            continue
        if (t.bm % (16 * t.wm) or t.bn % (16 * t.wn) or 32 * t.wm * t.wn > max_threads
                # accumulators plus one k-step's A (4 per 16 rows) and B (2 per 8 columns) fragments
                or (t.bm // t.wm) * (t.bn // t.wn) // 32 + t.bm // t.wm // 4 + t.bn // t.wn // 4 > max_regs
                or t.stages * (t.bm + t.bn) * (2 * t.bk + 16) > dev.smem_per_block
                or t.bm > m_cap or t.bn > n_cap or t.split_k > kc):  # splits share the chunks evenly
            return False
    # the stream policy in the stream-ordered launches; a sync policy in pdl, two_stream or fused
    if (cfg.policy == "stream" and cfg.launch not in ("serial", "pdl")) or (cfg.policy != "stream"
                                                                             and cfg.launch == "serial"):
        return False
    if cfg.launch == "fused" and (cfg.dispatch != "ticket" or cfg.tiles[0].threads != cfg.tiles[1].threads
                                  or any(shifts)):
        return False  # one register count at entry for the whole launch: no tile moves registers
    if cfg.policy == "tile" and cfg.tiles[0].bn % cfg.tiles[1].bk:
        return False
    # an L2 prefetch of the second stage's weights: bulk copies need Hopper, and half of L2 at most
    if cfg.prefetch == "l2" and (dev.arch not in ("sm_90", "sm_90a")
                                 or chain.stages[1].n * chain.stages[1].k * 2 > dev.l2_bytes // 2):
        return False
    return True


def all_configs(space_dict):
    st = space_dict["stage"]
    tilings = [StageTiles(*v) for v in itertools.product(*(st.get(f, [TILE_DEFAULTS.get(f)]) for f in TILE_FIELDS))]
    glob = space_dict["global"]
    for combo in itertools.product(*(glob[f] for f in GLOBAL_FIELDS)):
        for t1, t2 in itertools.product(tilings, repeat=2):
            yield Config((t1, t2), *combo)


@pytest.fixture(scope="module")
def tiny():
    space = parse_space(TINY, "tiny.toml")
    chain = tiny_chain()
    fs = space.feasible(chain, TINY_DEVICE)
    brute = {c for c in all_configs(TINY) if reference_feasible(chain, c, TINY_DEVICE, 64, 128)}
    return fs, brute


def test_exact_count_matches_brute_force(tiny):
    fs, brute = tiny
    assert 0 < fs.size == len(brute)


def test_exact_count_matches_brute_force_with_wgmma_tilings():
    fs = parse_space(TINY_WG, "tiny_wg.toml").feasible(tiny_chain(), WG_DEVICE)
    brute = {c for c in all_configs(TINY_WG) if reference_feasible(tiny_chain(), c, WG_DEVICE, 256, 128)}
    assert any(t.mma == "wgmma" for c in brute for t in c.tiles) and any(c.tiles[0].mma == "sync" for c in brute)
    assert set(fs) == brute


# Tiles of two warpgroups past the even share of registers: a producer warpgroup, 384 threads, no fused launch.
TINY_RA = {**TINY, "stage": {"bm": [64, 128, 256], "bn": [128, 256], "bk": [64], "wm": [1, 2], "wn": [1, 2], "stages": [3],
                             "split_k": [1], "mma": ["wgmma", "wgmma_tma", "wgmma_tma_t"]},
           "global": {**TINY["global"], "prefetch": ["none"]},
           "limits": {"max_threads": 384, "max_tile_regs": 160}}


def test_exact_count_matches_brute_force_with_tiles_that_move_registers():
    chain = get_workload("gpt3").chain(tokens=256, hidden=512, ffn=256)
    dev = DeviceInfo("tiny hopper", smem_per_block=227 * 1024)
    fs = parse_space(TINY_RA, "tiny_ra.toml").feasible(chain, dev)
    brute = {c for c in all_configs(TINY_RA) if reference_feasible(chain, c, dev, 384, 160)}
    assert set(fs) == brute
    shifted = [c for c in brute if any(t.realloc for t in c.tiles)]
    assert shifted and all(c.launch != "fused" for c in shifted)
    assert {t.mma for c in shifted for t in c.tiles if t.realloc} == {"wgmma_tma", "wgmma_tma_t"}


# Clusters: only TMA tilings, only in block dispatch outside a fused launch, only whole cluster tiles.
TINY_CL = {**TINY, "stage": {"bm": [64], "bn": [64], "bk": [64], "wm": [1], "wn": [1], "stages": [3],
                             "split_k": [1, 3], "mma": ["wgmma", "wgmma_tma"], "cm": [1, 2], "cn": [1, 2]},
           "limits": {"max_threads": 256, "max_tile_regs": 128, "max_cluster": 2}}


def test_exact_count_matches_brute_force_with_clusters():
    chain = get_workload("gpt3").chain(tokens=128, hidden=256, ffn=192)  # gemm1 2x3 tiles, gemm2 2x4
    fs = parse_space(TINY_CL, "tiny_cl.toml").feasible(chain, WG_DEVICE)
    brute = {c for c in all_configs(TINY_CL) if reference_feasible(chain, c, WG_DEVICE, 256, 128, max_cluster=2)}
    assert set(fs) == brute
    clustered = [c for c in brute if any(t.cluster > 1 for t in c.tiles)]
    assert clustered and all(c.dispatch == "block" and c.launch != "fused" for c in clustered)
    assert any(c.tiles[0].cn == 1 and c.tiles[1].cn == 2 for c in clustered)  # gemm1's 3 columns cannot pair
    assert not any(c.tiles[0].cn == 2 for c in clustered)
    blamed = {fs.contains(c).split(":")[0] for c in all_configs(TINY_CL) if c not in brute}
    assert {"cluster", "cluster_launch"} <= blamed


# Persistent blocks: TMA-fed whole tiles, more tiles than SMs, block dispatch outside a fused launch.
TINY_PE = {**TINY, "stage": {"bm": [64], "bn": [64, 128], "bk": [64], "wm": [1], "wn": [1, 2], "stages": [3],
                             "split_k": [1, 3], "mma": ["wgmma", "wgmma_tma", "wgmma_tma_t"], "cm": [1, 2],
                             "persist": [0, 1, 2]},
           "global": {**TINY["global"], "launch": ["serial", "pdl", "two_stream", "fused"], "prefetch": ["none"]},
           "limits": {"max_threads": 384, "max_tile_regs": 128, "max_cluster": 2}}


def test_exact_count_matches_brute_force_with_persistent_blocks():
    chain = get_workload("gpt3").chain(tokens=256, hidden=512, ffn=256)  # gemm1 4x4 or 4x2 tiles, gemm2 4x8 or 4x4
    dev = DeviceInfo("tiny hopper", sms=12, smem_per_block=100 * 1024)
    fs = parse_space(TINY_PE, "tiny_pe.toml").feasible(chain, dev)
    brute = {c for c in all_configs(TINY_PE) if reference_feasible(chain, c, dev, 384, 128, max_cluster=2)}
    assert set(fs) == brute
    persistent = [c for c in brute if any(t.persistent for t in c.tiles)]
    assert persistent and all(c.dispatch == "block" and c.launch != "fused" for c in persistent)
    # tile waits in persistent blocks, behind the two-stream guard or a dependent launch; a split
    # last wave only under the stream policy
    assert {c.launch for c in persistent if c.policy != "stream"} == {"two_stream", "pdl"}
    assert all(c.policy == "stream" for c in persistent if any(t.tail_split for t in c.tiles))
    assert {t.mma for c in persistent for t in c.tiles if t.persistent} == {"wgmma_tma", "wgmma_tma_t"}
    # 16 tiles outnumber 12 SMs, not 12 SMs' 6 clusters of 2 blocks... which hold 12 blocks: both persist
    assert any(t.persistent and t.cluster == 2 for c in persistent for t in c.tiles)
    assert not any(t.persistent and t.bn == 128 and i == 0 for c in persistent for i, t in enumerate(c.tiles))
    # the last wave split along K: 16 and 32 tiles leave a wave of 12 blocks partly empty; never
    # in a cluster
    assert any(t.tail_split for c in persistent for t in c.tiles)
    assert not any(t.tail_split and t.cluster > 1 for c in persistent for t in c.tiles)
    blamed = {fs.contains(c).split(":")[0] for c in all_configs(TINY_PE) if c not in brute}
    assert {"persistence", "persistent_launch"} <= blamed


def test_wgmma_is_infeasible_off_hopper():
    fs = parse_space(TINY_WG, "tiny_wg.toml").feasible(tiny_chain(), DeviceInfo("ampere", arch="sm_80"))
    assert fs.size > 0 and not any(t.mma != "sync" for c in fs for t in c.tiles)
    wg = StageTiles(64, 64, 64, 1, 1, 3, 1, "wgmma")
    assert "wgmma needs a Hopper GPU" in fs.contains(Config((wg, wg), "stream", "row", "block", "serial"))


def test_grid_visits_every_feasible_config_exactly_once(tiny):
    fs, brute = tiny
    visited = list(fs.grid(seed=3))
    assert len(visited) == len(set(visited)) == len(brute)
    assert set(visited) == brute


def test_grid_order_depends_on_the_seed_only(tiny):
    fs, _ = tiny
    first = list(itertools.islice(fs.grid(seed=1), 20))
    assert first == list(itertools.islice(fs.grid(seed=1), 20))
    assert first != list(itertools.islice(fs.grid(seed=2), 20))


def test_contains_agrees_with_brute_force_and_names_the_constraint(tiny):
    fs, brute = tiny
    # Clusters and persistence have their own spaces below; a GEMM asks nothing of its own kind
    # (tests/test_conv.py).
    named = ({name for name, _ in STAGE_CONSTRAINTS} | {"launch_mode", "policy_requires", "fused_threads"}) - \
        {"cluster", "persistence", "stage_kind"}
    seen_names = set()
    for cfg in all_configs(TINY):
        why = fs.contains(cfg)
        assert (why is None) == (cfg in brute), (cfg, why)
        if why is not None:
            seen_names.add(why.split(":")[0])
    # Every constraint is exercised by this space, and nothing else is ever blamed.
    assert seen_names == named


def test_samples_are_feasible_and_spread_over_the_set(tiny):
    fs, brute = tiny
    rng = np.random.default_rng(0)
    draws = [fs.sample(rng) for _ in range(3000)]
    assert set(draws) <= brute
    # Uniform draws of 3000 from the set hit most of it; a sampler stuck in one region would not.
    assert len(set(draws)) > 0.6 * min(len(brute), 3000) * (1 - np.exp(-3000 / len(brute)))


def test_same_seed_same_samples(tiny):
    fs, _ = tiny
    a = [fs.sample(np.random.default_rng(5)) for _ in range(3)]
    b = [fs.sample(np.random.default_rng(5)) for _ in range(3)]
    assert a == b


def test_domains_cover_every_feasible_value(tiny):
    fs, brute = tiny
    domains = fs.domains()
    for cfg in brute:
        for k, v in cfg.params(fs.stage_names).items():
            assert v in domains[k]


def _distance(a: Config, b: Config) -> int:
    pa, pb = a.params(("s1", "s2")), b.params(("s1", "s2"))
    return sum(pa[k] != pb[k] for k in pa)


def test_nearest_feasible_config_is_a_closest_one(tiny):
    fs, brute = tiny
    every = list(all_configs(TINY))
    rng = np.random.default_rng(1)
    for i in rng.choice(len(every), 25, replace=False):
        c = every[i]
        near = fs.nearest(c)
        assert near in brute
        assert _distance(c, near) == min(_distance(c, b) for b in brute)
        assert fs.nearest(c, exclude={near}) not in (near, None)


def test_nearest_within_a_narrowed_set(tiny):
    fs, brute = tiny
    listed = sorted(brute, key=repr)[:10]
    narrowed = fs.restricted_to(listed)
    target = listed[3]
    assert narrowed.nearest(target) == target
    assert narrowed.nearest(target, exclude={target}) in set(listed) - {target}
    assert narrowed.nearest(target, exclude=set(listed)) is None


def test_baselines_are_feasible_stream_configs(tiny):
    fs, _ = tiny
    base = fs.baselines()
    assert base and all(b.policy == "stream" and b.launch == "serial" and fs.contains(b) is None for b in base)
    assert base == fs.baselines()


def test_restricted_set_keeps_only_feasible_listed_configs(tiny):
    fs, brute = tiny
    listed = sorted(brute, key=repr)[:5]
    infeasible = next(c for c in all_configs(TINY) if c not in brute)
    narrowed = fs.restricted_to([*listed, infeasible, listed[0]])
    assert narrowed.size == 5
    assert set(narrowed.grid(0)) == set(listed)
    assert narrowed.contains(listed[1]) is None
    outside = next(c for c in brute if c not in listed)
    assert narrowed.contains(outside).startswith("recorded:")
    assert fs.size == len(brute)  # the original set is untouched


def test_shipped_spaces_are_feasible_at_both_ends_of_the_sweep():
    for name in ("gpt3", "llama"):
        wl = get_workload(name)
        for tokens in (wl.sweep[0], wl.sweep[-1]):
            fs = shipped(name, tokens)
            assert fs.size > 1000
            assert all(fs.contains(b) is None for b in fs.baselines())


def test_one_token_allows_only_the_shortest_tiles():
    """16 rows for mma.sync warps; a warpgroup's least is 64; a transposed tile's, 8."""
    fs = shipped("gpt3", 1)
    assert fs.domains()["gemm1.bm"] == [8, 16, 64]
    least = {"sync": 16, "wgmma": 64, "wgmma_tma": 64, "wgmma_tma_t": 8}
    tiles = [t for i in range(0, fs.size, 9973) for t in fs.unrank(i).tiles]
    assert all(t.bm == least[t.mma] for t in tiles) and {t.mma for t in tiles} == set(least)


def test_a_transposed_tile_is_as_tall_as_m_needs_in_eights():
    """320 tokens cut into two tiles of 160 only when the tile is transposed (wgmma's N side);
    its warpgroups take 64 columns each, and its fp32 tile must fit in the ring."""
    fs = shipped("llama", 320)
    assert fs.contains(Config((StageTiles(160, 128, 64, 1, 2, 4, 1, "wgmma_tma_t"),) * 2, "stream", "col", "block",
                              "serial")) is None
    assert "not 64 rows per warpgroup" in fs.contains(
        Config((StageTiles(160, 128, 64, 2, 1, 4, 1, "wgmma_tma"),) * 2, "stream", "col", "block", "serial"))
    assert "64 columns per warpgroup" in fs.contains(
        Config((StageTiles(160, 192, 64, 1, 2, 4, 1, "wgmma_tma_t"),) * 2, "stream", "col", "block", "serial"))
    assert "does not fit in the" in fs.contains(
        Config((StageTiles(256, 256, 64, 1, 4, 3, 1, "wgmma_tma_t"),) * 2, "stream", "col", "block", "serial"))


def test_the_block_constraints_read_only_the_block_shape():
    """The feasible set judges BLOCK_CONSTRAINTS once per block shape (BLOCK_FIELDS); a split or a
    cluster of the shape never changes what any of them says."""
    dev = DeviceInfo("NVIDIA H200")
    rng = np.random.default_rng(0)
    others = list(itertools.product((1, 2, 3, 16), (1, 2), (1, 2, 4)))
    sizes = {"gpt3": dict(tokens=64), "resnet38": dict(batch=1, height=7, width=7, channels=512),
             "llama-attn": dict(tokens=100, cache=0)}
    judged = 0
    for name, size in sizes.items():
        space = load_space(home() / "search_spaces" / f"{name}.toml")
        for stage in get_workload(name).chain(**size).stages:
            dom = space.stage_domain(stage.name)
            for _ in range(200):
                shape = {f: dom[f][rng.integers(len(dom[f]))] for f in BLOCK_FIELDS}
                said = {tuple(fn(StageGrid(stage, StageTiles(**shape, split_k=s, cm=m, cn=n)), space.limits, dev)
                              for _, fn in BLOCK_CONSTRAINTS) for s, m, n in others}
                assert len(said) == 1, (stage.name, shape, said)
                judged += all(why is None for why in said.pop())
    assert judged > 20  # shapes that pass them all, not only ones that fail early


def test_a_stages_tilings_come_in_the_order_of_the_product_of_its_fields():
    chain = get_workload("gpt3").chain(tokens=256, hidden=512, ffn=256)
    dev = DeviceInfo("tiny hopper", sms=12, smem_per_block=100 * 1024)
    space = parse_space(TINY_PE, "tiny_pe.toml")
    fs = space.feasible(chain, dev)
    for stage, tilings in zip(chain.stages, fs.tilings):
        dom = space.stage_domain(stage.name)
        every = (StageGrid(stage, StageTiles(**dict(zip(TILE_FIELDS, v))))
                 for v in itertools.product(*(dom[f] for f in TILE_FIELDS)))
        assert [g.tiles for g in tilings] == [g.tiles for g in every
                                              if stage_problem(g, space.limits, dev) is None]


def test_empty_set_says_which_constraint_emptied_it():
    data = {**TINY, "stage": {**TINY["stage"], "bm": [64]}}  # taller than 16 tokens need
    fs = parse_space(data, "tall.toml").feasible(tiny_chain(), TINY_DEVICE)
    assert fs.size == 0
    assert any("tile_height" in r for r in fs.reasons)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "space.toml"
    p.write_text(text)
    return p


BASE = """
[stage]
bm = [16, 32]
bn = [64]
bk = [32]
wm = [1]
wn = [1]
stages = [2]
"""


def test_typo_key_names_file_key_and_nearest(tmp_path):
    p = write(tmp_path, BASE.replace("bn = [64]", "bnn = [64]"))
    with pytest.raises(SpaceError) as err:
        load_space(p)
    msg = str(err.value)
    assert str(p) in msg and "stage.bnn" in msg and "'bn'" in msg


def test_typo_table_names_nearest_table(tmp_path):
    p = write(tmp_path, BASE + "\n[globl]\npolicy = ['stream']\n")
    with pytest.raises(SpaceError, match="did you mean 'global'"):
        load_space(p)


def test_bad_choice_lists_what_is_accepted(tmp_path):
    p = write(tmp_path, BASE + "\n[global]\npolicy = ['stream', 'tiles']\n")
    with pytest.raises(SpaceError) as err:
        load_space(p)
    msg = str(err.value)
    assert "global.policy" in msg and "stream, tile, row" in msg and str(p) in msg


@pytest.mark.parametrize("value", ["0", "[]", "['a']", "[16, 16]", "true"])
def test_bad_stage_value_is_refused(tmp_path, value):
    p = write(tmp_path, BASE.replace("bm = [16, 32]", f"bm = {value}"))
    with pytest.raises(SpaceError, match="stage.bm"):
        load_space(p)


def test_missing_stage_key_is_named(tmp_path):
    p = write(tmp_path, BASE.replace("bk = [32]\n", ""))
    with pytest.raises(SpaceError, match="lacks bk"):
        load_space(p)


def test_per_stage_override_applies_to_that_stage_only(tmp_path):
    p = write(tmp_path, BASE + "\n[stage.gemm2]\nbm = [16]\n")
    space = load_space(p)
    fs = space.feasible(get_workload("gpt3").chain(tokens=32, hidden=256, ffn=128), H200)
    d = fs.domains()
    assert d["gemm1.bm"] == [16, 32] and d["gemm2.bm"] == [16]


def test_bm_fit_adds_the_heights_that_cut_m_into_whole_tiles(tmp_path):
    """200 rows: one tile of 200 or two of 104 (whole 8-row groups); 2048 rows fit no tile of at
    most 256 in one or two; 32 rows in two tiles are the listed 16; without a size the listed
    heights alone."""
    space = load_space(write(tmp_path, BASE.replace("bm = [16, 32]", "bm = [16, 128]\nbm_fit = [1, 2]")))
    assert space.stage_domain("gemm1", 200)["bm"] == (16, 104, 128, 200)
    assert space.stage_domain("gemm1", 2048)["bm"] == (16, 128)
    assert space.stage_domain("gemm1", 32)["bm"] == (16, 32, 128)
    assert space.stage_domain("gemm1")["bm"] == (16, 128)


def test_a_fitted_height_that_a_listed_one_matches_is_left_out():
    """A listed height that needs no more tiles and computes no more rows does as well."""
    listed = (8, 16, 32, 64, 128, 160, 256)
    assert fitted_heights(600, (1, 2, 3, 4), listed) == (200, 152)  # 256 computes 768 rows, 160 four tiles of 640
    assert fitted_heights(256, (1, 2, 3, 4), listed) == ()  # 88 x 3 computes more than 128 x 2
    assert fitted_heights(200, (1, 2, 3, 4), listed) == (200, 104, 72, 56)
    assert fitted_heights(1000, (4,), listed) == ()  # 250 rounds up to 256
    assert fitted_heights(1100, range(1, 9), listed) == (224, 184)  # 256 computes 1280 rows, 144 x 8 more than 160 x 7


def test_bm_fit_is_per_stage_and_an_empty_list_turns_it_off(tmp_path):
    text = BASE.replace("bm = [16, 32]", "bm = [16, 128]\nbm_fit = [1]") + "\n[stage.gemm2]\nbm_fit = []\n"
    space = load_space(write(tmp_path, text))
    assert space.stage_domain("gemm1", 200)["bm"] == (16, 128, 200)
    assert space.stage_domain("gemm2", 200)["bm"] == (16, 128)


@pytest.mark.parametrize("value", ["0", "[0]", "['a']", "[1, 1]", "true"])
def test_bad_bm_fit_is_refused(tmp_path, value):
    p = write(tmp_path, BASE + f"bm_fit = {value}\n")
    with pytest.raises(SpaceError, match="stage.bm_fit"):
        load_space(p)


def test_a_fitted_height_reaches_the_feasible_set_at_sizes_the_list_misses():
    """At 200 tokens the shipped space holds a transposed tile of all 200 rows (the listed heights
    stop at 160 below it); at the built-in sizes every fitted height is listed already."""
    space = load_space(home() / "search_spaces" / "llama.toml")
    fs = space.feasible(get_workload("llama").chain(tokens=200, hidden=5120, ffn=13824), H200)
    assert 200 in fs.domains()["gemm1.bm"] and 104 in fs.domains()["gemm2.bm"]
    assert fs.contains(Config((StageTiles(200, 128, 64, 1, 2, 4, 1, "wgmma_tma_t"),) * 2, "stream", "col", "block",
                              "serial")) is None
    for name in ("gpt3", "llama"):
        space = load_space(home() / "search_spaces" / f"{name}.toml")
        for tokens in get_workload(name).sweep + (320,):
            for st in get_workload(name).chain(tokens=tokens).stages:
                assert space.stage_domain(st.name, st.m)["bm"] == space.stage_domain(st.name)["bm"], (name, tokens)


def test_override_of_unknown_stage_is_refused(tmp_path):
    p = write(tmp_path, BASE + "\n[stage.gemm3]\nbm = [16]\n")
    with pytest.raises(SpaceError, match="gemm3"):
        load_space(p).feasible(tiny_chain(), H200)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SpaceError, match="cannot read"):
        load_space(tmp_path / "missing.toml")
    with pytest.raises(SpaceError, match="not valid TOML"):
        load_space(write(tmp_path, "[stage\n"))


def test_the_docs_list_the_shipped_search_space():
    import re
    import tomllib

    readme = (home() / "docs" / "spaces.md").read_text()
    block = re.search(r"`search_spaces/gpt3.toml`:\n\n```toml\n(.*?)```", readme, re.S).group(1)
    shipped = tomllib.loads((home() / "search_spaces" / "gpt3.toml").read_text())
    assert tomllib.loads(block) == shipped
    llama = tomllib.loads((home() / "search_spaces" / "llama.toml").read_text())
    # "holds the same candidates as gpt3's but for the transposed three-warpgroup tile"
    assert {**llama["stage"], "wn": shipped["stage"]["wn"]} == shipped["stage"]
    assert llama["stage"]["wn"] == [1, 2, 3, 4] and llama["limits"]["max_threads"] == 512
    assert {**llama["limits"], "max_threads": 384} == shipped["limits"]


@pytest.mark.parametrize("name, tokens", [("gpt3", 256), ("llama", 320)])
def test_space_and_checker_agree_on_every_shipped_sync_choice(name, tokens):
    """The space's constraints and the checker read the policy formulas' names from one builder
    (tuner.sync.policies.grid_env), so what the space holds the checker accepts, for every sync choice."""
    from tuner.checker.checks import check

    chain = get_workload(name).chain(tokens=tokens)
    fs = shipped(name, tokens)
    rng = np.random.default_rng(7)
    live = [c for c in fs.combos if _has(fs, c)]
    assert {c[0] for c in live} == {"stream", "tile", "row"}
    for combo in live:
        for _ in range(4):
            cfg = fs.sample(rng, combo)
            assert cfg.globals == combo
            assert check(chain, cfg) is None, cfg.short()


def _has(fs, combo) -> bool:
    try:
        fs.sample(np.random.default_rng(0), combo)
    except ValueError:
        return False
    return True


def test_a_folding_epilogue_narrows_the_producer_tile_for_the_tile_policy():
    """SwiGLU stores half its accumulator columns: a 64-wide gate/up tile writes 32 columns of
    the down projection's input, which a 64-deep K chunk of the consumer overruns."""
    fs = shipped("llama", 320)
    t = StageTiles(64, 64, 64, 1, 1, 4, 1, "wgmma_tma")
    why = fs.contains(Config((t, t), "tile", "row", "block", "two_stream"))
    assert why is not None and "policy_requires" in why and "BN=32 stored columns" in why, why


@pytest.mark.parametrize("chunks", [1, 2, 7, 17, 64, 96])
def test_splits_share_the_chunks_evenly_and_none_is_empty(chunks):
    stage = GemmStage("g", 16, 64, chunks * 64, "none")
    for split in range(1, chunks + 1):
        g = StageGrid(stage, StageTiles(16, 64, 64, 1, 1, 2, split))
        ranges = [g.split_chunks(s) for s in range(split)]
        assert [k for r in ranges for k in r] == list(range(chunks))  # in order, each chunk once
        assert {len(r) for r in ranges} <= {chunks // split, -(-chunks // split)} and min(map(len, ranges)) > 0
        assert all(g.split_of(k) == s for s, r in enumerate(ranges) for k in r)
        assert g.split_of(np.arange(chunks)).tolist() == [g.split_of(k) for k in range(chunks)]


def test_a_decode_attention_can_split_its_17_chunks_eight_ways():
    # 1024 cached keys and 1 new one: 17 chunks of 64. Ceil-sized splits of 3 would leave 2 of 8 empty.
    chain = get_workload("llama-attn").chain(tokens=1, cache=1024)
    fs = load_space("search_spaces/llama-attn.toml").feasible(chain, DeviceInfo("NVIDIA H200"))
    splits = {g.tiles.split_k for g in fs.tilings[1] if g.tiles.bk == 64}
    assert {8, 16} <= splits



def _narrowed(space, chain, cfgs):
    """``space`` with each domain cut to the values ``cfgs`` take: the same constraints over far fewer
    tilings (a value the space lacks stays out of it, so a config that takes one is still refused)."""
    cut = lambda vals, taken: tuple(v for v in vals if v in taken)  # noqa: E731
    overrides = {st.name: {f: cut(vals, {getattr(c.tiles[j], f) for c in cfgs})
                           for f, vals in space.stage_domain(st.name).items()}
                 for j, st in enumerate(chain.stages)}
    return replace(space, overrides=overrides,
                   globals={f: cut(vals, {getattr(c, f) for c in cfgs}) for f, vals in space.globals.items()})


def test_the_configs_the_gpu_tests_run_lie_in_the_shipped_spaces():
    """The GPU tests run hand-picked configs of the convolution and attention chains (tuner/search/cases.py):
    each is a point of its workload's shipped space, the opt-in L2 prefetch aside, so a change of a
    space cannot leave them behind unseen on a host without a GPU."""
    import test_gpu as gpu

    from tuner.search.cases import coverage

    runs = [*gpu.CONV_CASES, *((w, size, mma) for w, size in gpu.ATTN_CASES for mma in gpu.ATTN_MMAS)]
    for workload, size, mma in runs:
        chain = get_workload(workload).chain(**size)
        cfgs = [replace(c, prefetch="none") for c in coverage(chain, mma)]
        fs = _narrowed(load_space(home() / "search_spaces" / f"{workload}.toml"), chain, cfgs).feasible(chain, H200)
        for cfg in cfgs:
            assert fs.contains(cfg) is None, (workload, size, cfg.short(), fs.contains(cfg))
