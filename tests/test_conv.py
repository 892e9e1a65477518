"""The convolution stage kind: its index map, its waits proven by the checker, its reference and kernels."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tuner.backends.base import DeviceInfo
from tuner.chain import conv, gemm
from tuner.chain.kinds import KINDS
from tuner.chain.workloads import WorkloadError, get_workload
from tuner.checker.checks import check
from tuner.checker.model import Protocol
from tuner.checker.soundness import check_soundness
from tuner.codegen.render import render
from tuner.config import Config, StageTiles
from tuner.paths import home
from tuner.search.space import load_space
from tuner.sync.policies import POLICIES

CONV = KINDS["conv"]

H200 = DeviceInfo("test H200")
ODD = dict(batch=3, height=30, width=30, channels=96)  # no tile divides it


def tiles(bm=64, bn=64, bk=32) -> StageTiles:
    return StageTiles(bm=bm, bn=bn, bk=bk, wm=2, wn=2, stages=3)


def direct_conv(x: np.ndarray, w: np.ndarray, n: int, h: int, wd: int, c: int) -> np.ndarray:
    """A 3x3, stride 1, padding 1 convolution written out pixel by pixel."""
    img = x.reshape(n, h, wd, c)
    wt = w.reshape(-1, 3, 3, c)
    out = np.zeros((n, h, wd, wt.shape[0]), np.float64)
    for b, i, j, dh, dw in itertools.product(range(n), range(h), range(wd), range(3), range(3)):
        ii, jj = i + dh - 1, j + dw - 1
        if 0 <= ii < h and 0 <= jj < wd:
            out[b, i, j] += wt[:, dh, dw, :] @ img[b, ii, jj]
    return out.reshape(n * h * wd, -1)


def test_the_reference_is_a_convolution():
    rng = np.random.default_rng(0)
    chain = get_workload("resnet38").chain(batch=2, height=5, width=4, channels=8)
    st = chain.stages[0]
    x = rng.standard_normal(st.a_shape)
    w = rng.standard_normal((st.n, st.k))
    np.testing.assert_allclose(CONV.reference(np, x, w, st), direct_conv(x, w, 2, 5, 4, 8), rtol=1e-10, atol=1e-10)


def test_channels_must_be_whole_16_byte_pieces():
    with pytest.raises(WorkloadError, match=r"--channels 100: accepted: a multiple of 8 from 8 to 8192 \(nearest: 96 or 104\)"):
        get_workload("resnet38").chain(batch=1, channels=100)


@pytest.mark.parametrize("bm, bk", [(16, 32), (64, 32), (128, 96)])
def test_the_true_dependencies_are_every_pixel_of_the_window(bm, bk):
    """reads() against brute force: every (consumer pixel, tap) that lands on the image."""
    chain = get_workload("resnet38").chain(**ODD)
    grids = Config((tiles(bm=64, bn=32), tiles(bm=bm, bk=bk)), "tile", "row", "block", "two_stream").grids(chain)
    prod, cons = grids
    st = cons.stage
    got = {(m2, int(s), int(m1), int(n1)): int(k) for m2, r in enumerate(CONV.reads(prod, cons))
           for s, m1, n1, k in zip(*r)}
    want: dict[tuple[int, int, int, int], int] = {}
    for kc in range(cons.kc):
        tap, c0 = kc * bk // st.c_in, kc * bk % st.c_in
        dh, dw = tap // 3 - 1, tap % 3 - 1
        n1s = {c // prod.tiles.bn for c in range(c0, min(c0 + bk, st.c_in))}
        for p in range(st.m):
            h, w = (p // st.width) % st.height, p % st.width
            if 0 <= h + dh < st.height and 0 <= w + dw < st.width:
                for n1 in n1s:
                    key = (p // bm, kc // cons.ks, (p + dh * st.width + dw) // prod.tiles.bm, n1)
                    want.setdefault(key, kc)
    assert got == want


@pytest.mark.parametrize("workload, size", [("resnet38", dict(batch=1)), ("resnet38", ODD), ("vgg19", dict(batch=2))])
def test_the_checker_accepts_every_sync_choice_the_space_holds(workload, size):
    chain = get_workload(workload).chain(**size)
    fs = load_space(home() / "search_spaces" / f"{workload}.toml").feasible(chain, H200)
    rng = np.random.default_rng(3)
    seen = set()
    for combo in fs.combos:
        try:
            cfg = fs.sample(rng, combo)
        except ValueError:
            continue
        seen.add(combo[0])
        assert check(chain, cfg) is None, cfg.short()
    assert seen == {"stream", "tile", "row"}


@pytest.mark.parametrize("policy", ["tile", "row"])
def test_a_policy_that_ignores_the_halo_is_refused_naming_the_tile(policy):
    """With the GEMM's rows in its index map (the tile's own rows at every tap), a policy waits for
    the consumer tile's own pixels only: the pixels past either end of the tile are read unwaited."""
    chain = get_workload("resnet38").chain(batch=1, height=14, width=14, channels=64)
    cfg = Config((tiles(bm=32), tiles(bm=32)), policy, "row", "block", "two_stream")
    prod, cons = cfg.grids(chain)
    assert check_soundness(prod, cons, POLICIES[policy]) is None
    halo_blind = POLICIES[policy].bind({**conv.INDEX_MAP, **{k: v for k, v in gemm.INDEX_MAP.items() if "ROW" in k
                                                                or "TILE" in k}})
    why = check_soundness(prod, cons, halo_blind)
    assert why is not None
    # Tile 0's last pixels read, one to their right (tap (0, +1)), the first pixel of producer tile 1.
    assert why.startswith("conv2 tile (m=0, n=0, s=0) chunk 10 (tap (+0, +1), channels 0..31) reads conv1 tile "
                          "(m=1, n=0) (rows 32..63"), why
    assert check(chain, cfg) is None
    assert Protocol.of(chain, cfg, policy=halo_blind).policy is halo_blind


