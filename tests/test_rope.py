"""Rotary position embeddings in the QKV GEMM's epilogue (tuner.chain.rope): each query and key head's
adjacent column pairs turned by the token's position; the model's rotate_half order reached by
reordering the weights once, which leaves every attention score as it was."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tuner.chain import rope
from tuner.chain.kinds import WorkloadError, kind_of
from tuner.chain.tiling import StageGrid
from tuner.chain.workloads import get_workload
from tuner.codegen.render import render
from tuner.search.cases import coverage

R = rope.Rope(head_dim=4, group=2, offset=3)  # groups of 2 query heads, a key head, a value head
LAYER = get_workload("llama-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512)


def rotate_half_hf(x, pos, d, base=10000.0):
    """Hugging Face's form: dimension i paired with i + d/2, x [tokens, d]."""
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([pos[:, None] * inv] * 2, axis=1)
    half = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=1)
    return x * np.cos(ang) + half * np.sin(ang)


def test_position_zero_turns_nothing_and_value_heads_never_turn():
    out = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    assert np.allclose(rope.reference(np, out, replace(R, offset=0)), out)
    moved = rope.reference(np, out, R)
    assert np.allclose(moved[:, 12:], out[:, 12:]) and not np.allclose(moved[:, :12], out[:, :12])


def test_a_pair_turns_by_its_position_times_its_frequency():
    out = np.zeros((1, 16), np.float32)
    out[0, 2] = 1.0  # pair 1 of head 0: frequency base^(-2/4)
    moved = rope.reference(np, out, R)
    ang = 3 * 10000.0 ** -0.5
    assert np.allclose(moved[0, 2:4], [np.cos(ang), np.sin(ang)], atol=1e-6)


def test_reordered_weights_give_the_models_attention_scores():
    rng = np.random.default_rng(1)
    d, tokens, k = 8, 5, 16
    r = rope.Rope(head_dim=d, group=1, offset=7)
    w = rng.standard_normal((3 * d, k))  # one query head, its key head, its value head
    x = rng.standard_normal((tokens, k))
    pos = np.arange(7, 7 + tokens, dtype=np.float64)
    q_hf, k_hf = (rotate_half_hf(x @ w[h * d:(h + 1) * d].T, pos, d) for h in (0, 1))
    ours = rope.reference(np, x @ rope.interleave_weight(w, r).T, r)
    assert np.allclose(ours[:, :d] @ ours[:, d:2 * d].T, q_hf @ k_hf.T, atol=1e-4)
    assert np.allclose(ours[:, 2 * d:], x @ w[2 * d:].T)  # values as the model has them
    assert np.allclose(rope.interleave_cache(k_hf, d), ours[:, d:2 * d], atol=1e-4)  # a cache reordered once


def test_a_rotation_must_cover_whole_head_groups():
    with pytest.raises(WorkloadError, match=r"^stage qkv: rotary embedding over groups of 4 heads of 4; its 20 "
                                            r"columns are not whole groups$"):
        replace(LAYER.stages[0], n=20, rope=R)


def test_a_rotated_stage_is_not_transposed():
    cfg = coverage(LAYER, "wgmma_tma")[0]
    tiles = replace(cfg.tiles[0], mma="wgmma_tma_t")
    assert kind_of(LAYER.stages[0]).tiling_problem(StageGrid(LAYER.stages[0], tiles)) == \
        "stage qkv: a rotated stage's tiles are not transposed"


@pytest.mark.parametrize("mma", ["sync", "wgmma", "wgmma_tma"])
def test_only_the_qkv_stage_rotates(mma):
    source = render(LAYER, coverage(LAYER, mma)[0]).source
    first, rest = source[:source.index("// ---- stage 1")], source[source.index("// ---- stage 1"):]
    # at the cache's run-time length (the layer decodes: tuner.chain.length), clamped to its room of 256
    assert "rope_pair<128, 8>(" in first and ", cache_len, " in first and "rope_pair<" not in rest
    assert "const int cache_len = max(min(__ldg(lens), 256), 0);" in first
    plain = get_workload("gpt3-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512, heads=2, kv_heads=2)
    assert "rope_pair" not in render(plain, coverage(plain, mma)[0]).source  # nor is the header pasted
