"""The row norm folded into a GEMM (tuner.chain.norm): RMSNorm or LayerNorm of the stage's A rows as a scale
per row of its accumulators, the gain (and LayerNorm's centring) folded into the weights. Rendered into every MMA form, compiled with NVRTC,
and (on a GPU) verified against the float32 reference of the normed chain."""
from __future__ import annotations

import importlib
import re
from dataclasses import replace

import numpy as np
import pytest

from tuner.chain import norm, residual
from tuner.chain.kinds import WorkloadError
from tuner.chain.tiling import StageGrid
from tuner.chain.workloads import Chain, get_workload
from tuner.codegen.render import render
from tuner.search.cases import coverage
from kernel_checks import compile_errors, gpu_failures

# A pre-norm MLP block: [40 tokens, 256] -> norm -> 512 (GeLU) -> 256, plus the block's input.
PLAIN = get_workload("gpt3").chain(tokens=40, hidden=256, ffn=512)
CHAINS = {name: Chain(PLAIN.workload, PLAIN.size, (replace(PLAIN.stages[0], norm=name),
                                                   replace(PLAIN.stages[1], residual=residual.INPUT)))
          for name in ("rms", "layer")}
CHAIN = CHAINS["rms"]
MMAS = ("sync", "wgmma", "wgmma_tma", "wgmma_tma_t")


def test_an_unknown_norm_is_refused_in_one_line():
    with pytest.raises(WorkloadError, match=r"^stage gemm1: unknown norm 'layer2'; accepted: none, rms, layer$"):
        replace(PLAIN.stages[0], norm="layer2")


def test_the_reference_scales_each_row_by_its_root_mean_square():
    a = np.array([[3.0, 4.0], [1.0, 1.0]], np.float32)
    out = norm.reference(np, a, norm.NORMS["rms"])
    assert np.allclose(out, a / np.sqrt([[12.5 + 1e-5], [1.0 + 1e-5]]))


def test_the_layer_norm_reference_centres_each_row_first():
    a = np.array([[1.0, 3.0]], np.float32)
    assert np.allclose(norm.reference(np, a, norm.NORMS["layer"]), [[-1.0, 1.0]], atol=1e-4)


@pytest.mark.parametrize("name", ["rms", "layer"])
def test_the_folded_product_scaled_by_the_kernels_row_scale_is_the_normed_product(name):
    # What the kernel computes (row_scale in norm.cuh, then the scale of each accumulator) from the
    # stored rows and the folded weights, against the norm of the rows times the model's weights.
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 64)) + 2.0  # rows far from zero mean: the centring matters
    w, g = rng.standard_normal((5, 64)), rng.standard_normal(64)
    n = norm.NORMS[name]
    folded = norm.fold_weight(w, g, n)
    mean = a.mean(axis=1, keepdims=True) if n.center else 0.0
    rs = 1 / np.sqrt((a * a).mean(axis=1, keepdims=True) - mean * mean + n.eps)
    assert np.allclose(rs * (a @ folded.T), (norm.reference(np, a, n) * g) @ w.T, atol=1e-9)


def test_a_normed_stage_is_not_persistent():
    cfg = coverage(CHAIN, "wgmma_tma")[0]
    grid = StageGrid(CHAIN.stages[0], replace(cfg.tiles[0], persist=1, split_k=1))
    from tuner.chain.kinds import kind_of
    assert kind_of(CHAIN.stages[0]).tiling_problem(grid) == "stage gemm1: a normed stage's tiles are not persistent"


@pytest.mark.parametrize("mma", MMAS)
@pytest.mark.parametrize("name", ["rms", "layer"])
def test_only_a_normed_stage_computes_and_applies_row_scales(mma, name):
    chain = CHAINS[name]
    source = render(chain, coverage(chain, mma)[0]).source
    first, second = source[:source.index("// ---- stage 1")], source[source.index("// ---- stage 1"):]
    center = "true" if name == "layer" else "false"
    assert re.search(rf"row_scale<T::BM, T::(MMA_)?THREADS, {center}>\(A, M, K, m0, 1e-05f, tuner_rs\);", first)
    assert "tuner_rs[(row) - m0] * (" in first
    assert "row_scale<" not in second and "tuner_rs" not in second
    assert "row_scale" not in render(PLAIN, coverage(PLAIN, mma)[0]).source  # nor is the header pasted


def test_the_normed_chain_compiles_in_each_mma_form(tmp_path):
    assert not compile_errors([render(chain, coverage(chain, mma)[0]) for mma in MMAS for chain in CHAINS.values()],
                              tmp_path)


@pytest.mark.gpu
def test_every_sync_choice_of_a_normed_chain_is_correct(monkeypatch):
    """Each sync choice of every MMA form, epilogues staged and direct, against the float32 reference."""
    render_module = importlib.import_module("tuner.codegen.render")
    failures = []
    for staged in (True, False):
        monkeypatch.setattr(render_module, "STAGED_EPILOGUE", staged)
        for name, chain in CHAINS.items():
            failures += [f"{name}: {f}" for f in gpu_failures([(chain, c) for mma in MMAS for c in coverage(chain, mma)])]
    assert not failures, "\n".join(failures)