def test_the_tma_copies_and_split_taps_are_outside_the_space():
    chain = get_workload("resnet38").chain(**ODD)
    fs = load_space(home() / "search_spaces" / "resnet38.toml").feasible(chain, H200)
    assert "wgmma_tma" not in fs.domains()["conv1.mma"]
    assert 64 not in fs.domains()["conv1.bk"]  # 96 channels: a 64-deep chunk would hold two taps


@pytest.mark.parametrize("mma", ["sync", "wgmma"])
def test_a_tile_synchronized_convolution_chain_compiles(tmp_path, mma):
    from tuner.codegen import compile as tc

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    # A wgmma chunk is whole 64-wide swizzle atoms, so 96 channels (two taps a chunk) take mma.sync only.
    size = ODD if mma == "sync" else {**ODD, "channels": 128}
    chain = get_workload("resnet38").chain(**size)
    fs = load_space(home() / "search_spaces" / "resnet38.toml").feasible(chain, H200)
    t = (StageTiles(bm=64, bn=96, bk=32, wm=2, wn=2, stages=3) if mma == "sync"
         else StageTiles(bm=64, bn=128, bk=64, wm=1, wn=1, stages=4, mma="wgmma"))
    cfg = Config((t, t), "tile", "row", "block", "two_stream")
    assert fs.contains(cfg) is None and check(chain, cfg) is None
    src = render(chain, cfg).source
    assert f"Im2col3x3<30, 30, {size['channels']}>{{A}}" in src and "constexpr int W2 = 30;" in src
    mod = tc.compile_source(src, "sm_90a", cache_dir=tmp_path)
    assert not mod.spills


@pytest.mark.parametrize("workload, size, stages_timed", [("resnet38", dict(batch=1), 1), ("vgg19", dict(batch=2), 1),
                                                          ("resnet38", ODD, 1)])
def test_the_default_study_runs_a_convolution_chain_end_to_end(tmp_path, workload, size, stages_timed):
    """The whole loop on a backend of made-up times (tests/chaos_backend.py, no GPU): the stage pass
    times one stage for the twins, every proposal is feasible and checker-accepted, the budget holds."""
    import optuna
    from chaos_backend import ChaosBackend

    from tuner.study.loop import run_study

    chain = get_workload(workload).chain(**size)
    space = load_space(home() / "search_spaces" / f"{workload}.toml")
    url = f"sqlite:///{tmp_path / 's.db'}"
    out = run_study(chain, space, ChaosBackend(), url, trials=150, final=False, transfer=False)
    assert out.measured == 150 and out.refused == 0
    studies = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(url)}
    stage_studies = [n for n, k in studies.items() if "/conv" in n and k]
    assert len(stage_studies) == stages_timed
    chain_trials = [t for t in optuna.load_study(study_name=out.name, storage=url).get_trials()
                    if t.user_attrs.get("measured")]
    # Both kinds of sync are measured: stream order, and a tile-level policy (tile or row).
    assert chain_trials and {"stream" if t.params["policy"] == "stream" else "tile" for t in chain_trials} == \
        {"stream", "tile"}
