"""The decoder layer as one chain (llama-layer, gpt3-layer): five stages, two residual adds (the layer's input, and the
attention block's output two stages back), two norms folded into GEMMs, the new keys and values appended to
the cache by the attention stage. The checker accepts every
hand-picked config and proves the second residual from the A reads between; a residual those reads
do not reach is refused in one line. On a GPU every hand-picked config matches the float32 reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tuner.chain import residual
from tuner.chain.kinds import kind_of
from tuner.codegen.render import render
from tuner.chain.workloads import Chain, get_workload
from tuner.checker import check, clear_caches
from tuner.checker import soundness
from tuner.search.cases import coverage
from kernel_checks import gpu_failures

LAYER = get_workload("llama-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512)
GPT = get_workload("gpt3-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512, heads=2, kv_heads=2)
MMAS = ("sync", "wgmma", "wgmma_tma", "wgmma_tma_t")


@pytest.mark.parametrize("chain, norm, epilogue", [(LAYER, "rms", "silu_mul"), (GPT, "layer", "gelu")])
def test_the_layer_is_five_stages_with_both_residuals_and_norms(chain, norm, epilogue):
    qkv, attn, out, up, down = chain.stages
    assert (qkv.norm, up.norm, up.epilogue) == (norm, norm, epilogue)
    assert residual.source(out) == residual.INPUT and residual.source(down) == 2
    assert residual.buffer(down) == "y2"


@pytest.mark.parametrize("mma", MMAS)
@pytest.mark.parametrize("chain", [LAYER, GPT], ids=["llama", "gpt3"])
def test_the_checker_accepts_every_hand_picked_layer_config(mma, chain):
    for cfg in coverage(chain, mma):
        assert check(chain, cfg) is None, cfg.short()


def test_a_residual_the_a_reads_do_not_reach_is_refused():
    # The down projection reading the layer's input instead of the gate/up output: nothing its A
    # operand reads has read the attention block's output.
    chain = Chain(LAYER.workload, LAYER.size, (*LAYER.stages[:4], replace(LAYER.stages[4], a_from=None)))
    cfg = coverage(chain, "sync")[0]
    assert check(chain, cfg) == ("down: its residual is out's output, which its A operand does not read, directly "
                                 "or through the stages between; accepted: a stage its A operand comes from")


def test_a_residual_read_outside_the_tiles_reached_is_refused(monkeypatch):
    # Planted: the residual map reads the rows one producer tile further down than the tile's own.
    real = soundness.residual_tiles

    def shifted(producer, consumer):
        out = real(producer, consumer)
        return out[:, list(range(producer.nt, out.shape[1])) + list(range(producer.nt))]

    big = get_workload("llama-layer").chain(tokens=160, cache=256, hidden=1024, ffn=512)  # several tile rows
    cfg = next(c for c in coverage(big, "sync") if c.policy == "tile")
    assert check(big, cfg) is None
    monkeypatch.setattr(soundness, "residual_tiles", shifted)
    clear_caches()
    try:
        msg = check(big, cfg)
    finally:
        clear_caches()
    assert msg is not None and "as its residual, which none of the tiles its A operand reads has read before posting" in msg


def test_a_split_normed_tile_needs_the_waits_of_its_whole_rows():
    # A policy that waits, at a split's first chunk only, for that chunk's producer tiles: each split's
    # first chunk is covered, the rest of its rows is not.
    from tuner.sync.policies import POLICIES
    from tuner.chain.expr import Expr

    bad = replace(POLICIES["tile"], wait_when=Expr("first"))
    big = get_workload("llama-layer").chain(tokens=160, cache=256, hidden=1024, ffn=512)
    cfg = next(c for c in coverage(big, "sync") if c.policy == "tile")
    assert soundness.check_norm_rows(cfg.grids(big)[2], cfg.grids(big)[3], POLICIES["tile"]) is None
    grids = cfg.grids(big)
    up = replace(grids[3], tiles=replace(grids[3].tiles, split_k=2))
    msg = soundness.check_norm_rows(grids[2], up, bad)
    assert msg is not None and msg.startswith("up's norm reads its rows whole: ")


def test_the_staged_search_tunes_a_layer_end_to_end(tmp_path):
    """The default strategy on a decode layer (times from the cost model, no GPU): its five stages alone,
    then chains under every sync choice, each of which the space and the checker accept."""
    from model_backend import H200, ModelBackend
    from tuner.paths import home
    from tuner.search.space import load_space
    from tuner.study.loop import run_study

    chain = get_workload("llama-layer").chain(tokens=4)
    space = load_space(home() / "search_spaces" / "llama-layer.toml")
    backend = ModelBackend(chain, space.feasible(chain, H200))
    out = run_study(chain, space, backend, f"sqlite:///{tmp_path / 's.db'}", trials=150, final=False)
    assert out.summary.best_us is not None
    alone = {label for label, _ in backend.calls if label != chain.label}
    assert alone == {f"llama-layer.{s.name}/{chain.label.split('/', 1)[1]}" for s in chain.stages}
    assert {cfg.policy for label, cfg in backend.calls if label == chain.label} == {"stream", "tile", "row"}


@pytest.mark.gpu
def test_every_hand_picked_layer_config_is_correct():
    failures = gpu_failures([(chain, c) for chain in (LAYER, GPT) for mma in MMAS for c in coverage(chain, mma)])
    assert not failures, "\n".join(failures)


def test_the_cache_has_room_for_the_new_tokens_and_attention_reads_only_the_old():
    attn = LAYER.stages[1]
    kind = kind_of(attn)
    (rows, d), _ = kind.b_operand(attn)
    assert (rows, d) == (attn.kv_heads * 2 * (attn.cache + attn.tokens), attn.head_dim)
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((attn.tokens, attn.qkv_cols)).astype(np.float32)
    cache = rng.standard_normal((rows, d)).astype(np.float32)
    before = kind.reference(np, qkv, cache, attn)
    kind.b_written(np, cache, attn)[...] = 1e4  # the appended rows: never read by this step's attention
    assert np.array_equal(kind.reference(np, qkv, cache, attn), before)


def test_what_the_append_writes_is_each_groups_new_keys_and_values():
    attn = LAYER.stages[1]
    g, d = attn.group, attn.head_dim
    qkv = np.arange(attn.tokens * attn.qkv_cols, dtype=np.float32).reshape(attn.tokens, attn.qkv_cols)
    want = kind_of(attn).b_expected(np, qkv, attn)  # [kv_heads, 2, tokens, D]
    assert want.shape == (attn.kv_heads, 2, attn.tokens, d)
    assert np.array_equal(want[0, 0, 3], qkv[3, g * d:(g + 1) * d])  # token 3's key
    assert np.array_equal(want[0, 1, 3], qkv[3, (g + 1) * d:(g + 2) * d])  # and its value


@pytest.mark.parametrize("mma", ["sync", "wgmma_tma"])
def test_only_the_layers_attention_appends(mma):
    source = render(LAYER, coverage(LAYER, mma)[0]).source
    stage1 = source[source.index("// ---- stage 1"):source.index("// ---- stage 2")]
    assert "append_kv<T, TOKENS, CROWS, HEADS, G>(A, const_cast<half_t*>(B), m0, n, cache_len);" in stage1
    assert source.count("  append_kv<") == 1
    attn_only = get_workload("llama-attn").chain(tokens=4)
    assert "  append_kv<" not in render(attn_only, coverage(attn_only, mma)[0]).source
