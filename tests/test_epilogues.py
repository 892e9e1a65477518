"""Epilogues are one registry entry each: the kernel text, the references and the stage widths
all come from it."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.chain.epilogues import EPILOGUES, get_epilogue
from tuner.chain.workloads import Chain, GemmStage, WorkloadError
from tuner.codegen.render import render
from tuner.config import Config, StageTiles
from tuner.sync.policies import pair_env


def two_stage(epilogue: str, n: int = 256) -> Chain:
    first = GemmStage("gemm1", 64, n, 128, epilogue)
    return Chain("test", (("tokens", 64),), (first, GemmStage("gemm2", 64, 128, first.n_out, "none", a_from=0)))


TILES = StageTiles(bm=64, bn=128, bk=32, wm=2, wn=2, stages=3)
TILE_SYNC = Config((TILES, TILES), "tile", "row", "block", "two_stream")


@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_every_epilogue_reaches_the_kernel_through_its_entry(name):
    e = get_epilogue(name)
    src = render(two_stage(name), TILE_SYNC).source
    if e.fold == 1:
        assert f"const float v0 = {e.elem('acc[i][j][e]')}, v1 = {e.elem('acc[i][j][e + 1]')};" in src
    else:
        assert f"f2h({e.pair('acc[i][j][e]', 'acc[i][j][e + 1]')})" in src
        assert e.fold_doc in src


def test_a_folding_epilogue_halves_the_stored_width_and_the_tile_the_consumer_reads():
    chain = two_stage("silu_mul")
    assert chain.stages[0].n_out == 128
    grids = TILE_SYNC.grids(chain)
    assert pair_env(*grids)["BN1"] == 64  # a 128-wide gate/up tile stores 64 columns


def test_a_folding_epilogue_needs_whole_column_pairs():
    with pytest.raises(WorkloadError, match="multiple of 2"):
        GemmStage("gemm1", 64, 255, 128, "silu_mul")


def test_unknown_epilogue_lists_the_accepted_ones():
    with pytest.raises(WorkloadError, match="accepted: none, gelu, relu, silu_mul"):
        GemmStage("gemm1", 64, 256, 128, "tanh")


def test_references_compute_what_the_names_say():
    rng = np.random.default_rng(0)
    c = rng.standard_normal((3, 8)).astype(np.float32)
    assert np.array_equal(get_epilogue("none").reference(np, c), c)
    assert np.array_equal(get_epilogue("relu").reference(np, c), np.where(c > 0, c, 0))
    g, u = c[:, 0::2], c[:, 1::2]
    np.testing.assert_allclose(get_epilogue("silu_mul").reference(np, c), g * (1 / (1 + np.exp(-g))) * u, rtol=1e-6)
    x = np.float32(1.3)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(get_epilogue("gelu").reference(np, np.array([x])), [gelu], rtol=1e-6)


def test_every_epilogue_compiles_in_a_tile_synchronized_chain(tmp_path):
    from tuner.codegen import compile as tc

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    for name in sorted(EPILOGUES):
        mod = tc.compile_source(render(two_stage(name), TILE_SYNC).source, "sm_90a", cache_dir=tmp_path)
        assert not mod.spills, name
