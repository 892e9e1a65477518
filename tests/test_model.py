"""The fitted ranking of stage tilings: what it reads, how it falls back, and that it orders
stages it has not seen better than the coarse model (on the recorded H200 timings)."""
from __future__ import annotations

import json

from tuner.backends.base import DeviceInfo
from tuner.chain.workloads import chain_from_label
from tuner.config import StageGrid, StageTiles
from tuner.search import cost_model as model

H200 = DeviceInfo("NVIDIA H200")
GEMM1 = chain_from_label("gpt3.gemm1/tokens=256,hidden=12288,ffn=6144").stages[0]


def test_the_shipped_fit_weighs_exactly_the_features_the_model_computes():
    weights = json.loads(model.FIT_FILE.read_text())["weights"]
    g = StageGrid(GEMM1, StageTiles(128, 192, 64, 2, 1, 4, 2, "wgmma_tma"))
    assert set(weights) == set(model.features(g, H200))


def test_without_a_fit_the_ranking_is_the_coarse_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(model, "FIT_FILE", tmp_path / "none.json")
    model._fitted.cache_clear()
    try:
        g = StageGrid(GEMM1, StageTiles(128, 192, 64, 2, 1, 4, 2, "wgmma_tma"))
        assert model.rank_seconds(g, H200) == model.stage_seconds(g, H200)
    finally:
        model._fitted.cache_clear()


def test_the_fit_orders_unseen_stages_better_than_the_coarse_model(run_benchmark):
    done = run_benchmark("fit_cost_model.py", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line[:24].strip(): line[24:].split() for line in done.stdout.splitlines()
            if line.startswith(("coarse model", "fitted"))}
    coarse, unseen = float(rows["coarse model"][0]), float(rows["fitted, workload unseen"][0])
    assert unseen > coarse + 0.3, done.stdout  # median rank correlation with the measured order
    assert float(rows["fitted, size unseen"][2]) > float(rows["coarse model"][2]), done.stdout
