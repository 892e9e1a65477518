"""The sync-protocol checker: shipped protocols pass, planted bugs are caught and named."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from tuner.chain.expr import Expr
from tuner.chain.gemm import first_read, producer_cols
from tuner.chain.workloads import get_workload
from tuner.checker import (
    Protocol,
    Schedule,
    check,
    check_deadlock,
    check_epochs,
    check_order,
    check_soundness,
    evaluate,
    simulate,
)
from tuner.config import Config, StageGrid, StageTiles
from tuner.sync.policies import DISPATCHES, LAUNCHES, ORDERS, POLICIES, TileOrder, launch_allowed, pair_env

GPT3 = get_workload("gpt3")
TILE, ROW = POLICIES["tile"], POLICIES["row"]

# BM1 != BM2 both ways, split-K on both stages, and tiles that do not divide the sizes.
TILINGS = {
    "uneven-m": (StageTiles(128, 128, 32, 2, 2, 4), StageTiles(64, 128, 32, 2, 2, 4)),
    "split-k": (StageTiles(64, 128, 64, 2, 2, 3, 2), StageTiles(128, 64, 32, 2, 2, 4, 3)),
    "small": (StageTiles(16, 64, 64, 1, 2, 4, 4), StageTiles(32, 128, 64, 1, 4, 4, 2)),
    # splits of 38 and 39 chunks (192 in 5), of 13 and 14 (96 in 7): the first chunks of a split fall anywhere
    "uneven-split": (StageTiles(64, 128, 64, 2, 2, 3, 5), StageTiles(128, 64, 64, 2, 2, 4, 7)),
}
COMBOS = [c for c in itertools.product(POLICIES, ORDERS, DISPATCHES, LAUNCHES)
          if launch_allowed(c[0], c[3], c[2]) is None]


def config(tiling: str = "split-k", policy: str = "tile", order: str = "row", dispatch: str = "ticket",
           launch: str = "two_stream") -> Config:
    return Config(TILINGS[tiling], policy, order, dispatch, launch)


@pytest.fixture(scope="module")
def chain():
    return GPT3.chain(tokens=1000)


# ---------------------------------------------------------------------------
# The array reading of a formula is Expr's reading


@pytest.mark.parametrize("text", sorted({
    *(getattr(p, f).text for p in POLICIES.values() if p is not None
      for f in ("sems", "post_sem", "wait_when", "wait_row_lo", "wait_row_hi", "wait_sem", "wait_count", "requires")),
    *(getattr(o, f).text for o in ORDERS.values() for f in ("m", "n", "s")),
    "first and kc or 7", "not first or kc", "0 < kc <= 5 != r", "-(kc - 9) // 4 + -kc % 3", "kc if r > 1 else 3",
    "max(kc, r) - min(kc, 2 * r)",
}))
def test_array_evaluation_matches_expr_one_value_at_a_time(text):
    expr = Expr(text)
    rng = np.random.default_rng(len(text))
    names = sorted(expr.names)
    grid = {n: rng.integers(1, 9, size=64) for n in names}
    grid.update({n: rng.integers(0, 2, size=64) for n in names if n == "first"})
    for count, cluster in (("MT", "CM"), ("NT", "CN")):  # tile grids divide into whole clusters
        if cluster in grid:
            grid[cluster] = rng.integers(1, 3, size=64)
            if count in grid:
                grid[count] = grid[count] * grid[cluster]
    arrays = evaluate(expr, grid, (64,))
    for i in range(64):
        assert arrays[i] == expr({n: int(grid[n][i]) for n in names}), {n: int(grid[n][i]) for n in names}


# ---------------------------------------------------------------------------
# Dependencies come from the index map and the producer's tiling


def test_a_chunk_depends_on_the_producer_tiles_whose_columns_it_reads(chain):
    producer, consumer = config("uneven-m").grids(chain)  # BN1 = 128, BK2 = 32
    lo, hi = producer_cols(producer)
    assert (lo[:3].tolist(), hi[:3].tolist()) == ([0, 128, 256], [128, 256, 384])
    first = first_read(producer, consumer)
    assert first[0, :3].tolist() == [0, 4, 8]  # one split: tile n1 is first read at chunk 4 * n1


def test_a_folding_epilogue_halves_the_columns_each_producer_tile_writes():
    llama = get_workload("llama").chain(tokens=64)
    producer, _ = config("uneven-m").grids(llama)
    lo, hi = producer_cols(producer)
    assert (lo[:2].tolist(), hi[:2].tolist()) == ([0, 64], [64, 128])  # 128 gate/up columns -> 64 stored


def test_a_split_reads_only_the_producer_tiles_inside_its_chunks(chain):
    producer, consumer = config("split-k").grids(chain)  # K2 = 6144 in 192 chunks, 3 splits of 64
    first = first_read(producer, consumer)
    never = np.iinfo(np.int64).max
    assert first[1, 16] == 64 and first[0, 16] == never  # tile n1=16 covers chunks 64..67: split 1 only


# ---------------------------------------------------------------------------
# Shipped protocols pass


@pytest.mark.parametrize("size", [dict(tokens=1), dict(tokens=64), dict(tokens=1000),
                                  dict(tokens=1000, hidden=1032, ffn=776)],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("tiling", TILINGS)
def test_every_shipped_combination_is_proven(size, tiling):
    chain = GPT3.chain(**size)
    failures = [f"{c}: {why}" for c in COMBOS if (why := check(chain, config(tiling, *c)))]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("policy", ["tile", "row"])
def test_llama_with_its_folded_output_is_proven(policy):
    llama = get_workload("llama").chain(tokens=64)
    assert check(llama, config("uneven-m", policy, launch="fused")) is None


def test_shipped_tile_orders_hand_out_every_tile_and_split_once(chain):
    for order, grid in itertools.product(ORDERS.values(), config("split-k").grids(chain)):
        assert check_order(grid, order) is None


@pytest.mark.parametrize("cm,cn", [(2, 1), (1, 2), (2, 2)])
def test_clustered_tile_orders_hand_out_every_tile_once_and_keep_clusters_adjacent(chain, cm, cn):
    from tuner.checker.model import tile_order

    for order in ORDERS.values():
        for t in config("split-k").tiles:
            g = StageGrid(GPT3.chain(tokens=512).stages[0], replace(t, mma="wgmma_tma", bm=128, wm=2, cm=cm, cn=cn))
            assert check_order(g, order) is None
            m, n, s = tile_order(g, order)
            c = cm * cn
            # the blocks of one cluster: one cluster tile, one split, ranks M-fastest
            assert (m[::c] % cm == 0).all() and (n[::c] % cn == 0).all()
            for r in range(c):
                assert (m[r::c] == m[::c] + r % cm).all() and (n[r::c] == n[::c] + r // cm).all()
                assert (s[r::c] == s[::c]).all()


def test_several_runs_without_a_reset_stay_correct(chain):
    for launch in ("two_stream", "fused"):
        assert check_epochs(Protocol.of(chain, config(launch=launch)), slots=132, runs=3) is None


# ---------------------------------------------------------------------------
# Planted bugs are caught, and the message names the tile


PLANTED = {
    # The column of the next producer tile instead of the one the chunk reads.
    "wrong column": replace(TILE, wait_sem=Expr("min(r * NT1 + (kc * BK2) // BN1 + 1, MT1 * NT1 - 1)")),
    "tile count too small": replace(TILE, wait_count=Expr("0")),
    "row count too small": replace(ROW, wait_count=Expr("NT1 - 1")),
    "waits on the first chunk only": replace(TILE, wait_when=Expr("first")),
    "skips the first producer row": replace(ROW, wait_row_lo=Expr("min((m2 * BM2) // BM1 + 1, MT1 - 1)")),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_soundness_rejects_a_planted_policy_naming_the_consumer_tile(chain, bug):
    producer, consumer = config().grids(chain)
    why = check_soundness(producer, consumer, PLANTED[bug])
    assert why is not None, bug
    assert why.startswith("gemm2 tile (m=") and " chunk " in why and "reads gemm1 tile (m=" in why


@pytest.mark.parametrize("launch", ["two_stream", "pdl"])
@pytest.mark.parametrize("bug", PLANTED)
def test_the_simulation_alone_catches_the_same_planted_policy(chain, bug, launch):
    # Independent of the static check: the simulated blocks load a chunk before its producer tile
    # posted, in either launch that runs a sync policy on its own kernels.
    protocol = Protocol.of(chain, config(launch=launch), policy=PLANTED[bug])
    why = simulate(protocol, Schedule("adversarial", 132), runs=1)
    assert why is not None and why.startswith("gemm2 tile (m=") and "in run 1" in why, why


def test_an_early_wait_is_reported_with_the_producer_tile_not_yet_posted(chain):
    why = check_epochs(Protocol.of(chain, config(policy="row"), policy=PLANTED["row count too small"]), slots=132)
    assert "passes with the counter at" in why and "only" in why and "gemm1 tile (m=" in why


def test_a_wait_for_more_posts_than_exist_deadlocks(chain):
    greedy = replace(TILE, wait_count=Expr("2"))
    producer, consumer = config().grids(chain)
    assert "covers none of them" in check_soundness(producer, consumer, greedy)
    why = check_deadlock(Protocol.of(chain, config(), policy=greedy), slots=132)
    assert why.startswith("deadlock") and "gemm2 tile (m=" in why and "for 2, it holds 1" in why


def test_a_semaphore_outside_the_policys_range_is_rejected(chain):
    past_the_end = replace(TILE, post_sem=Expr("m1 * NT1 + n1 + 1"))
    producer, consumer = config().grids(chain)
    why = check_soundness(producer, consumer, past_the_end)
    assert "gemm1 tile (m=" in why and "outside the policy's" in why


def test_an_order_that_drops_the_split_gives_two_tickets_one_tile(chain):
    no_split = TileOrder("no-split", m=Expr("(t // NT) % MT"), n=Expr("t % NT"), s=Expr("0"))
    grid = config("split-k").grids(chain)[0]
    why = check_order(grid, no_split)
    assert why.startswith("gemm1: tile order 'no-split' gives tickets 0 and ")
    assert "gemm1 tile (m=0, n=0, s=0)" in why


# ---------------------------------------------------------------------------
# Launch modes: what keeps them free of deadlock


def test_without_the_guard_spinning_consumers_fill_every_slot_and_deadlock(chain):
    unguarded = Protocol.of(chain, config(dispatch="block"), guard=False)
    why = check_deadlock(unguarded, slots=132)
    assert why.startswith("deadlock: every one of the 132 slots holds a waiting block")
    assert "gemm2 tile (m=" in why and "gemm1: " in why  # stuck consumers, producers never started
    assert check_deadlock(replace(unguarded, guard=True), slots=132) is None


# Persistent blocks of 128x128 tiles: on 8 SMs, each block loops over 48 or 96 of them.
PERSISTENT = StageTiles(128, 128, 64, 2, 1, 4, 1, "wgmma_tma", persist=1)


@pytest.mark.parametrize("policy", ["tile", "row"])
def test_persistent_blocks_wait_tile_by_tile_behind_the_guard_and_deadlock_without_it(chain, policy):
    cfg = Config((PERSISTENT, PERSISTENT), policy, "row", "block", "two_stream")
    assert check(chain, cfg, sms=8) is None and check(chain, cfg, sms=132) is None
    proto = Protocol.of(chain, cfg, sms=8)
    assert [g.launched(8) for g in proto.grids] == [8, 8] and [g.blocks for g in proto.grids] == [384, 768]
    # Without the guard, the consumer's 8 blocks take every SM before a producer block starts.
    why = check_deadlock(replace(proto, guard=False), slots=8)
    assert why.startswith("deadlock: every one of the 8 slots holds a waiting block") and "gemm1: 8" in why


def test_persistent_blocks_need_block_dispatch_outside_a_fused_launch_and_stream_order_to_split_the_last_wave(chain):
    assert check(chain, Config((PERSISTENT,) * 2, "tile", "row", "ticket", "fused")).startswith(
        "persistent blocks need block dispatch in a serial, pdl or two_stream launch")
    split = replace(PERSISTENT, persist=2)
    assert check(chain, Config((split,) * 2, "tile", "row", "block", "two_stream")).startswith(
        "a persistent stage whose last wave is split along K needs the stream policy")
    assert check(chain, Config((split,) * 2, "stream", "row", "block", "pdl")) is None


def test_a_fused_launch_in_block_order_deadlocks_which_is_why_it_takes_tickets(chain):
    fused = Protocol.of(chain, config(launch="fused"))
    assert check_deadlock(replace(fused, dispatch="block"), slots=132).startswith("deadlock")
    assert check_deadlock(fused, slots=132) is None


def test_a_fused_launch_runs_in_a_single_slot_but_two_streams_need_one_beside_the_guard(chain):
    assert check(chain, config(launch="fused"), sms=1) is None
    why = check(chain, config(launch="two_stream"), sms=1)
    assert why.startswith("deadlock") and "the guard waits" in why


def test_a_dependent_launch_holds_the_consumer_back_until_every_producer_block_has_started(chain):
    # No guard takes a slot: one slot is enough, the producer's blocks all starting (and, with one
    # slot, finishing) before the consumer's first. (Unguarded, two_stream deadlocks: above.)
    for policy in ("tile", "row"):
        assert check(chain, config(policy=policy, launch="pdl"), sms=1) is None
        assert check(chain, config(policy=policy, launch="pdl", dispatch="block"), sms=132) is None


# ---------------------------------------------------------------------------
# check(): the entry point the study calls


def test_check_refuses_combinations_the_launch_modes_do_not_allow(chain):
    why = launch_allowed("stream", "two_stream", "ticket")
    assert why and check(chain, config(policy="stream", launch="two_stream")) == why


def test_check_names_the_policy_constraint_a_tiling_breaks(chain):
    tiles = (StageTiles(128, 96, 32, 2, 2, 4), StageTiles(64, 128, 64, 2, 2, 4))  # BN1 = 96, BK2 = 64
    cfg = Config(tiles, "tile", "row", "ticket", "fused")
    assert check(chain, cfg) == f"policy 'tile' on gemm2: {TILE.requires_doc}"
    # The static check finds the same hole without being told the constraint.
    why = check_soundness(*cfg.grids(chain), TILE)
    assert "chunk 1" in why and "gemm1 tile (m=0, n=1)" in why


def test_configs_differing_only_in_warps_and_pipeline_share_one_answer(chain):
    from tuner.checker.checks import _check

    a = config("uneven-m")
    b = replace(a, tiles=tuple(replace(t, wm=4, wn=1, stages=6) for t in a.tiles))
    check(chain, a)
    hits = _check.cache_info().hits
    assert check(chain, b) is None and _check.cache_info().hits == hits + 1


def test_pair_env_is_the_environment_the_checker_evaluates(chain):
    producer, consumer = config().grids(chain)
    env = pair_env(producer, consumer)
    assert TILE.requires(env) == 1 and TILE.sems(env) == producer.mt * producer.nt
