"""The staged search's plan, without a GPU: which tilings each pass takes, and that the chain pass
covers every sync choice the space holds."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

from tuner.backends.base import DeviceInfo
from tuner.chain.workloads import get_workload
from tuner.checker.checks import check
from tuner.config import Config, StageTiles
from tuner.paths import home
from tuner.search.space import load_space
from tuner.search.strategies import Outcome, SearchContext
from tuner.search.strategies.staged import CLUSTER_TOP, PERSIST_TOP, Staged, preferred_order, ring_variants

H200 = DeviceInfo("NVIDIA H200")


@lru_cache(maxsize=None)  # one enumeration of the space per size: the strategy only reads it

def past_baseline(st: Staged) -> None:
    """Answer the strategy's first batch, the stream-order baseline that every study measures first."""
    batch = st.propose(1)
    assert len(batch) == 1 and batch[0].stage is None and batch[0].config.policy == "stream"
    st.observe([Outcome(batch[0], 100.0)])

def feasible(tokens: int):
    chain = get_workload("gpt3").chain(tokens=tokens)
    return chain, load_space(home() / "search_spaces" / "gpt3.toml").feasible(chain, H200)


def staged(tokens: int, budget: int = 400):
    chain, fs = feasible(tokens)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: True, budget, stage_tilings=fs.tilings))
    past_baseline(st)
    return st


def test_the_three_fastest_go_on_plus_the_fastest_unclustered_when_all_three_are_clustered():
    a, b, c, d = (StageTiles(128, bn, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1) for bn in (96, 128, 192, 256))
    plain = StageTiles(128, 96, 64, 2, 1, 4)
    st = staged(256)
    st.alone[1] = {c: 3.0, a: 1.0, b: 2.0, plain: 9.0, d: 4.0}
    assert st._top_tilings(1) == [a, b, c, plain]
    st.alone[1] = {c: 3.0, a: 1.0, plain: 2.0}
    assert st._top_tilings(1) == [a, plain, c]


def test_the_probe_shares_24_shapes_per_stage_among_the_mma_instructions():
    """Four instructions (the transposed TMA tile is the fourth) get six shapes each, so the stage
    pass keeps its share of the budget: three first, three more where the first came close."""
    st = staged(256)
    first = st.propose(400)
    per = Counter((p.stage, p.tiles.mma) for p in first)
    assert len(per) == 8 and set(per.values()) == {3}
    st.observe(Outcome(p, 10.0 + (p.tiles.mma == "wgmma") * 2.0) for p in first)  # within 1.25
    per.update((p.stage, p.tiles.mma) for p in st.propose(400))
    assert len(per) == 8 and set(per.values()) == {6}


def test_the_probe_gives_no_more_shapes_to_an_instruction_whose_first_came_far_behind():
    """mma.sync at twice the best time from 128 tokens on: three shapes of it are enough."""
    st = staged(256)
    first = st.propose(400)
    st.observe(Outcome(p, 20.0 if p.tiles.mma == "sync" else 10.0) for p in first)
    rest = st.propose(400)
    assert rest and all(p.phase == "stage pass" for p in rest)
    per = Counter((p.stage, p.tiles.mma) for p in rest)
    assert len(per) == 6 and set(per.values()) == {3} and not any(m == "sync" for _, m in per)


