"""On a CUDA GPU: every policy x order x dispatch x launch mode computes the right chain."""
from __future__ import annotations

import pytest

from tuner.chain.workloads import get_workload
from tuner.search.cases import clustered, combos, coverage, persistent, reallocated, three_warpgroups

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def kernels_compiled_ahead(request):
    """Every kernel of this module's cases compiled before the first test, in one pool over all the
    host's cores: on a cold cache each test's own batch of a few dozen left most cores idle at its
    tail. A carried cache answers at once (``tests/precompile_gpu.py`` lists the sources). A run of
    a few of the tests (``-k``) compiles just theirs, as each test does for itself."""
    if sum(getattr(item, "module", None) is request.module for item in request.session.items) < 10:
        return
    from precompile_gpu import sources

    from tuner.backends.gpu import query_device
    from tuner.codegen.compile import compile_many, target_arch

    for _ in compile_many(sources().items(), target_arch(query_device().arch), accept_other_toolkit=True):
        pass


@pytest.fixture(scope="module")
def backend():
    from tuner.backends.gpu import GpuBackend

    b = GpuBackend(warmup=1, reps=3)
    yield b
    b.close()


def failures_of(backend, chain, cfgs) -> list[str]:
    """Measure (verify, then time) every config, compiled ahead over all the host's cores first."""
    list(backend.prepare([(chain, c) for c in cfgs]))
    return [f"{c.short()}: {m.reason}: {m.message}" for c in cfgs if not (m := backend.measure(chain, c)).ok]


# An odd size: M=1000 rows, N of both stages not a multiple of any tile width.
ODD = dict(tokens=1000, hidden=1032, ffn=776)


# The MLP chains every combination runs at, and the sizes of the clustered configs.
MLP_CASES = [("gpt3", ODD), ("gpt3", dict(tokens=1)), ("gpt3", dict(tokens=64)), ("gpt3", dict(tokens=1000)),
             ("gpt3", dict(tokens=2048)), ("llama", dict(tokens=100, hidden=1032, ffn=776))]
CLUSTER_SIZES = [ODD, dict(tokens=64), dict(tokens=256)]
MMAS = ["sync", "wgmma", "wgmma_tma", "wgmma_tma_t"]


