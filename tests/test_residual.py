"""The residual add (tuner.chain.residual): a stage's output plus the chain's input x, as a transformer
layer's output and down projections add their input back. Rendered into every store path the stage
may take, compiled with NVRTC, and (on a GPU) verified against the float32 reference."""
from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pytest

from tuner.chain import residual
from tuner.chain.kinds import WorkloadError
from tuner.chain.workloads import Chain, get_workload
from tuner.codegen.render import render
from tuner.search.cases import coverage
from kernel_checks import compile_errors, gpu_failures

# A small MLP whose second GEMM adds the chain's input back: [40 tokens, 256] -> 512 -> 256 (+ x).
PLAIN = get_workload("gpt3").chain(tokens=40, hidden=256, ffn=512)
CHAIN = Chain(PLAIN.workload, PLAIN.size, (PLAIN.stages[0], replace(PLAIN.stages[1], residual=residual.INPUT)))
MMAS = ("sync", "wgmma", "wgmma_tma", "wgmma_tma_t")
# The comment each of a GEMM tile's store paths renders (kernel_templates/tile_gemm.j2).
PATHS = {"tma store": "Epilogue through the TMA", "transposed": "Epilogue of a transposed tile",
         "staged": "Epilogue through shared memory", "direct": "// Epilogue and store."}


def second_stage(source: str) -> str:
    return source[source.index("// ---- stage 1"):]


def test_a_residual_must_have_the_outputs_shape():
    with pytest.raises(WorkloadError, match=r"^stage gemm1: its residual is the chain's 40x256 input, its output "
                                            r"is 40x512; accepted: equal shapes$"):
        Chain(PLAIN.workload, PLAIN.size, (replace(PLAIN.stages[0], residual=residual.INPUT), PLAIN.stages[1]))


def test_the_reference_adds_the_input_in_float32():
    out, x = np.ones((2, 3), np.float32), np.full((2, 3), 0.5, np.float16)
    assert (residual.reference(np, out, x) == 1.5).all()


def test_a_stage_timed_alone_leaves_the_add_out():
    assert residual.has(CHAIN.stages[1]) and not residual.has(CHAIN.alone(1).stages[0])


def persistent(cfg):
    """``cfg`` with the residual stage in persistent blocks (whose epilogue parks beside the ring), stream-ordered."""
    return replace(cfg, tiles=(cfg.tiles[0], replace(cfg.tiles[1], persist=1, split_k=1)), policy="stream",
                   launch="serial")


def cases() -> list:
    """(store path, config, whether epilogues may go through shared memory): one of each path."""
    sync, tma, transposed = (coverage(CHAIN, mma)[0] for mma in ("sync", "wgmma_tma", "wgmma_tma_t"))
    return [("staged", sync, True), ("direct", sync, False), ("tma store", persistent(tma), True),
            ("transposed", transposed, True), ("transposed", persistent(transposed), True)]


@pytest.fixture(params=cases(), ids=lambda c: c[0])
def case(request, monkeypatch):
    render_module = importlib.import_module("tuner.codegen.render")  # the module, not the function of its name
    path, cfg, staged = request.param
    monkeypatch.setattr(render_module, "STAGED_EPILOGUE", staged)
    return path, cfg


def test_each_store_path_adds_the_residual_and_a_plain_stage_reads_none(case):
    path, cfg = case
    source = render(CHAIN, cfg).source
    assert PATHS[path] in second_stage(source)
    assert "ldcg_h2f(RES + " in second_stage(source)
    assert "const half_t* __restrict__ RES" not in source[:source.index("// ---- stage 1")]
    assert "ldcg_h2f(RES + " not in render(PLAIN, cfg).source


def test_the_residual_chain_compiles_in_each_store_path(case, tmp_path):
    assert not compile_errors([render(CHAIN, case[1])], tmp_path)


@pytest.mark.gpu
def test_every_sync_choice_and_store_path_of_a_residual_chain_is_correct(monkeypatch):
    """Each sync choice of every MMA form, and each store path, with the add, against the float32 reference."""
    render_module = importlib.import_module("tuner.codegen.render")
    failures = []
    for staged in (True, False):
        monkeypatch.setattr(render_module, "STAGED_EPILOGUE", staged)
        cfgs = [c for mma in MMAS for c in coverage(CHAIN, mma)] + [c for p, c, s in cases() if s == staged]
        failures += gpu_failures([(CHAIN, c) for c in cfgs])
    assert not failures, "\n".join(failures)
