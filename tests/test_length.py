"""The cache's length read at run time (tuner.chain.length): a decode layer is compiled once for its
room and each run reads its own length, so one kernel serves a whole decode loop. Its waits hold for
every length (each split waits up front for its tokens' new keys and values), which the checker
proves at the room and these tests show against each length's true reads; the reference at a length
is the chain with that length compiled in; the kernels take it as their last argument, clamped."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tuner.backends.gpu import reference_outputs
from tuner.chain import length
from tuner.chain.attention import AttentionKind, KEYS_VALUES, QUERIES, reads_at
from tuner.chain.kind import WorkloadError
from tuner.chain.kinds import kind_of
from tuner.chain.workloads import Chain, get_workload
from tuner.checker import check, clear_caches
from tuner.codegen.render import render
from tuner.search.cases import coverage
from tuner.shipping.runtime import RuntimeArgumentError, check_length

LAYER = get_workload("llama-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512)
GPT = get_workload("gpt3-layer").chain(tokens=4, cache=256, hidden=1024, ffn=512, heads=2, kv_heads=2)


def test_a_decode_layer_reads_its_length_at_run_time_and_a_prompt_compiles_it_in():
    qkv, attn = LAYER.stages[:2]
    assert attn.dynamic and qkv.rope.dynamic and length.of(LAYER) == 256
    assert length.of(GPT) == 256  # no rotation: the attention alone reads it
    prompt = get_workload("llama-layer").chain(tokens=64, cache=0, hidden=1024, ffn=512)
    assert length.of(prompt) is None and not prompt.stages[1].dynamic
    assert length.of(get_workload("llama-attn").chain(tokens=4, cache=1024)) is None  # the attention study: compiled in


def test_stages_of_different_rooms_are_refused_in_one_line():
    qkv, attn, *rest = LAYER.stages
    with pytest.raises(WorkloadError, match=r"^llama-layer: stages read a run-time cache length of different "
                                            r"rooms \(128, 256\); accepted: one$"):
        Chain(LAYER.workload, LAYER.size, (replace(qkv, rope=replace(qkv.rope, offset=128)), attn, *rest))


def test_a_length_past_the_room_is_refused():
    with pytest.raises(WorkloadError, match=r"^llama-layer/.*: a cache length of 257; accepted: 0\.\.256$"):
        length.at(LAYER, 257)
    with pytest.raises(WorkloadError, match=r"a cache length read at run time needs a cache"):
        replace(LAYER.stages[1], cache=0, rows=4)


def test_every_kernel_takes_the_length_last_and_each_reading_stage_clamps_it():
    for mma in ("sync", "wgmma_tma"):
        src = render(LAYER, coverage(LAYER, mma)[0])
        assert src.room == 256
        assert src.source.count("const u64* __restrict__ tmaps, const int* __restrict__ lens)") == len(src.kernels)
        # the QKV tile (its rotation) and the attention tile, no other
        assert src.source.count("const int cache_len = max(min(__ldg(lens), 256), 0);") == 2
    static = get_workload("llama-attn").chain(tokens=4, cache=1024)
    r = render(static, coverage(static, "sync")[0])
    assert r.room is None and "lens" not in r.source and "constexpr int cache_len = CACHE;" in r.source


def _covered(short, full) -> bool:
    """Whether every (split, producer tile) ``short`` reads, ``full`` reads too, no later."""
    for (s1, m1, n1, kc1), (s2, m2, n2, kc2) in zip(short, full):
        have = {(a, b, c): k for a, b, c, k in zip(s2, m2, n2, kc2)}
        for key in zip(s1, m1, n1, kc1):
            if key[:3] not in have or have[key[:3]] > key[3]:
                return False
    return True


@pytest.mark.parametrize("chain", [LAYER, GPT], ids=["llama", "gpt3"])
def test_the_up_front_reads_cover_what_a_run_at_each_length_reads(chain):
    # A run below the room keeps the room's chunks and splits and stops at its last key.
    kind = kind_of(chain.stages[1])
    split = [c for c in coverage(chain, "sync") if c.tiles[1].split_k > 1] or coverage(chain, "sync")
    for cfg in split[:4]:
        grids = cfg.grids(chain)
        up_front = kind.reads(grids[0], grids[1])
        for n in (0, 1, 63, 64, 65, 127, 200, 255, 256):
            assert _covered(reads_at(grids[0], grids[1], n, up_front=False), up_front), (cfg.short(), n)


def test_waits_per_chunk_in_a_dynamic_stage_are_refused(monkeypatch):
    # Planted: the dynamic stage waits for the new keys and values at the chunk that holds them
    # at its room, which a shorter run reads sooner, in another split.
    cfg = next(c for c in coverage(LAYER, "sync") if c.policy == "tile" and c.tiles[1].split_k > 1)
    assert check(LAYER, cfg) is None
    monkeypatch.setattr(AttentionKind, "regions", lambda self, stage: (QUERIES, KEYS_VALUES))
    clear_caches()
    try:
        assert check(LAYER, cfg) is not None
    finally:
        monkeypatch.undo()
        clear_caches()


def _cache(chain: Chain, rng) -> np.ndarray:
    attn = chain.stages[1]
    return rng.standard_normal(kind_of(attn).b_operand(attn)[0]).astype(np.float32)


@pytest.mark.parametrize("n", [1, 5, 100, 256])
def test_the_reference_at_a_length_is_the_chain_with_that_length_compiled_in(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(LAYER.stages[0].a_shape).astype(np.float32)
    ws = [rng.standard_normal(kind_of(s).b_operand(s)[0]).astype(np.float32) * 0.05 for s in LAYER.stages]
    ws[1] = _cache(LAYER, rng)
    attn = LAYER.stages[1]
    # The same layer with n compiled in: its cache buffer the first n rows (and the room for the new tokens).
    fixed = get_workload("llama-layer").chain(tokens=4, cache=n, hidden=1024, ffn=512)
    kv = ws[1].reshape(attn.kv_heads, 2, attn.cache_rows, attn.head_dim)
    fixed_ws = list(ws)
    fixed_ws[1] = np.concatenate([kv[:, :, :n], kv[:, :, -4:]], axis=2).reshape(-1, attn.head_dim)
    got = reference_outputs(LAYER, x, ws, np, cache_len=n)[-1]
    want = reference_outputs(fixed, x, fixed_ws, np)[-1]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_append_at_a_length_writes_the_rows_after_it():
    chain = length.at(LAYER, 10)
    attn = chain.stages[1]
    assert (attn.cache, attn.cache_rows) == (10, 256 + 4)
    w = np.zeros(kind_of(attn).b_operand(attn)[0], np.float32)
    view = kind_of(attn).b_written(np, w, attn)
    view[...] = 1
    rows = w.reshape(attn.kv_heads, 2, attn.cache_rows, attn.head_dim)[0, 0, :, 0]
    assert list(np.flatnonzero(rows)) == [10, 11, 12, 13]
    expected = kind_of(attn).b_expected(np, np.ones((4, attn.qkv_cols), np.float32), attn)
    assert expected.shape == view.shape


def test_the_runtime_takes_a_length_exactly_where_the_entry_has_a_room():
    layer = {"label": "llama-layer/tokens=1", "room": 4096}
    with pytest.raises(RuntimeArgumentError, match=r"^llama-layer/tokens=1: reads the cache's length at run time: "
                                                   r"pass cache_len="):
        check_length(layer, None)
    with pytest.raises(RuntimeArgumentError, match=r"^cache_len: 4097; accepted: 0\.\.4096 tokens"):
        check_length(layer, 4097)
    with pytest.raises(RuntimeArgumentError, match=r"^cache_len: a CUDA array is expected .* on the host$"):
        check_length(layer, np.array([3], np.int32))
    check_length(layer, 4096)
    with pytest.raises(RuntimeArgumentError, match=r"^gpt3/tokens=1: its cache length is compiled in; pass no "
                                                   r"cache_len$"):
        check_length({"label": "gpt3/tokens=1", "room": None}, 5)


def test_a_decode_layers_bundle_entry_says_its_room_for_both_launchers(tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    from tuner.codegen import compile as tc
    from tuner.shipping.bundle import write_entry
    from tuner.shipping.runtime import read_manifest

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    entry = write_entry(tmp_path / "e", LAYER, coverage(LAYER, "sync")[0], {"name": "NVIDIA H200", "arch": "sm_90"})
    assert read_manifest(entry)["room"] == 256
    assert "room 256" in (entry / "entry.txt").read_text().splitlines()
    prompt = get_workload("llama-layer").chain(tokens=16, cache=0, hidden=1024, ffn=512)
    other = write_entry(tmp_path / "p", prompt, coverage(prompt, "sync")[0], {"name": "NVIDIA H200", "arch": "sm_90"})
    assert read_manifest(other)["room"] is None
    assert not any(l.startswith("room") for l in (other / "entry.txt").read_text().splitlines())


@pytest.mark.gpu
def test_one_decode_layer_entry_serves_a_loop_of_lengths_from_one_captured_graph(tmp_path):
    # A step captured once with its length in device memory, replayed at three lengths (the integer
    # changed in place between replays): each replay matches the reference at its length, and appends
    # the step's keys and values at that length.
    import cupy as cp

    from tuner.backends.gpu import VERIFY_TOL, GpuBackend, rel_error
    from tuner.shipping.bundle import write_entry
    from tuner.shipping.runtime import load

    backend = GpuBackend(warmup=1, reps=3)
    try:
        cfg = next(c for c in coverage(LAYER, "sync") if c.policy == "tile" and c.tiles[1].split_k > 1)
        rt = load(write_entry(tmp_path / "entry", LAYER, cfg, backend.device_info().to_dict()))
        p = backend.problem(LAYER)
        x, ws = p.xs[0], p.ws[0]
        drawn = ws[1].copy()
        lens = cp.zeros(1, dtype=cp.int32)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            rt(x, *ws, cache_len=lens)  # warm: the module loads outside the capture
            stream.begin_capture()
            out = rt(x, *ws, cache_len=lens)
            graph = stream.end_capture()
            for n in (3, 200, 256):
                ws[1][...] = drawn
                lens.fill(n)
                want = reference_outputs(LAYER, x, ws, cache_len=n)
                appended = kind_of(LAYER.stages[1]).b_expected(cp, want[0], length.at(LAYER, n).stages[1])
                graph.launch(stream)
                stream.synchronize()
                assert rel_error(out, want[-1]) < VERIFY_TOL, f"length {n}"
                written = kind_of(LAYER.stages[1]).b_written(cp, ws[1], length.at(LAYER, n).stages[1])
                assert rel_error(written, appended) < VERIFY_TOL, f"append at {n}"
            assert rel_error(rt(x, *ws, cache_len=256), reference_outputs(LAYER, x, ws)[-1]) < VERIFY_TOL
    finally:
        backend.close()
