"""Rendering: the launch plan, and the one check of whether its kernels can launch on a device."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tuner.backends.base import DeviceInfo
from tuner.chain.tiling import StoreLayout, tail_split
from tuner.chain.workloads import get_workload
from tuner.codegen.render import a_rows, copy_parts, device_grid, render
from tuner.config import Config, StageTiles
from tuner.paths import home
from tuner.search.cases import clustered, coverage

CHAIN = get_workload("gpt3").chain(tokens=64)


def test_a_fused_config_is_one_launch_and_a_two_stream_config_has_a_guard():
    by_launch = {c.launch: render(CHAIN, c) for c in coverage(CHAIN)}
    assert [l.kernel for l in by_launch["fused"].launches] == ["fused_kernel"]
    assert [l.kernel for l in by_launch["two_stream"].launches] == ["stage0_kernel", "guard1_kernel", "stage1_kernel"]


def test_a_pdl_chain_waits_in_every_stage_but_the_first_at_its_first_copy_and_lets_all_but_the_last_start_the_next():
    chain = get_workload("llama-attn").chain(tokens=1)
    pdl = [c for c in coverage(chain) if c.launch == "pdl"]
    assert {c.policy for c in pdl} == {"stream", "tile", "row"}
    for cfg in pdl:
        r = render(chain, cfg)
        assert [(l.kernel, l.pdl, l.stream) for l in r.launches] == [
            ("stage0_kernel", False, 0), ("stage1_kernel", True, 0), ("stage2_kernel", True, 0)]
        tiles = r.source.split("void stage0_tile(")[1].split("_kernel(")[0].split("void stage")
        kernels = r.source.split("stage0_kernel(")[1].split("_kernel(")
        # Under the stream policy the wait is in the tile, on its first chunk (the copies that depend
        # on no stage go first), never at a kernel's entry; under a sync policy a tile waits on its
        # producer tiles' semaphores instead, and the dependent launch only holds it back until
        # every block of the stage before has started.
        waits = [t.count("griddepcontrol.wait;") for t in tiles]
        if cfg.policy == "stream":
            assert waits == [0, 1, 1] and all("if (first_chunk)" in t for t in tiles[1:]), waits
        else:
            assert waits == [0, 0, 0] and all("tuner_spin_until" in t for t in tiles[1:])
        assert [k.count("griddepcontrol.wait;") for k in kernels] == [0, 0, 0]
        starts = [k.count("griddepcontrol.launch_dependents") for k in kernels]
        assert starts == [1, 1, 0], starts
        if cfg.policy == "stream":
            assert "griddepcontrol" not in render(chain, replace(cfg, launch="serial")).source


def test_launch_problems_name_the_kernel_and_the_resource_that_does_not_fit():
    r = render(CHAIN, coverage(CHAIN)[0])
    fits = {k: {"registers": 128, "smem": 16} for k in r.kernels}
    assert r.launch_problems(fits, DeviceInfo("H200")) == []
    too_many_regs = {k: {"registers": 255, "smem": 16} for k in r.kernels}
    small = DeviceInfo("small", regs_per_block=16384, smem_per_block=48 * 1024)
    problems = r.launch_problems(too_many_regs, small)
    assert any("stage0_kernel" in p and "registers" in p for p in problems)
    assert any("shared memory" in p for p in problems)


def test_a_clustered_stage_kernel_declares_its_cluster_and_the_launch_grid_divides_into_it():
    chain = get_workload("gpt3").chain(tokens=256)
    for cfg in clustered(chain):
        r = render(chain, cfg)
        for i, t in enumerate(cfg.tiles):
            launch = next(l for l in r.launches if l.kernel == f"stage{i}_kernel")
            declared = f"__cluster_dims__({t.cluster}, 1, 1)\nstage{i}_kernel(" in r.source
            assert declared == (t.cluster > 1) and launch.grid % t.cluster == 0, cfg.short()


def test_the_blocks_sharing_a_multicast_slab_each_fetch_a_part_of_it_where_it_splits_into_swizzle_groups():
    chain = get_workload("gpt3").chain(tokens=256)
    for cfg in clustered(chain):
        r = render(chain, cfg)
        maps = list(r.tensor_maps)
        for i, (g, t) in enumerate(zip(cfg.grids(chain), cfg.tiles)):
            if not t.tma:
                continue
            b = next(k for k, m in enumerate(maps) if m.operand == f"w{i}")  # the stage's A map just before
            rows = a_rows(g.stage.m, t.bm)
            # a row of cn blocks shares the A slab, a column of cm blocks the B slab
            assert maps[b - 1].box_rows == (rows // t.cn if rows % (8 * t.cn) == 0 else rows), cfg.short()
            assert maps[b].box_rows == (t.bn // t.cm if t.bn % (8 * t.cm) == 0 else t.bn), cfg.short()
            assert f", {t.cm}, {t.cn}, {copy_parts(rows, t.cn)}, {copy_parts(t.bn, t.cm)}>;" in r.source
    assert copy_parts(128, 2) == 2 and copy_parts(136, 2) == 1 and copy_parts(64, 1) == 1


def test_the_epilogue_goes_through_shared_memory_only_where_the_output_tile_fits_in_the_ring():

    def staged(tiles: StageTiles, workload: str = "gpt3") -> bool:
        chain = get_workload(workload).chain(tokens=64).alone(0)
        return "Epilogue through shared memory" in render(chain, Config((tiles,), "stream", "col", "block", "serial")).source

    # 128 x (192 + 8) halves of output against a ring of 4 x (128 + 192) x 64 halves
    assert staged(StageTiles(128, 192, 64, 2, 1, 4, 1, "wgmma_tma"))
    # a two-slot mma.sync ring of 2 x (128 + 256) rows of 80 bytes holds less than 128 x (256 + 8) halves
    assert not staged(StageTiles(128, 256, 32, 2, 4, 2))
    # SiLU-times-gate folds column pairs: half as many output columns to park
    assert staged(StageTiles(64, 128, 64, 1, 1, 3, 1, "wgmma_tma"), "llama")


def test_a_split_tile_counts_arrivals_and_stored_partials_apart_and_only_the_last_split_reduces():
    from tuner.config import Config, StageTiles

    chain = get_workload("gpt3").chain(tokens=256).alone(0)

    def rendered(split: int):
        return render(chain, Config((StageTiles(128, 192, 64, 2, 1, 4, split, "wgmma_tma"),), "stream", "col", "block",
                                    "serial"))

    one, two = rendered(1), rendered(2)
    tiles = 2 * 32  # 256 / 128 rows x 6144 / 192 columns
    assert two.state_words - one.state_words == 2 * tiles  # an arrival and a stored-partials counter per tile
    assert two.ws_floats == 2 * 256 * 6144  # a slot per split (the last one's stays unused)
    src = two.source
    # the splits that are not last store and post, then leave; the last waits for S - 1 posts, then adds
    assert src.index("tuner_signal(written);") < src.index("return;", src.index("tuner_signal(written);"))
    assert "epoch * (u32)(S - 1)" in src and "split_reduce<T, S>" in src


def test_graph_replayable_sources_number_their_runs_in_every_kernel(tmp_path):
    """render(..., device_epoch=True): every kernel derives its run from a counter of its own (the
    epoch argument is ignored), so a captured graph replays as is; the default source is untouched."""
    from tuner.chain.workloads import get_workload
    from tuner.codegen.render import render
    from tuner.search.cases import coverage

    chain = get_workload("gpt3").chain(tokens=1000, hidden=1032, ffn=776)
    for cfg in coverage(chain):
        plain, graph = render(chain, cfg), render(chain, cfg, device_epoch=True)
        assert "tuner_run" not in plain.source and not plain.device_epoch and graph.device_epoch
        assert graph.source.count("= tuner_run(") == len(graph.kernels), cfg.short()
        assert "u32 epoch_arg" in graph.source
        assert graph.state_words >= plain.state_words
    try:
        from tuner.codegen import compile as tc

        tc.toolkit_version()
    except Exception:
        return
    for cfg in coverage(chain)[::4]:
        assert not tc.compile_source(render(chain, cfg, device_epoch=True).source, "sm_90a", cache_dir=tmp_path).spills


def test_a_pdl_launch_hands_the_driver_pointers_the_epoch_and_the_serialization_attribute(monkeypatch):
    """The marshalling of a programmatic dependent launch, against a stand-in for cuda-bindings'
    driver module: the kernel parameters go as the address of an array of pointers to the
    arguments' values (device pointers as 64 bits, the epoch as 32), refilled at each launch."""
    import ctypes
    import types

    import numpy as np
    import pytest

    bindings = pytest.importorskip("cuda.bindings")
    from tuner.backends.gpu import _dependent, launch_dependent
    from tuner.codegen.render import Launch

    calls = []

    def launch(cfg, f, params, extra):
        slots = (ctypes.c_void_p * 4).from_address(params)
        kinds = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64)
        calls.append((cfg, f, tuple(k.from_address(a).value for k, a in zip(kinds, slots)), extra))
        return (0,)

    fake = types.SimpleNamespace(
        CUlaunchConfig=types.SimpleNamespace, CUstream=lambda p: ("stream", p), CUfunction=lambda p: ("func", p),
        CUlaunchAttribute=lambda: types.SimpleNamespace(value=types.SimpleNamespace()),
        CUlaunchAttributeID=types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION="pss"),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0), cuGetErrorString=lambda e: (0, b"?"), cuLaunchKernelEx=launch)
    monkeypatch.setattr(bindings, "driver", fake, raising=False)
    array = lambda ptr: types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=77))  # CuPy's RawKernel
    _dependent.cache_clear()  # built once per kernel, launch and stream
    l = Launch("stage1_kernel", 132, 256, 99_000, 0, pdl=True)
    for epoch in (5, 6):
        launch_dependent(kernel, l, (array(1000), array(2000 + epoch), np.uint32(epoch), array(1 << 40)),
                         types.SimpleNamespace(ptr=42))
    _dependent.cache_clear()
    (cfg, f, values, extra), (cfg2, _, values2, _) = calls
    assert f == ("func", 77) and extra == 0 and cfg.hStream == ("stream", 42) and cfg2 is cfg
    assert (cfg.gridDimX, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (132, 256, 99_000, 1)
    assert cfg.attrs[0].id == "pss" and cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1
    assert values == (1000, 2005, 5, 1 << 40) and values2 == (1000, 2006, 6, 1 << 40)


def test_the_kernels_of_the_gpu_tests_are_listed_for_compiling_ahead():
    """tests/precompile_gpu.py renders what `pytest -m gpu` compiles, so that a CPU host can fill
    the cache the GPU host runs from: GEMM, convolution and attention chains, PDL launches, and
    sources that number their runs on the device (for graph replays)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import precompile_gpu

    sources = precompile_gpu.sources().values()
    assert len(sources) > 900
    for marker in ("attention_mainloop<", "Im2col3x3<", "griddepcontrol.wait", "mainloop_tma<", "epoch_arg"):
        assert any(marker in s for s in sources), marker


def test_a_tile_too_large_for_the_even_share_moves_registers_from_its_producer_warpgroup():
    """128x256 in two warpgroups needs 128 accumulators a thread, past the 168 registers that 288
    threads share: its producer becomes a warpgroup that gives its registers up (setmaxnreg) and
    leaves after its copies, so the epilogue and the post sync the MMA warps alone."""
    from tuner.chain.tiling import PRODUCER_REGS, even_share
    from tuner.search.cost_model import registers
    from tuner.search.space import load_space

    chain = get_workload("gpt3").chain(tokens=1000, hidden=1032, ffn=776)
    big, usual = StageTiles(128, 256, 64, 2, 1, 4, 1, "wgmma_tma"), StageTiles(128, 192, 64, 2, 1, 5, 1, "wgmma_tma")
    assert big.realloc and not usual.realloc and (big.threads, usual.threads) == (384, 288)
    assert PRODUCER_REGS * 128 + big.consumer_regs * 256 == even_share(384) * 384 == registers(big) * big.threads
    src = render(chain, Config((big, usual), "tile", "row", "block", "two_stream")).source
    tile0 = src.split("void stage0_tile(")[1].split("void stage1_tile(")[0]
    tile1 = src.split("void stage1_tile(")[1].split("_kernel(")[0]
    assert f"TileTMA<128, 256, 64, 2, 1, 4, 128, 1, 1, 1, 1, {PRODUCER_REGS}, {big.consumer_regs}>" in src
    producer, consumer = tile0.split("tma_consume<T>(")
    assert "tma_produce<T" in producer and "return;" in producer
    assert "__syncthreads()" not in consumer and "tuner_bar_sync(T::MMA_THREADS);  // every thread's stores" in consumer
    assert "mainloop_tma<" in tile1 and "tma_consume<T>(" not in tile1 and "tuner_bar_sync(" not in tile1
    # A fused launch has one register count at entry: no such tile joins one.
    fs = load_space(home() / "search_spaces" / "gpt3.toml").feasible(chain, DeviceInfo("NVIDIA H200"))
    assert fs.contains(Config((big, big), "tile", "row", "block", "two_stream")) is None
    assert "setmaxnreg" in fs.contains(Config((big, big), "tile", "row", "ticket", "fused"))
    fused = ("tile", "row", "ticket", "fused", "none")
    rng = np.random.default_rng(0)
    assert not any(t.realloc for _ in range(200) for t in fs.sample(rng, fused).tiles)


def test_three_mma_warpgroups_share_what_their_producer_warpgroup_gives_up():
    """192 weight rows by 184 tokens (transposed), or 192x192: 92 or 96 accumulators a thread, past
    the 128 that a producer warp beside three warpgroups leaves. The producer warpgroup keeps 40
    and the three take 152 each (40 * 128 + 152 * 384 within the register file); only TMA-fed
    tiles get three."""
    from tuner.chain.tiling import PRODUCER_REGS, REGISTERS, StageGrid, consumer_regs
    from tuner.search.constraints import Limits, stage_problem

    chain = get_workload("llama").chain(tokens=1100, hidden=4096, ffn=11008)
    wide = StageTiles(184, 192, 64, 1, 3, 4, 1, "wgmma_tma_t")
    assert wide.realloc and wide.threads == 512 and wide.consumer_regs == consumer_regs(3) == 152
    assert PRODUCER_REGS * 128 + 152 * 384 <= REGISTERS < PRODUCER_REGS * 128 + 160 * 384
    dev = DeviceInfo("NVIDIA H200")
    assert StageGrid(chain.stages[1], wide).nt == 22  # 4096 weight rows: 21 whole tiles and one of 64
    assert stage_problem(StageGrid(chain.stages[1], wide), Limits(), dev) is None
    too_wide = StageTiles(200, 192, 64, 1, 3, 4, 1, "wgmma_tma_t")  # 100 accumulators
    assert stage_problem(StageGrid(chain.stages[1], too_wide), Limits(), dev)[0] == "accumulators"
    copied = StageTiles(192, 192, 64, 3, 1, 4, 1, "wgmma")  # cp.async-fed: no producer to give registers
    assert stage_problem(StageGrid(chain.stages[1], copied), Limits(), dev)[0] == "warp_tile"
    square = StageTiles(192, 192, 64, 3, 1, 4, 1, "wgmma_tma")
    assert square.realloc and StageGrid(chain.stages[1], square).blocks == 132  # 6 x 22: one wave
    assert stage_problem(StageGrid(chain.stages[1], square), Limits(), dev) is None
    src = render(chain, Config((wide, square), "stream", "col", "block", "serial")).source
    assert f"TileTMAT<184, 192, 64, 1, 3, 4, 184, 1, 1, 1, 1, {PRODUCER_REGS}, 152>" in src
    assert f"TileTMA<192, 192, 64, 3, 1, 4, 192, 1, 1, 1, 1, {PRODUCER_REGS}, 152>" in src


def test_a_ticket_tile_that_moves_registers_waits_out_its_mainloop_in_shared_memory():
    """Held in a register across the change of register counts, a ticket's tile spilled (4 bytes,
    llama-attn at 1000 tokens, 256x128 T1x2 k16); a block index is read again for nothing."""
    chain = get_workload("gpt3").chain(tokens=1000, hidden=1032, ffn=776)
    big = StageTiles(128, 256, 64, 2, 1, 4, 1, "wgmma_tma")
    ticket = render(chain, Config((big, big), "stream", "row", "ticket", "serial")).source
    block = render(chain, Config((big, big), "stream", "row", "block", "serial")).source
    assert ticket.count("kept_tile = t;") == 2 and "kept_tile" not in block
    tile0 = ticket.split("void stage0_tile(")[1].split("void stage1_tile(")[0]
    mainloop, after = tile0.split("tma_consume<T>(")
    assert "kept_tile = t;" in mainloop and "volatile u32*>(&kept_tile)" in after


def test_a_process_renders_from_the_templates_folder_tuner_home_names_at_each_render(tmp_path, monkeypatch):
    """What lets benchmarks/template_ab.py time a changed template beside the shipped one in one process."""
    import shutil

    cfg = coverage(CHAIN, "wgmma_tma")[0]
    shipped, shipped_home = render(CHAIN, cfg), str(home())
    shutil.copytree(home() / "kernel_templates", tmp_path / "kernel_templates")
    header = tmp_path / "kernel_templates" / "wgmma.cuh"
    header.write_text(header.read_text() + "\n// a variant\n")
    template = tmp_path / "kernel_templates" / "chain.cu.j2"
    template.write_text("// a variant of the chain\n" + template.read_text())
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    variant = render(CHAIN, cfg)
    assert "// a variant\n" in variant.source and "// a variant of the chain" in variant.source
    assert variant.hash != shipped.hash
    monkeypatch.setenv("TUNER_HOME", shipped_home)
    assert render(CHAIN, cfg).hash == shipped.hash


def test_a_persistent_stage_launches_one_block_per_sm_in_whole_clusters_and_loops_over_its_tiles():
    chain = get_workload("gpt3").chain(tokens=2048)  # 128x128 tiles: 16x48 for gemm1, 16x96 for gemm2
    plain = StageTiles(128, 128, 64, 2, 1, 4, 1, "wgmma_tma")
    cfg = Config((replace(plain, persist=1), replace(plain, persist=1, cm=2)), "stream", "row", "block", "pdl")
    r = render(chain, cfg, device_epoch=True, sms=132)
    assert [(l.kernel, l.grid) for l in r.launches] == [("stage0_kernel", 132), ("stage1_kernel", 132)]
    assert [l.grid for l in render(chain, cfg, sms=9).launches] == [9, 8]  # clusters of 2 blocks
    # The launches say so, for a bundle run on a device of other SMs: its grid is sized there.
    assert [(l.grid_cap, l.cluster) for l in r.launches] == [(768, 1), (1536, 2)]
    assert [device_grid(l, 114) for l in r.launches] == [114, 114] and device_grid(r.launches[1], 9) == 8
    assert [device_grid(l, 10_000) for l in r.launches] == [768, 1536]
    assert r.source.count("work.each(t, ") == 4  # each stage's producer and MMA warps
    assert r.source.count("PersistentWork work(768u, (u32)KC, gridDim.x, 0u, (u32)KC)") == 1  # whole tiles only
    assert r.source.count("tuner_run(state + ") == 2 and "gridDim.x, &run_ticket" in r.source
    # Only the persistent tile carries its ring on and hands its last slot back.
    one = render(chain, replace(cfg, tiles=(plain, plain)), sms=132)
    assert [l.grid for l in one.launches] == [768, 1536] and "gridDim.x" not in one.source
    assert [device_grid(l, 114) for l in one.launches] == [768, 1536]  # one block a tile, on any device
    assert "tma_consume_tile<T, true>" in r.source and "tma_consume_tile<T, true>" not in one.source


def test_persistent_blocks_wait_and_post_tile_by_tile_and_count_their_tiles_for_the_guard():
    chain = get_workload("gpt3").chain(tokens=2048)  # 128x256 tiles: 16x24 for gemm1, 16x48 for gemm2
    t = StageTiles(128, 256, 64, 2, 1, 3, 1, "wgmma_tma", persist=1)
    r = render(chain, Config((t, t), "tile", "row", "block", "two_stream"), device_epoch=True, sms=132)
    assert [(l.kernel, l.grid, l.stream) for l in r.launches] == [
        ("stage0_kernel", 132, 0), ("guard1_kernel", 1, 1), ("stage1_kernel", 132, 1)]
    stage0, stage1 = r.source.split("// ---- stage 0")[1].split("// ---- stage 1")
    # A started block counts its tiles, whatever grid it runs on; the guard waits for all 384.
    assert "atomicAdd(state + 387, (384u - 1u - blockIdx.x) / gridDim.x + 1u)" in r.source
    assert "tuner_spin_until(state + 387, epoch * 384u, TUNER_ERR)" in r.source
    # The producer posts each tile inside its MMA warps' loop, once the copy engine has written
    # the tile's stores (not just read them), and before the block leaves.
    mma_loop = stage0.split("work.each(t, ")[2]
    assert mma_loop.count("tuner_signal(") == 1 and stage0.count("tuner_signal(") == 1
    assert mma_loop.index("bulk_commit();") < mma_loop.index("bulk_wait();") < mma_loop.index("tuner_signal(")
    assert mma_loop.index("tuner_signal(") < mma_loop.index("the last tile's stores have read the slice")
    # The consumer's copying thread waits for the tile it is about to load, not the block's first.
    producer_loop = stage1.split("work.each(t, ")[1]
    assert "[&](int kc, bool first) { wait_at(m, n, kc, first); }" in producer_loop
    assert "tuner_spin_until_inline(state + " in stage1


def test_a_stage_splitting_its_last_wave_gives_each_block_of_its_grid_a_workspace_slot_and_two_counters():
    chain = get_workload("gpt3").chain(tokens=2048)  # gemm2: 16x48 = 768 tiles of 128x256, 96 K chunks
    t = StageTiles(128, 256, 64, 2, 1, 3, 1, "wgmma_tma")
    sk = Config((t, replace(t, persist=2)), "stream", "col", "block", "serial")
    assert sk.short().endswith("s3 | 128x256x64 t2x1 s3 ts]")
    # 132 blocks: 108 tiles past the fifth wave, cut at chunk 80; the 24 free blocks take 4 or 5 rests.
    assert tail_split(768, 96, 132) == (108, 80, 5)
    r = render(chain, sk, sms=132)
    stage1 = r.source.split("// ---- stage 1")[1]
    assert "PersistentWork work(768u, (u32)KC, gridDim.x, tail, split)" in stage1 and "meet_parts<T, 2, true>(acc" in stage1
    assert r.ws_floats == 132 * 128 * 256 and [l.grid for l in r.launches] == [384, 132]
    # On a device of more SMs it keeps the blocks its workspace was laid out for; of fewer, fewer.
    assert r.launches[1].grid_cap == 132 and device_grid(r.launches[1], 200) == 132
    assert device_grid(r.launches[1], 100) == 100
    # The grid sizes the workspace and the counters: a smaller device, fewer of each.
    small = render(chain, sk, sms=100)
    assert small.ws_floats == 100 * 128 * 256 and small.state_words == r.state_words - 2 * 32
    plain = render(chain, replace(sk, tiles=(t, replace(t, persist=1))), sms=132)
    assert "meet_parts<T, 2, true>(acc" not in plain.source and plain.ws_floats == 1


def test_a_persistent_transposed_tile_parks_its_epilogue_in_slices_beside_the_ring():
    chain = get_workload("gpt3").chain(tokens=2048)
    t = StageTiles(160, 128, 64, 1, 2, 4, 1, "wgmma_tma_t")
    cfg = Config((replace(t, persist=1), t), "stream", "row", "block", "serial")
    r = render(chain, cfg)
    stage0, stage1 = r.source.split("// ---- stage 1")
    # 160 rows are no whole number of 64-row slices for the TMA: fp32 slices, stored by the threads.
    assert "SR = 64" in stage0 and "TmaRing<T>::epilogue(smem)" in stage0 and "tma_store_2d(tmaps" not in stage0
    assert "SR = 160" in stage1 and "TmaRing<T>::epilogue" not in stage1
    assert [l.smem for l in r.launches] == [t.smem_bytes() + 64 * 132 * 4, t.smem_bytes()]


def test_a_persistent_transposed_tile_of_whole_slices_stores_them_through_the_tma_by_stmatrix():
    chain = get_workload("gpt3").chain(tokens=2048)
    t = StageTiles(256, 128, 64, 1, 2, 4, 1, "wgmma_tma_t", persist=1)
    assert t.tma_store_layout(128) == StoreLayout(rounds=4, box_rows=64, boxes=2)
    r = render(chain, Config((t, t), "stream", "row", "block", "serial"))
    stage0 = r.source.split("// ---- stage 1")[0]
    # Rows 64 at a time, of both warpgroups' boxes, through two 16 KiB slices beside the ring:
    # 4 ring slots still fit, as with fp32 slices.
    assert "constexpr int R = 4, SR = 64, BOXES = 2, SLICES = 2;" in stage0 and "stmatrix_x4_trans(" in stage0
    # Each warpgroup parks its own 64 columns, syncs alone and stores them from its first thread.
    assert "tma_store_2d(tmaps + 32, smem_u32(so + w * SR * 64), n0 + w * 64, m0 + r * SR);" in stage0
    assert stage0.count("warpgroup_bar_sync();") == 2 and "if (threadIdx.x % 128 == 0) bulk_wait_read<SLICES - 1>();" in stage0
    assert [(m.operand, m.box_rows) for m in r.tensor_maps][2] == ("y0", 64)
    assert r.launches[0].smem == t.ring_bytes() + 1024 + 16 * 4 + 1024 + 2 * 2 * 64 * 128 <= 227 * 1024
    # Folded pairs (SwiGLU's gate and up) lie in other threads' registers: those stay on fp32 slices.
    assert not t.stores_by_tma(64, 3584) and t.stores_by_tma(128, 12288)


def test_a_persistent_tile_stages_its_epilogue_beside_the_ring_and_waits_before_parking_again():
    chain = get_workload("gpt3").chain(tokens=2048)  # 96 stored columns: no whole 64-column boxes
    t = StageTiles(128, 96, 64, 2, 1, 4, 1, "wgmma_tma", persist=1)
    r = render(chain, Config((t, t), "stream", "row", "block", "serial"))
    assert r.source.count("reinterpret_cast<half_t*>(TmaRing<T>::epilogue(smem))") == 2
    assert r.source.count("the next tile parks here again") == 2 and "tma_store_2d(tmaps" not in r.source
    ring = t.ring_bytes() + 1024 + 16 * 4
    assert [l.smem for l in r.launches] == [ring + 128 * (96 + 8) * 2] * 2


def test_a_persistent_tile_of_whole_64_column_boxes_stores_its_epilogue_through_the_tma():
    chain = get_workload("llama").chain(tokens=2048)  # gemm1 folds gate and up: 64 stored columns of 128
    t = StageTiles(128, 128, 64, 2, 1, 4, 1, "wgmma_tma", persist=1)
    r = render(chain, Config((t, replace(t, persist=0)), "stream", "row", "block", "serial"))
    stage0, stage1 = r.source.split("// ---- stage 1")
    # The output gets a descriptor of its own, written a box of BM rows by 64 columns at a time.
    assert [(m.operand, m.rows, m.cols, m.box_rows) for m in r.tensor_maps] == [
        ("x", 2048, 8192, 128), ("w0", 7168, 8192, 128), ("y0", 2048, 3584, 128),
        ("y0", 2048, 3584, 128), ("w1", 8192, 3584, 128)]
    assert stage0.count("tma_store_2d(tmaps + 32,") == 1 and "n0 / 2 + (b * R + r) * 64" in stage0
    # One round (a warp column's 64 stored columns are one box): thread 0 waits for the engine to
    # have read the slice before it is parked again, and the block's last tile before it leaves;
    # the one-tile-a-block stage stores as before.
    assert "constexpr int R = 1," in stage0 and "tma_store_2d(" not in stage1
    assert "bulk_wait_read<SLICES - 1>();" in stage0 and "if (threadIdx.x == 0) bulk_wait_read();" in stage0
    ring = t.ring_bytes() + 1024 + 16 * 4
    assert [l.smem for l in r.launches] == [ring + 1024 + 128 * 64 * 2, ring]  # one slice, aligned to 1024 bytes

def test_a_persistent_tile_whose_warp_columns_store_several_boxes_parks_them_a_round_at_a_time():
    chain = get_workload("gpt3").chain(tokens=2048)  # gemm2: 12288 stored columns, nothing folded
    t = StageTiles(128, 256, 64, 2, 1, 4, 1, "wgmma_tma", persist=1)
    assert t.stores_by_tma(256, 12288) and t.tma_store_layout(256) == StoreLayout(rounds=4, box_rows=128, boxes=1)
    # Two slices of one 128-row box take turns: the ring keeps a fourth slot that the whole
    # 128 x 256 tile (64 KiB beside it) would not leave room for.
    ring = t.ring_bytes() + 1024 + 16 * 4
    assert t.smem_bytes(256, 12288) == ring + 1024 + 2 * 128 * 64 * 2 <= 227 * 1024 < ring + 128 * (256 + 8) * 2
    r = render(chain, Config((replace(t, persist=0), t), "stream", "row", "block", "serial"))
    stage1 = r.source.split("// ---- stage 1")[1]
    assert "constexpr int R = 4," in stage1 and "if (j * 8 / 1 / 64 % R != r) return;" in stage1
    assert r.launches[1].smem == t.smem_bytes(256, 12288)
    # Two warp columns of 128 stored columns each: two rounds, each parking one box of both.
    assert replace(t, bm=64, wm=1, wn=2).tma_store_layout(256) == StoreLayout(rounds=2, box_rows=64, boxes=2)
    # A share of one box, or of columns that are not whole boxes, parks the whole tile at once.
    assert replace(t, bn=128, wm=1, wn=2).tma_store_layout(128).rounds == 1 == t.tma_store_layout(96).rounds


def test_a_stage_that_reads_the_chains_input_waits_on_no_stage():
    """The posts and waits follow which stage reads which (workloads.edges), not the stages' order:
    a second GEMM that reads x, not the first's output, renders without a wait and the first without a post."""
    from tuner.chain.gemm import GemmStage
    from tuner.chain.workloads import Chain, edges

    plain = get_workload("gpt3").chain(tokens=40, hidden=256, ffn=512)
    apart = Chain(plain.workload, plain.size, (plain.stages[0], GemmStage("gemm2", 40, 256, 256, "none")))
    assert edges(plain.stages) == [(0, 1)] and edges(apart.stages) == []
    cfg = next(c for c in coverage(plain) if c.policy == "tile")
    for chain, waits in ((plain, True), (apart, False)):
        source = render(chain, cfg).source
        second = source[source.index("// ---- stage 1"):]
        assert ("auto wait_at = [&](int m2, int n2, int kc, bool first_chunk)" in second) is waits
        assert ("sync policy 'tile'" in second) is waits


def test_a_stage_read_by_two_stages_is_refused_in_one_line_not_given_one_post():
    """A producer tile posts one semaphore, for one consumer's policy: a second consumer would find
    the first's post overwritten, so the renderer refuses the chain until posts are per producer."""
    import pytest

    from tuner.chain.gemm import GemmStage
    from tuner.chain.workloads import Chain
    from tuner.config import ConfigError

    plain = get_workload("gpt3").chain(tokens=40, hidden=256, ffn=512)
    both = Chain(plain.workload, plain.size, (*plain.stages, GemmStage("gemm3", 40, 256, 512, "none", a_from=0)))
    cfg = next(c for c in coverage(plain) if c.policy == "tile")
    cfg = Config((*cfg.tiles, cfg.tiles[1]), *cfg.globals)
    with pytest.raises(ConfigError, match=r"^gemm1 is read by two stages \(gemm2 and gemm3\); accepted: one consumer "
                                          r"per stage$"):
        render(both, cfg)
