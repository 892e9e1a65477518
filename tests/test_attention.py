"""The attention stage kind: its layouts and reference, its index map under the checker, its space."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tuner.checker as checker
from tuner.backends.base import DeviceInfo
from tuner.chain import attention
from tuner.chain.expr import Expr
from tuner.chain.kinds import KINDS
from tuner.chain.workloads import WorkloadError, get_workload
from tuner.checker.checks import check
from tuner.checker.model import Protocol
from tuner.checker.soundness import check_soundness
from tuner.config import Config, StageTiles
from tuner.paths import home
from model_backend import ModelBackend
from tuner.search.space import load_space
from tuner.sync.policies import POLICIES

ATTENTION = KINDS["attention"]

H200 = DeviceInfo("test H200")
GEMM = StageTiles(64, 128, 64, 2, 2, 3)


def attn(bm: int = 16, bk: int = 64, split_k: int = 1, stages: int = 2, heads: int = 1) -> StageTiles:
    """An attention tile of ``bm`` tokens in ``heads`` packed heads: ``bm * heads / 16`` rows of warps."""
    return StageTiles(bm, 128 * heads, bk, bm * heads // 16, 1, stages, split_k)


def naive(qkv: np.ndarray, cache: np.ndarray, st: attention.AttentionStage) -> np.ndarray:
    """One query and one head at a time, in float64, from the layouts the module docstring gives."""
    d, g = st.head_dim, st.group
    out = np.zeros((st.tokens, st.heads * d))
    for t in range(st.tokens):
        for head in range(st.heads):
            kvh = head // g
            base = kvh * (g + 2) * d
            q = qkv[t, base + head % g * d: base + head % g * d + d].astype(np.float64)
            keys, values = [], []
            for j in range(st.cache + t + 1):  # causal: up to its own position
                if j < st.cache:
                    keys.append(cache[(kvh * 2) * st.cache + j])
                    values.append(cache[(kvh * 2 + 1) * st.cache + j])
                else:
                    keys.append(qkv[j - st.cache, base + g * d: base + g * d + d])
                    values.append(qkv[j - st.cache, base + g * d + d: base + g * d + 2 * d])
            s = np.array(keys, dtype=np.float64) @ q / math.sqrt(d)
            p = np.exp(s - s.max())
            out[t, head * d:(head + 1) * d] = p @ np.array(values, dtype=np.float64) / p.sum()
    return out


def inputs(st: attention.AttentionStage, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape, scale = ATTENTION.b_operand(st)
    return (rng.uniform(-1, 1, st.a_shape).astype(np.float16),
            rng.uniform(-scale, scale, shape).astype(np.float16))


@pytest.mark.parametrize("tokens,cache,heads,kv_heads", [(5, 0, 2, 2), (3, 7, 4, 1), (4, 6, 4, 2)])
def test_the_reference_is_causal_softmax_attention_over_the_cache_and_the_new_tokens(tokens, cache, heads, kv_heads):
    st = attention.AttentionStage("attn", tokens, cache, heads, kv_heads, 64)
    qkv, kv = inputs(st)
    ref = ATTENTION.reference(np, qkv.astype(np.float32), kv.astype(np.float32), st)
    assert ref.shape == (tokens, heads * 64)
    np.testing.assert_allclose(ref, naive(qkv, kv, st), rtol=1e-4, atol=1e-5)


def test_the_chain_a_cupy_user_writes_computes_the_same_attention():
    st = attention.AttentionStage("attn", 4, 6, 4, 2, 64)
    qkv, kv = inputs(st, seed=1)
    got = ATTENTION.cupy_stage(np, qkv, kv, st).astype(np.float64)  # numpy in CuPy's place
    np.testing.assert_allclose(got, naive(qkv, kv, st), atol=2e-3)


def test_the_layer_sizes_follow_the_models():
    gpt3 = get_workload("gpt3-attn").chain(tokens=4)
    qkv, att, out = gpt3.stages
    assert (qkv.n, qkv.k) == (3 * 12 * 128, 12288) and att.a_from == 0 and out.a_from == 1
    assert (att.m, att.n, att.k) == (4, 12 * 128, 1024 + 4) and (out.n, out.k) == (12288, 1536)
    llama = get_workload("llama-attn").chain(tokens=1, cache=2048)
    assert llama.stages[0].n == (8 + 2) * 128 and llama.stages[1].group == 8
    assert llama.stages[1].weight_bytes == 2 * 2048 * 128 * 2  # the cache, read once


@pytest.mark.parametrize("size,message", [
    ({"tokens": 4, "cache": -1}, "--cache -1: accepted: an integer from 0 to 131072"),
    ({"tokens": 0}, "--tokens 0: accepted: an integer from 1 to 16384"),
    ({"tokens": 4, "heads": 12, "kv_heads": 5}, "12 query heads do not share 5 KV heads evenly"),
    ({"tokens": 4, "head_dim": 96}, "head size 96; accepted: 64, 128"),
])
def test_bad_sizes_are_one_line_errors(size, message):
    with pytest.raises(WorkloadError, match=message):
        get_workload("gpt3-attn").chain(**size)


def test_a_prompt_has_an_empty_cache():
    chain = get_workload("llama-attn").chain(tokens=512, cache=0)
    assert chain.stages[1].k == 512 and ATTENTION.b_operand(chain.stages[1])[0] == (0, 128)


SIZES = [("gpt3-attn", {"tokens": t}) for t in (1, 4, 16)] + [("llama-attn", {"tokens": t, "cache": 2048})
                                                              for t in (1, 16)]
SIZES += [("gpt3-attn", {"tokens": 512, "cache": 0}), ("llama-attn", {"tokens": 3, "cache": 1500}),
          ("llama-attn", {"tokens": 1000, "cache": 0})]


@pytest.mark.parametrize("workload,size", SIZES)
@pytest.mark.parametrize("policy,launch", [("tile", "two_stream"), ("row", "two_stream"), ("tile", "fused"),
                                           ("row", "fused")])
def test_the_shipped_policies_are_sound_and_deadlock_free_on_attention(workload, size, policy, launch):
    chain = get_workload(workload).chain(**size)
    tokens = size["tokens"]
    tilings = [attn(16, 64, split_k=4 if tokens < 64 else 1), attn(64 if tokens >= 64 else 16, 128)]
    if workload == "llama-attn":  # 8 query heads share a KV head: tiles of 2 and of 8 of them
        tilings += [attn(8, 64, split_k=2, heads=2), attn(2, 32, split_k=8 if tokens < 64 else 1, heads=8)]
    for a in tilings:
        cfg = Config((GEMM, a, GEMM), policy, "row", "ticket" if launch == "fused" else "block", launch)
        assert check(chain, cfg) is None, (cfg.short(), check(chain, cfg))


def _wrong_head(regions):
    """The index map with every tile reading the next head's columns instead of its own."""
    return tuple({k: v.substitute({"n2": Expr("(n2 + 1) % NT2")}) for k, v in r.items()} for r in regions)