def test_cluster_variants_of_the_fastest_tilings_are_the_feasible_cluster_shapes():
    st = staged(256)  # two 128-row tiles: both cluster shapes divide both stages
    probe = st.propose(400)
    # TMA-fed tilings fastest: only they can run in clusters.
    st.observe(Outcome(p, (10.0 if p.tiles.mma == "wgmma_tma" else 50.0) + i) for i, p in enumerate(probe))
    st.observe(Outcome(p, 10.0 + i) for i, p in enumerate(st.propose(400)))  # the probe's rest
    more = st.propose(400)
    st.observe(Outcome(p, 100.0) for p in more)
    clustered = st.propose(400)
    assert clustered and all(p.phase == "stage pass" and p.tiles.cluster > 1 for p in clustered)
    fastest = {j: st.fastest(j, CLUSTER_TOP, plain=True) for j in range(2)}
    for p in clustered:
        plain = replace(p.tiles, cm=1, cn=1)
        assert plain in fastest[p.stage] and p.tiles in st.allowed[p.stage]
    assert {(p.tiles.cm, p.tiles.cn) for p in clustered} == {(2, 1), (1, 2)}
    # Then the fastest tilings, clustered or not, and the fastest plain ones, with persistent
    # blocks where the stage allows them (more tiles than SMs: the narrower tiles of gemm2 here).
    st.observe(Outcome(p, (5.0 if replace(p.tiles, persist=1) in st.allowed[p.stage] else 60.0) + i)
               for i, p in enumerate(clustered))
    def fastest_that_persist(j: int, plain: bool) -> list:
        ranked = st.fastest(j, len(st.alone[j]), plain=plain)
        return [t for t in ranked if replace(t, persist=1) in st.allowed[j]][:PERSIST_TOP]

    bases = {j: set(fastest_that_persist(j, False) + fastest_that_persist(j, True)) for j in range(2)}
    assert any(t.cluster > 1 for t in bases[1]) and any(t.cluster == 1 for t in bases[1])
    persistent = st.propose(400)
    assert persistent and all(p.phase == "stage pass" and p.tiles.persistent for p in persistent)
    assert {(p.stage, replace(p.tiles, persist=0)) for p in persistent} == {(j, t) for j in range(2) for t in bases[j]}
    st64 = staged(64)  # 64-row tiles make one row: no cluster along M (shorter transposed tiles can)
    assert not [t for t in st64.allowed[1] if t.cm > 1 and t.bm == 64]
    assert [t for t in st64.allowed[1] if t.cm > 1 and t.bm < 64 and t.transposed]



def run_passes(st: Staged, until: str) -> list:
    """Answer every batch with a time (TMA-fed tilings fastest) until the phase ``until`` starts."""
    while True:
        batch = st.propose(10_000)
        if not batch or batch[0].phase == until:
            return batch
        st.observe(Outcome(p, (10.0 if p.tiles.mma == "wgmma_tma" else 50.0) + i) for i, p in enumerate(batch))


def test_the_chain_pass_pairs_the_fastest_tilings_under_every_policy_launch_and_prefetch_the_checker_accepts():
    chain, fs = feasible(64)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: check(chain, c) is None, 2000, stage_tilings=fs.tilings))
    past_baseline(st)
    batch = run_passes(st, "chain pass")
    assert batch and all(p.stage is None for p in batch)
    best = tuple(st._top_tilings(j)[0] for j in range(2))
    paired = {p.config.globals for p in batch if p.config.tiles == best}
    usable = {combo for combo in fs.combos if fs.contains(Config(best, *combo)) is None
              and check(chain, Config(best, *combo)) is None}
    # A clustered pair keeps only block dispatch without a fused launch. Tile order and dispatch
    # are left to refinement: one of them per policy, launch and prefetch.
    kinds = {(c[0], c[3], c[4]) for c in usable}
    assert len(usable) >= 4 and paired <= usable and {(c[0], c[3], c[4]) for c in paired} == kinds
    assert len(paired) == len(kinds)
    assert batch[0].config.policy == "stream"  # a stream baseline leads


def test_the_chain_pass_pairs_in_column_order_under_stream_and_row_order_under_sync_then_tries_the_other():
    """Where kernel boundaries order the stages, a stage runs as it was timed alone (column order:
    a wave reads each weight slab once); a sync policy waits on producer rows, which row order
    completes first. The fastest pairing then gets the other order under each."""
    chain, fs = feasible(256)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: check(chain, c) is None, 2000, stage_tilings=fs.tilings))
    past_baseline(st)
    first = run_passes(st, "chain pass")
    best = tuple(st._top_tilings(j)[0] for j in range(2))
    paired = [p.config for p in first if p.config.tiles == best]
    assert {c.order for c in paired if c.policy == "stream"} == {"col"}
    assert {c.order for c in paired if c.policy != "stream"} == {"row"}
    st.observe(Outcome(p, 10.0 + i * 1e-3) for i, p in enumerate(first))
    later = [p.config for p in st.propose(10_000) if p.config.tiles == best]
    flipped = {(c.policy, c.launch, c.prefetch) for c in later if c.order != preferred_order(c.policy)}
    assert flipped == {(c.policy, c.launch, c.prefetch) for c in paired}


def test_no_proposal_is_infeasible_or_refused_and_exploration_follows_an_exhausted_neighbourhood():
    chain, fs = feasible(1)
    st = Staged()
    ctx = SearchContext(chain, fs, H200, lambda c: check(chain, c) is None, 120, stage_tilings=fs.tilings)
    st.start(ctx)
    phases: list[str] = []
    n = 0
    while n < 400 and (batch := st.propose(10_000)):
        for p in batch:
            if p.stage is None:
                assert ctx.usable(p.config)
            else:
                assert p.tiles in st.allowed[p.stage]
        phases += [p.phase for p in batch if not phases or phases[-1] != p.phase]
        n += len(batch)
        # Every chain the same time: the neighbourhood of the best four is finite and runs dry.
        st.observe(Outcome(p, 20.0) for p in batch)
    assert n >= 400
    assert [p for i, p in enumerate(phases) if p not in phases[:i]] == [
        "opening", "stage pass", "chain pass", "refinement", "exploration"]