@pytest.mark.parametrize("workload,size", MLP_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("mma", MMAS)
def test_every_combination_is_correct(backend, workload, size, mma):
    chain = get_workload(workload).chain(**size)
    failures = failures_of(backend, chain, coverage(chain, mma))
    assert not failures, "\n".join(failures)
    assert len(coverage(chain)) == len(combos())


@pytest.mark.parametrize("size", CLUSTER_SIZES,
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_clusters_sharing_tma_copies_are_correct(backend, size):
    chain = get_workload("gpt3").chain(**size)
    cfgs = clustered(chain)
    assert cfgs
    failures = failures_of(backend, chain, cfgs)
    assert not failures, "\n".join(failures)


def test_a_backend_timing_graphs_verifies_and_times_every_launch_mode_from_graphs():
    from tuner.backends.gpu import GpuBackend

    chain = get_workload("gpt3").chain(tokens=64)
    b = GpuBackend(warmup=1, reps=3, graphs=True)
    try:
        cfgs = coverage(chain, "wgmma_tma")
        failures = failures_of(b, chain, cfgs)
        assert not failures, "\n".join(failures)
        m = b.measure(chain, cfgs[0], screen=True)
        assert m.ok and m.graphs and len(m.times_us) == b.SCREEN_REPS
    finally:
        b.close()


# Tiles of two MMA warpgroups that take their producer warpgroup's registers (setmaxnreg).
REALLOC_CASES = [("gpt3", ODD), ("llama", dict(tokens=1000, hidden=1032, ffn=776))]


def persistent_grids(chain):
    """The grids the persistent-block tests run, each with its configs: every persistent config
    on 8 blocks, and the configs splitting their last wave along K that only 7 blocks allow."""
    seven = [c for c in persistent(chain, sms=7) if any(t.tail_split for t in c.tiles)]
    return [(8, persistent(chain, sms=8)), (7, seven)]


@pytest.mark.parametrize("workload,size", REALLOC_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
def test_tiles_that_move_registers_between_warpgroups_are_correct(backend, workload, size):
    chain = get_workload(workload).chain(**size)
    cfgs = reallocated(chain)
    assert cfgs
    failures = failures_of(backend, chain, cfgs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("workload,size", REALLOC_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("graphs", [False, True], ids=["launches", "graphs"])
def test_persistent_blocks_looping_over_tiles_are_correct(workload, size, graphs):
    from tuner.backends.gpu import GpuBackend

    chain = get_workload(workload).chain(**size)
    # 8 blocks, each looping over 4 to 26 tiles; then 7, where the tile counts that fill whole waves
    # of 8 leave a partial last wave, for the configs splitting it along K that 8 blocks cannot have.
    for blocks, cfgs in persistent_grids(chain):
        assert cfgs
        b = GpuBackend(warmup=1, reps=3, graphs=graphs, persistent_blocks=blocks)
        try:
            failures = failures_of(b, chain, cfgs)
            assert not failures, f"{blocks} blocks:\n" + "\n".join(failures)
        finally:
            b.close()


@pytest.mark.parametrize("workload,size", REALLOC_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
def test_tiles_of_three_mma_warpgroups_are_correct(workload, size):
    """Tiles of three MMA warpgroups (llama's space holds the transposed one): 192x192 and a
    transposed tile of 192 weight rows taking their producer warpgroup's registers, and 192x128
    beside a producer warp, under every combination but the fused launch; then persistent on 8
    blocks."""
    from tuner.backends.gpu import GpuBackend

    chain = get_workload(workload).chain(**size)
    plain = three_warpgroups(chain)
    looping = [c for c in three_warpgroups(chain, sms=8) if any(t.persist for t in c.tiles)]
    assert plain and looping
    for blocks, cfgs in ((None, plain), (8, looping)):
        b = GpuBackend(warmup=1, reps=3, **({} if blocks is None else {"persistent_blocks": blocks}))
        try:
            failures = failures_of(b, chain, cfgs)
            assert not failures, f"{blocks or 'one tile per'} blocks:\n" + "\n".join(failures)
        finally:
            b.close()


@pytest.mark.parametrize("mma", MMAS)
def test_repeated_runs_without_reset_stay_correct(backend, mma):
    chain = get_workload("gpt3").chain(**ODD)
    cfg = next(c for c in coverage(chain, mma) if c.policy == "tile" and c.launch == "fused")
    runner, m = backend.load(chain, cfg)
    assert runner is not None, m.message
    for _ in range(3):
        err, why = backend.verify(chain, runner)
        assert why is None, (why, err)
    assert runner.epoch == 3


def test_missing_post_is_reported_as_timeout_not_a_hang(backend):
    chain = get_workload("gpt3").chain(**ODD)
    cfg = next(c for c in coverage(chain) if c.policy == "tile" and c.launch == "fused")
    m = backend.measure(chain, cfg, fault="missing_post")
    assert not m.ok and m.reason == "timeout", m


def test_cubins_compiled_on_another_host_load_without_recompiling(tmp_path):
    """Compile anywhere, run on the GPU: a cache filled by a CPU host (``python tests/precompile_gpu.py``,
    carried here and named by TUNER_CARRIED_CACHE) is used as is."""
    import os

    from tuner.backends.gpu import GpuBackend
    from tuner.codegen import compile as tc
    from tuner.codegen.render import render

    carried = os.environ.get("TUNER_CARRIED_CACHE")
    if not carried:
        pytest.skip("no carried cache: set TUNER_CARRIED_CACHE to a cache filled on another host")
    chain = get_workload("gpt3").chain(**ODD)
    before = dict(tc.cache_stats)
    backend = GpuBackend(warmup=1, reps=3, cache_dir=carried)
    for cfg in coverage(chain):
        mod = tc.compile_source(render(chain, cfg).source, tc.target_arch("sm_90"), cache_dir=carried, accept_other_toolkit=True)
        assert mod.cached, cfg.short()
        m = backend.measure(chain, cfg)
        assert m.ok, (cfg.short(), m.reason, m.message)
    hits = sum(tc.cache_stats.get(k, 0) - before.get(k, 0) for k in ("hits", "other_toolkit_hits"))
    assert tc.cache_stats.get("misses", 0) == before.get("misses", 0)
    print(f"carried cache: {hits} hits, 0 compiles; built by NVRTC {mod.toolkit}, here {tc.toolkit_version()}")


@pytest.mark.parametrize("workload,size", [("gpt3", dict(tokens=100, hidden=1032, ffn=776)),
                                           ("llama", dict(tokens=100, hidden=1032, ffn=776)),
                                           ("gpt3-attn", dict(tokens=4)), ("llama-attn", dict(tokens=3, cache=1500)),
                                           ("gpt3-attn", dict(tokens=512, cache=0))],
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_baselines_compute_the_chain_they_are_timed_as(backend, workload, size):
    """Each epilogue's and stage kind's CuPy and PyTorch forms (the attention's: SDPA) against the
    float32 reference."""
    from tuner.backends.gpu import VERIFY_TOL, reference, rel_error
    from tuner.bench.baselines import cupy_chain, torch_chains

    chain = get_workload(workload).chain(**size)
    p = backend.problem(chain)
    ref = reference(chain, p.xs[0], p.ws[0])
    assert rel_error(cupy_chain(chain, p.xs[0], p.ws[0])(), ref) < VERIFY_TOL
    eager = torch_chains(chain, p.xs[0], p.ws[0]).get("torch eager")
    if eager is not None:
        import cupy as cp

        assert rel_error(cp.asarray(eager()), ref) < VERIFY_TOL


# Convolutions: 96 channels and 30x30 images divide no tile; 7x7x512 is ResNet-38's last layer.
CONV_ODD = dict(batch=3, height=30, width=30, channels=96)
CONV_CASES = [("resnet38", CONV_ODD, "sync"), ("resnet38", dict(batch=1), "sync"), ("resnet38", dict(batch=1), "wgmma"),
              ("resnet38", dict(batch=2, height=56, width=56, channels=64), "sync"),
              ("resnet38", dict(batch=2, height=28, width=28, channels=128), "wgmma"),
              ("resnet38", dict(batch=4, height=7, width=7, channels=512), "sync"),
              ("vgg19", dict(batch=1), "sync"), ("vgg19", dict(batch=2, height=14, width=14, channels=512), "wgmma")]


@pytest.mark.parametrize("workload,size,mma", CONV_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
def test_every_combination_is_correct_for_convolutions(backend, workload, size, mma):
    """Each sync choice of a convolution chain against the float32 reference convolution."""
    chain = get_workload(workload).chain(**size)
    cfgs = coverage(chain, mma)  # each a point of the shipped space: tests/test_space.py
    failures = failures_of(backend, chain, cfgs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("workload, size", [("gpt3", ODD), ("llama", dict(tokens=100, hidden=1032, ffn=776)),
                                           ("llama-attn", dict(tokens=16, cache=2048))])
def test_the_runtime_runs_a_bundle_entry_from_cupy_and_torch_inside_and_outside_a_graph(backend, tmp_path, workload,
                                                                                         size):
    import cupy as cp

    from tuner.backends.gpu import VERIFY_TOL, reference, rel_error
    from tuner.shipping.bundle import write_entry
    from tuner.shipping.runtime import load

    chain = get_workload(workload).chain(**size)
    cfg = next(c for c in coverage(chain, "wgmma") if c.policy == "tile" and c.launch == "two_stream")
    rt = load(write_entry(tmp_path / "entry", chain, cfg, backend.device_info().to_dict()))
    p = backend.problem(chain)
    x, ws = p.xs[0], p.ws[0]
    ref = reference(chain, x, ws)
    assert rel_error(rt(x, *ws), ref) < VERIFY_TOL
    stream = cp.cuda.Stream(non_blocking=True)
    x2 = x.copy()
    with stream:
        rt(x, *ws)  # warm: the module loads outside the capture
        stream.begin_capture()
        out = rt(x2, *ws)
        graph = stream.end_capture()
        # Replayed again and again, between plain calls, on changing input: each replay must wait
        # for its own run's posts (a tile-sync chain whose waits pass early computes on stale tiles).
        for i in range(4):
            x2[...] = x if i % 2 else -x
            out[...] = 0
            graph.launch(stream)
            stream.synchronize()
            assert rel_error(out, ref if i % 2 else reference(chain, -x, ws)) < VERIFY_TOL, f"replay {i}"
            assert rel_error(rt(x, *ws), ref) < VERIFY_TOL, f"plain call after replay {i}"
    torch = pytest.importorskip("torch")
    tx, tw = torch.as_tensor(x, device="cuda"), [torch.as_tensor(w, device="cuda") for w in ws]
    assert rel_error(cp.asarray(rt(tx, *tw)), ref) < VERIFY_TOL
    assert rel_error(cp.asarray(rt(tx[:7].contiguous(), *tw)), ref[:7]) < VERIFY_TOL  # padded to the entry


@pytest.mark.parametrize("kind", ["tile-sync", "persistent"])
def test_the_cpp_example_runs_a_bundle_entry_and_checks_it(backend, tmp_path, kind):
    """The C++ launcher runs an entry; a persistent one exported for a device of 8 SMs runs on this
    one's SMs (its grid sized at load)."""
    import shutil
    import subprocess

    from tuner.shipping.bundle import CPP_DIR, CPP_FILES, write_entry

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    chain = get_workload("gpt3").chain(**ODD)
    device = backend.device_info().to_dict()
    if kind == "persistent":
        cfg = persistent(chain, sms=8)[0]
        device["sms"] = 8
    else:
        cfg = next(c for c in coverage(chain, "wgmma_tma") if c.policy == "tile" and c.launch == "fused")
    entry = write_entry(tmp_path / "entry", chain, cfg, device)
    cpp = CPP_DIR
    exe = tmp_path / "example"
    build = subprocess.run([nvcc, "-O2", "-std=c++17", *(str(cpp / f) for f in CPP_FILES if f.endswith(".cpp")),
                            "-lcuda", "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe), str(entry)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "relative error" in run.stdout


@pytest.mark.parametrize("mma", MMAS)
def test_chains_replayed_from_cuda_graphs_number_their_runs_and_stay_correct(backend, mma):
    """Sources with the epoch on the device (render(..., device_epoch=True)): every launch mode
    replayed from a graph many times, then a graph replay and a plain run still match the reference."""
    import cupy as cp

    from tuner.backends.gpu import VERIFY_TOL, reference, rel_error

    chain = get_workload("gpt3").chain(**ODD)
    for cfg in coverage(chain, mma):
        runner, m = backend.load(chain, cfg, device_epoch=True)
        assert runner is not None, m.message
        assert backend.verify(chain, runner)[1] is None, cfg.short()
        runner.capture()
        runner.time_graphs(3, 10)
        p = runner.problem
        runner.graphs[0].launch(runner.streams[0])
        runner.streams[0].synchronize()
        assert not runner.error_flag(), cfg.short()
        assert rel_error(p.ys[-1], reference(chain, p.xs[0], p.ws[0])) < VERIFY_TOL, cfg.short()
        assert backend.verify(chain, runner)[1] is None, cfg.short()
        cp.cuda.Device().synchronize()


def test_bench_times_graphs_of_our_chains_and_of_cupy(backend):
    from tuner.bench.baselines import baseline_timers

    chain = get_workload("resnet38").chain(batch=1)
    cfgs = [c for c in coverage(chain) if c.policy == "tile"][:2]
    p = backend.problem(chain)
    got = backend.time_rounds(chain, cfgs, 2, extra=baseline_timers(chain, list(zip(p.xs, p.ws)), graphs=True),
                              graphs=True)
    assert all(isinstance(got[c], list) and len(got[c]) == 2 for c in cfgs), got


def test_sustained_rounds_time_a_verified_chain_and_the_library_after_their_own_runs(backend):
    """bench --sustained: each timing follows 0.2 s of the source's own runs; the config is still
    verified after the rounds, and every source gets its rounds."""
    from tuner.bench.baselines import baseline_timers

    chain = get_workload("resnet38").chain(batch=1)
    cfg = next(c for c in coverage(chain) if c.policy == "tile")
    p = backend.problem(chain)
    extra = baseline_timers(chain, list(zip(p.xs, p.ws)), graphs=True)
    got = backend.time_rounds(chain, [cfg], 2, extra=extra, graphs=True, heat_s=0.2)
    assert all(isinstance(got[k], list) and len(got[k]) == 2 and min(got[k]) > 0 for k in [cfg, *extra]), got


def test_the_runtime_runs_a_convolution_entry_on_nhwc_images(backend, tmp_path):
    import cupy as cp

    from tuner.backends.gpu import VERIFY_TOL, reference, rel_error
    from tuner.shipping.bundle import write_entry
    from tuner.shipping.runtime import load

    chain = get_workload("resnet38").chain(**CONV_ODD)
    cfg = next(c for c in coverage(chain) if c.policy == "tile" and c.launch == "fused")
    rt = load(write_entry(tmp_path / "entry", chain, cfg, backend.device_info().to_dict()))
    p = backend.problem(chain)
    st = chain.stages[0]
    images = p.xs[0].reshape(st.batch, st.height, st.width, st.c_in)
    out = rt(images, *p.ws[0])
    assert out.shape == (st.batch, st.height, st.width, chain.stages[-1].c_out)
    assert rel_error(cp.ascontiguousarray(out).reshape(st.m, -1), reference(chain, p.xs[0], p.ws[0])) < VERIFY_TOL


# Attention layers: decode (a few tokens on a cache, split over the keys on every other config),
# prompts, and odd sizes (3 tokens on a cache of 1500; 1000 tokens).
ATTN_CASES = [("gpt3-attn", dict(tokens=1)), ("gpt3-attn", dict(tokens=4)), ("gpt3-attn", dict(tokens=16, cache=2048)),
              ("gpt3-attn", dict(tokens=512, cache=0)), ("gpt3-attn", dict(tokens=1000, cache=0)),
              ("llama-attn", dict(tokens=1)), ("llama-attn", dict(tokens=16, cache=2048)),
              ("llama-attn", dict(tokens=3, cache=1500)), ("llama-attn", dict(tokens=1024, cache=0))]
ATTN_MMAS = ["sync", "wgmma", "wgmma_tma_t"]  # of the projections: the attention tile itself is mma.sync


@pytest.mark.parametrize("workload,size", ATTN_CASES,
                         ids=lambda s: s if isinstance(s, str) else ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("mma", ATTN_MMAS)
def test_every_combination_is_correct_for_attention(backend, workload, size, mma):
    """Each sync choice of an attention layer (softmax and causal mask included) against the float32 reference."""
    chain = get_workload(workload).chain(**size)
    cfgs = coverage(chain, mma)  # each a point of the shipped space: tests/test_space.py
    failures = failures_of(backend, chain, cfgs)
    assert not failures, "\n".join(failures)
