"""A new stage kind is a class of its own and one entry in the registry: the checker, the sync
policies and the code generator take it from there, reading nothing but its interface."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from tuner.chain.expr import Expr
from tuner.chain.gemm import INDEX_MAP, GemmKind, GemmStage
from tuner.chain.kinds import KINDS, kind_of
from tuner.chain.workloads import Chain, WorkloadError
from tuner.checker import check, clear_caches
from tuner.codegen.render import render
from tuner.config import Config, StageTiles


@dataclass(frozen=True)
class ScaledStage(GemmStage):
    """A GEMM whose kernel is told a scale: a toy kind, to show what adding one takes."""

    kind: ClassVar[str] = "scaled"


class ScaledKind(GemmKind):
    """The toy kind: the GEMM's tile, index map and references, and a constant of its own."""

    name = "scaled"

    def template_constants(self, stage: ScaledStage) -> dict[str, object]:
        return {"scale": 1}


@pytest.fixture
def scaled(monkeypatch):
    monkeypatch.setitem(KINDS, "scaled", ScaledKind())
    clear_caches()
    yield
    clear_caches()


def toy_chain() -> Chain:
    return Chain("toy", (("tokens", 256),), (GemmStage("up", 256, 512, 256, "gelu"),
                                             ScaledStage("scaled", 256, 256, 512, "none", a_from=0)))


TILES = (StageTiles(64, 128, 64, 2, 2, 3), StageTiles(64, 64, 64, 2, 2, 3))


@pytest.mark.parametrize("policy,launch", [("tile", "two_stream"), ("row", "pdl"), ("tile", "fused"),
                                           ("stream", "serial")])
def test_a_registered_toy_kind_is_checked_and_rendered(scaled, policy, launch):
    chain = toy_chain()
    cfg = Config(TILES, policy, "row", "ticket" if launch == "fused" else "block", launch)
    assert check(chain, cfg) is None
    src = render(chain, cfg).source
    assert "scaled" in src and src.count("_tile(") >= 2


def test_the_checker_reads_the_toy_kinds_index_map(scaled, monkeypatch):
    # Claim that a consumer tile reads only the producer rows of the tile above it: the policy's
    # waits follow the claim, the true reads do not, and the checker says so.
    wrong = {**INDEX_MAP, "A_ROW_LO": Expr("m2 * BM2 + BM2"), "A_ROW_HI": Expr("m2 * BM2 + 2 * BM2 - 1"),
             "A_TILE_LO": Expr("m2 * BM2 + BM2"), "A_TILE_HI": Expr("m2 * BM2 + 2 * BM2 - 1")}
    monkeypatch.setattr(ScaledKind, "REGIONS", (wrong,))
    clear_caches()
    why = check(toy_chain(), Config(TILES, "tile", "row", "block", "two_stream"))
    assert why is not None and "scaled tile" in why, why


def test_a_stage_of_an_unregistered_kind_is_refused_in_one_line():
    with pytest.raises(WorkloadError, match="unknown stage kind 'scaled'; accepted: gemm, conv, attention"):
        kind_of(ScaledStage("scaled", 256, 256, 512))


def test_the_toy_kinds_chain_compiles_with_nvrtc(scaled, tmp_path):
    from tuner.codegen import compile as tc

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:  # pragma: no cover - the CI install has NVRTC
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    r = render(toy_chain(), Config(TILES, "tile", "row", "block", "two_stream"))
    (_, mod), = tc.compile_many([(r.hash, r.source)], tc.target_arch("sm_90"), cache_dir=tmp_path)
    assert not isinstance(mod, tc.CompileError), mod
    assert set(r.kernels) <= set(mod.kernels)