@pytest.fixture
def wrong_head(monkeypatch):
    monkeypatch.setattr(attention.AttentionKind, "REGIONS", _wrong_head(attention.AttentionKind.REGIONS))
    checker.clear_caches()
    yield
    checker.clear_caches()


@pytest.mark.parametrize("workload,size,heads", [("gpt3-attn", {"tokens": 4}, 1), ("llama-attn", {"tokens": 512, "cache": 0}, 1),
                                                  ("llama-attn", {"tokens": 512, "cache": 0}, 2)])
def test_a_policy_that_waits_on_the_wrong_head_is_refused_naming_the_tile(workload, size, heads, wrong_head):
    chain = get_workload(workload).chain(**size)
    cfg = Config((GEMM, attn(16, 64, heads=heads), GEMM), "tile", "row", "block", "two_stream")
    prod, cons, _ = cfg.grids(chain)
    why = check_soundness(prod, cons, POLICIES["tile"])
    assert why is not None and why.startswith("attn tile (m=0, n=0, s=0) chunk 0 (keys 0..63) reads qkv tile "), why
    assert check(chain, cfg) == why
    # Waiting for whole rows of the projection covers every head: the row policy stays sound.
    assert check(chain, Config((GEMM, attn(16, 64), GEMM), "row", "row", "block", "two_stream")) is None


def test_the_attention_waits_per_head_but_the_output_projection_per_row():
    chain = get_workload("gpt3-attn").chain(tokens=4)
    proto = Protocol.of(chain, Config((GEMM, attn(16, 64, split_k=4), GEMM), "tile", "row", "block", "two_stream"))
    grids = proto.grids
    assert checker.wait_columns(grids[1]) == grids[1].nt == 12 and checker.wait_columns(grids[2]) == 1
    model = checker.pair_model(grids[0], grids[1], POLICIES["tile"])
    # Head 5 of GPT-3 (one head per group) reads columns 5*384 .. 5*384+383 of the projection:
    # its queries (tile column 15 of 128 columns) on each split's first chunk, its keys and
    # values (16, 17) on the chunk that holds the new tokens, the last.
    head5 = model.m2 == 5
    waited = sorted(set(zip(model.kc[head5].tolist(), (model.sem[head5] % grids[0].nt).tolist())))
    assert waited == sorted({(grids[1].split_begin(s), 15) for s in range(4)} | {(grids[1].kc - 1, 16), (grids[1].kc - 1, 17)})