def test_stages_that_compute_the_same_thing_alone_share_one_stage_pass():
    """VGG's four convolutions are one computation when timed alone: only the first is timed, with
    the whole stage budget, and the chain pass reads its times for all four."""
    chain = get_workload("vgg19").chain(batch=1)
    fs = load_space(home() / "search_spaces" / "vgg19.toml").feasible(chain, H200)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: True, 400, stage_tilings=fs.tilings))
    past_baseline(st)
    assert st.twin_of == [0, 0, 0, 0] and st.stage_cap == 200
    timed = set()
    while (batch := st.propose(10_000)) and batch[0].phase == "stage pass":
        timed |= {p.stage for p in batch}
        st.observe(Outcome(p, 50.0 + i) for i, p in enumerate(batch))
    assert timed == {0} and batch and all(p.stage is None for p in batch)
    assert all(st.alone[j] is st.alone[0] for j in range(4)) and len(st.alone[0]) > 50
    best = st._top_tilings(0)[0]
    assert any(p.config.tiles == (best,) * 4 for p in batch)


def test_a_gemm_chain_times_both_stages():
    st = staged(256)
    assert st.twin_of == [0, 1] and st.stage_cap == 100


def test_the_ring_one_slot_shorter_and_longer_than_the_fastest_probed_tilings_is_timed_next():
    """And the same bytes in flight in chunks half and twice as deep."""
    from tuner.search.strategies.staged import RING_TOP

    st = staged(256, budget=100)
    for base in (10.0, 30.0):  # the probe's first shapes, then its rest
        st.observe(Outcome(p, base + i) for i, p in enumerate(st.propose(400)))
    probed = [set(a) for a in st.alone]
    fastest = [st.fastest(j, RING_TOP) for j in range(2)]
    more = {(p.stage, p.tiles) for p in st.propose(400)}
    for j in range(2):
        for t in fastest[j]:
            near = [u for d in (-1, 1) if (u := replace(t, stages=t.stages + d)) in st.allowed[j]]
            same_bytes = [u for u in (replace(t, bk=t.bk // 2, stages=t.stages * 2),
                                      replace(t, bk=t.bk * 2, stages=t.stages // 2)) if u in st.allowed[j]]
            assert near and all((j, u) in more or u in probed[j] for u in near + same_bytes)


def test_the_ring_variants_keep_the_bytes_in_flight_in_chunks_half_and_twice_as_deep():
    """Four chunks of 128 hold what eight of 64 do: a stage pass that timed the first times the
    second, which neither a depth nor a chunk change alone reaches."""
    from tuner.search.strategies.staged import ring_variants

    t = StageTiles(72, 128, 128, 1, 2, 4, 1, "wgmma_tma_t")
    assert {(u.bk, u.stages) for u in ring_variants(t)} == {(128, 3), (128, 5), (64, 8), (256, 2)}


def test_right_after_the_fastest_pairing_the_chain_pass_swaps_in_each_near_instruction_under_its_best_sync():
    """The fastest tiling alone is not always the fastest in the chain: another MMA instruction
    within 10% alone gets its turn right after the fastest pairing, under the two sync choices
    that served that pairing best, not after every pairing of the first instruction."""
    chain, fs = feasible(64)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: check(chain, c) is None, 2000, stage_tilings=fs.tilings))
    past_baseline(st)
    alone = {"wgmma_tma": 10.0, "wgmma_tma_t": 10.8}  # within 10%; the others are far behind
    while (batch := st.propose(10_000)) and batch[0].phase != "chain pass":
        st.observe(Outcome(p, alone.get(p.tiles.mma, 50.0) + i * 1e-3) for i, p in enumerate(batch))
    best = tuple(st._top_tilings(j)[0] for j in range(2))
    assert all(t.mma == "wgmma_tma" for t in best)
    # The fastest pairing: serial kernels slowest, then PDL, tile-sync fastest.
    rank = {"serial": 30.0, "pdl": 20.0}
    st.observe(Outcome(p, rank.get(p.config.launch, 10.0) + i * 1e-3) for i, p in enumerate(batch))
    served = sorted((o for o in batch if o.config.tiles == best), key=lambda p: rank.get(p.config.launch, 10.0))
    swaps = st.propose(10_000)
    transposed = [st.fastest(j, 1_000) for j in range(2)]
    transposed = [next(t for t in ts if t.mma == "wgmma_tma_t") for ts in transposed]
    expected = [best[:j] + (transposed[j],) + best[j + 1:] for j in range(2)]
    got = [p.config for p in swaps[:2 * 2]]
    assert [c.tiles for c in got] == [expected[0]] * 2 + [expected[1]] * 2
    # Under the best two sync choices of the fastest pairing that the swapped pairing can run.
    for c in got:
        usable = [p.config.globals for p in served if st.ctx.usable(Config(c.tiles, *p.config.globals))]
        assert c.globals in usable[:2]
    assert all(p.phase == "chain pass" for p in swaps)


def test_refinement_offers_a_parents_ring_in_chunks_half_and_twice_as_deep():
    """Two fields at once (bk and stages) are no tiling one field away, yet the same bytes in flight."""
    from tuner.search.strategies.staged import ring_variants

    st = staged(256, budget=100)
    while (batch := st.propose(400)) and batch[0].phase == "stage pass":
        st.observe(Outcome(p, 10.0 + i) for i, p in enumerate(batch))
    parent = batch[0].config
    children = set(st._neighbours(parent))
    offered = 0
    for j, t in enumerate(parent.tiles):
        for u in ring_variants(t)[2:]:
            if u in st.allowed[j]:
                assert Config(parent.tiles[:j] + (u,) + parent.tiles[j + 1:], *parent.globals) in children
                offered += 1
    assert offered


def test_a_small_budget_leaves_a_fifth_to_chains_and_probes_every_instruction():
    """60 trials once went to stages alone, all of them: no chain was measured."""
    st = staged(256, budget=60)
    n = {"stage pass": 0, "chain pass": 0}
    kinds = set()
    while sum(n.values()) < 60 and (batch := st.propose(60 - sum(n.values()))):
        for p in batch:
            n[p.phase] = n.get(p.phase, 0) + 1
            if p.stage is not None:
                kinds.add((p.stage, p.tiles.mma))
        st.observe(Outcome(p, 20.0 + i) for i, p in enumerate(batch))
    assert n["stage pass"] <= 48 and n["chain pass"] >= 12
    assert len(kinds) == 8  # four instructions in each of the two stages


def test_a_small_budget_cuts_the_stage_pass_in_turns_so_no_stage_is_starved():
    chain = get_workload("llama-attn").chain(tokens=1)
    fs = load_space(home() / "search_spaces" / "llama-attn.toml").feasible(chain, H200)
    st = Staged()
    st.start(SearchContext(chain, fs, H200, lambda c: True, 60, stage_tilings=fs.tilings))
    past_baseline(st)
    per = Counter()
    while (batch := st.propose(60)) and batch[0].phase == "stage pass":
        per.update(p.stage for p in batch)
        st.observe(Outcome(p, 20.0 + i) for i, p in enumerate(batch))
    assert sum(per.values()) == 48 and set(per) == set(range(len(chain.stages))) and min(per.values()) >= 8


def test_the_fastest_persistent_tiling_is_timed_again_with_its_ring_varied():
    """At gpt3 2048 tokens gemm2's 256x128 T1x2 tile ran fastest persistent with three ring slots;
    with four, 0.5% faster persistent on an H100, it was never timed: without persistent blocks
    that depth came fourth, and only the three fastest were made persistent."""
    st = staged(2048)
    batches, timed = [], []  # each batch, and what had been timed alone before it
    while (batch := st.propose(400)) and batch[0].phase == "stage pass":
        batches.append(batch)
        timed.append([{t: us for t, us in a.items() if us is not None} for a in st.alone])
        st.observe(Outcome(p, (5.0 if p.tiles.persistent else 10.0) + 0.01 * i) for i, p in enumerate(batch))
    k = next(k for k, b in enumerate(batches) if any(p.tiles.persistent for p in b)) + 1
    for j in range(2):
        before = {t: us for t, us in timed[k][j].items() if t.persistent}
        top = min(before, key=before.get)
        expected = {u for u in ring_variants(top) if u in st.allowed[j] and u not in timed[k][j]}
        assert expected and {p.tiles for p in batches[k] if p.stage == j} == expected
        assert all(u.persistent and u.bm == top.bm and u.bn == top.bn for u in expected)