def test_a_tile_of_packed_heads_waits_for_their_queries_and_their_group_s_keys_and_values():
    """LLaMA: 8 query heads share one KV head. A tile of heads 4..7 reads their query columns
    (4*128 .. 8*128 of the group's 1280) and the group's key and value columns (1024 .. 1279)."""
    chain = get_workload("llama-attn").chain(tokens=4)
    cfg = Config((GEMM, attn(4, 64, split_k=4, heads=4), GEMM), "tile", "row", "block", "two_stream")
    proto = Protocol.of(chain, cfg)
    grids = proto.grids
    assert grids[1].nt == 2 and checker.wait_columns(grids[1]) == 2
    model = checker.pair_model(grids[0], grids[1], POLICIES["tile"])
    second = model.m2 == 1
    waited = sorted(set(zip(model.kc[second].tolist(), (model.sem[second] % grids[0].nt).tolist())))
    queries = {(grids[1].split_begin(s), col) for s in range(4) for col in (4, 5, 6, 7)}
    assert waited == sorted(queries | {(grids[1].kc - 1, 8), (grids[1].kc - 1, 9)})
    assert check(chain, cfg) is None


def test_the_space_packs_only_heads_that_share_a_kv_head():
    chain = get_workload("llama-attn").chain(tokens=1)
    fs = load_space(home() / "search_spaces" / "llama-attn.toml").feasible(chain, H200)
    assert fs.domains()["attn.bn"] == [128, 256, 512, 1024]  # 1, 2, 4, 8 of its 8 heads
    assert all(g.tiles.bm * g.tiles.bn // 128 == 16 * g.tiles.wm for g in fs.tilings[1])
    g3 = get_workload("llama-attn").chain(tokens=1, heads=6, kv_heads=2)  # 3 heads a group: none packs 2, 4 or 8
    assert {g.tiles.bn for g in load_space(home() / "search_spaces" / "llama-attn.toml").feasible(g3, H200).tilings[1]} == {128}


def test_the_space_keeps_one_head_per_tile_and_mma_sync():
    chain = get_workload("gpt3-attn").chain(tokens=16, cache=2048)
    fs = load_space(home() / "search_spaces" / "gpt3-attn.toml").feasible(chain, H200)
    d = fs.domains()
    assert d["attn.bn"] == [128] and d["attn.mma"] == ["sync"] and d["attn.wn"] == [1, 2, 4]
    assert all(g.tiles.bm == 16 * g.tiles.wm and g.tiles.bk % (16 * g.tiles.wn) == 0 for g in fs.tilings[1])
    assert {g.tiles.split_k for g in fs.tilings[1]} >= {1, 2, 4, 8}


def test_a_decode_layer_fits_a_fused_launch_with_warps_splitting_the_keys():
    """At a few tokens an attention tile has one row of warps; its keys split between 4 warps give the
    128 threads of the GEMMs' tiles, which a fused launch needs."""
    chain = get_workload("llama-attn").chain(tokens=4)
    fs = load_space(home() / "search_spaces" / "llama-attn.toml").feasible(chain, H200)
    gemm = StageTiles(16, 128, 64, 1, 4, 4)
    cfg = Config((gemm, StageTiles(16, 128, 64, 1, 4, 2, split_k=4), gemm), "tile", "row", "ticket", "fused")
    assert fs.contains(cfg) is None and check(chain, cfg) is None
    one_warp = Config((gemm, attn(16, 64, split_k=4), gemm), "tile", "row", "ticket", "fused")
    assert "fused_threads" in fs.contains(one_warp)


def test_the_staged_search_tunes_an_attention_layer_end_to_end(tmp_path):
    """The default strategy on a decode layer: stages alone, then verified chains under every sync choice."""
    from tuner.study.loop import run_study

    chain = get_workload("llama-attn").chain(tokens=4)
    space = load_space(home() / "search_spaces" / "llama-attn.toml")
    backend = ModelBackend(chain, space.feasible(chain, H200))
    out = run_study(chain, space, backend, f"sqlite:///{tmp_path / 's.db'}", trials=150, final=False)
    assert out.summary.best_us is not None
    alone = {label for label, _ in backend.calls if label != chain.label}
    assert alone == {f"llama-attn.{s.name}/{chain.label.split('/', 1)[1]}" for s in chain.stages}
    policies = {cfg.policy for label, cfg in backend.calls if label == chain.label}
    assert policies == {"stream", "tile", "row"}
