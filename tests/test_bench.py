"""The bench's choices that need no GPU: which tilings go on, which clusters are tried, how the
final rounds interleave, and the table."""
from __future__ import annotations

import json

from tuner import bench
from tuner.backends.base import DeviceInfo
from tuner.config import Config, StageTiles
from tuner.paths import home
from tuner.space import load_space
from tuner.workloads import get_workload

H200 = DeviceInfo("NVIDIA H200")
T = StageTiles(128, 192, 64, 2, 1, 4, 1, "wgmma_tma")


def feasible(tokens: int):
    chain = get_workload("gpt3").chain(tokens=tokens)
    return chain, load_space(home() / "search_spaces" / "gpt3.toml").feasible(chain, H200)


def test_the_three_fastest_go_on_plus_the_fastest_unclustered_when_all_three_are_clustered():
    a, b, c, d = (StageTiles(128, bn, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1) for bn in (96, 128, 192, 256))
    plain = StageTiles(128, 96, 64, 2, 1, 4)
    assert bench.pick_best([(3.0, c), (1.0, a), (2.0, b), (9.0, plain), (4.0, d)]) == [a, b, c, plain]
    assert bench.pick_best([(3.0, c), (1.0, a), (2.0, plain)]) == [a, plain, c]


def test_cluster_variants_are_the_feasible_cluster_shapes_of_each_tiling():
    _, fs = feasible(256)  # two 128-row tiles: both cluster shapes divide both stages
    got = bench.cluster_variants(fs, 1, [T])
    assert [(v.cm, v.cn) for v in got] == [(2, 1), (1, 2)] and all(v.bn == 192 for v in got)
    _, fs64 = feasible(64)  # one row of 64-row tiles: no cluster along M
    t64 = StageTiles(64, 96, 128, 1, 1, 4, 1, "wgmma_tma")
    assert [(v.cm, v.cn) for v in bench.cluster_variants(fs64, 1, [t64])] == [(1, 2)]
    assert bench.cluster_variants(fs64, 1, [StageTiles(64, 96, 64, 2, 2, 4)]) == []  # mma.sync has no TMA


class FakeRunner:
    def __init__(self, name, log, flag=0):
        self.name, self.log, self.flag = name, log, flag

    def time(self, warmup, reps):
        self.log.append(self.name)
        return [10.0 + len(self.log)] * reps

    def error_flag(self):
        return self.flag


class FakeBackend:
    def __init__(self, log, broken=(), broken_after_timing=()):
        self.log, self.broken, self.broken_after_timing = log, broken, broken_after_timing

    def load(self, chain, cfg):
        from tuner.backends.base import Measurement

        return FakeRunner(cfg.policy, self.log), Measurement(ok=True)

    def verify(self, chain, runner):
        timed = runner.name in self.log
        if runner.name in self.broken or (timed and runner.name in self.broken_after_timing):
            return 0.0, "incorrect"
        return 0.001, None

    def problem(self, chain):
        class P:
            xs, ws = [None], [None]
        return P()


def test_final_rounds_interleave_every_contestant_and_leave_out_one_that_fails_verification(monkeypatch):
    import tuner.baselines

    log: list[str] = []
    monkeypatch.setattr(tuner.baselines, "baseline_timers",
                        lambda chain, x, ws: {"cublas": lambda w, r: log.append("cublas") or [50.0] * r})
    chain = get_workload("gpt3").chain(tokens=64)
    contestants = {"stream": Config((T, T), "stream", "row", "block", "serial"),
                   "tile": Config((T, T), "tile", "row", "block", "two_stream")}
    notes: list[str] = []
    out = bench.final_rounds(FakeBackend(log, broken=("tile",)), chain, contestants, rounds=3, log=notes.append,
                             idle_s=0)
    assert log == ["stream", "cublas"] * 3
    assert set(out) == {"stream", "cublas"} and len(out["stream"]) == 3
    assert any("leave out tile" in n and "incorrect" in n for n in notes)


def test_final_rounds_leave_out_a_config_that_goes_wrong_while_it_is_timed(monkeypatch):
    import tuner.baselines

    log: list[str] = []
    monkeypatch.setattr(tuner.baselines, "baseline_timers", lambda chain, x, ws: {})
    chain = get_workload("gpt3").chain(tokens=64)
    contestants = {"stream": Config((T, T), "stream", "row", "block", "serial"),
                   "tile": Config((T, T), "tile", "row", "block", "two_stream")}
    notes: list[str] = []
    out = bench.final_rounds(FakeBackend(log, broken_after_timing=("tile",)), chain, contestants, rounds=2,
                             log=notes.append, idle_s=0)
    assert log == ["stream", "tile"] * 2  # it verified before, so it was timed
    assert set(out) == {"stream"}
    assert any("leave out tile" in n and "after the timed rounds" in n for n in notes)


def test_the_three_fastest_of_each_kind_go_to_the_final_rounds_and_the_rounds_pick():
    cfg = {name: Config((T, T), pol, order, "block", launch)
           for name, pol, order, launch in (("s1", "stream", "row", "serial"), ("s2", "stream", "col", "serial"),
                                            ("t1", "tile", "row", "two_stream"), ("t2", "tile", "col", "two_stream"),
                                            ("t3", "row", "row", "two_stream"), ("t4", "row", "col", "two_stream"))}
    passed = [(130.0, cfg["s2"]), (129.0, cfg["s1"]), (131.0, cfg["t1"]), (129.5, cfg["t2"]), (140.0, cfg["t4"]),
              (130.5, cfg["t3"])]
    fin = bench.finalists(passed)
    assert fin == {"stream": cfg["s1"], "stream#2": cfg["s2"], "tile": cfg["t2"], "tile#2": cfg["t3"],
                   "tile#3": cfg["t1"]}
    # The rounds, at one clock for all, decide: stream#2 wins its kind; tile#2 was left out.
    final = {"stream": 128.6, "stream#2": 128.1, "tile": 129.9, "tile#3": 129.2, "cupy cublas": 125.9}
    assert bench.fastest_per_kind(fin, final) == {"stream": "stream#2", "tile": "tile#3"}


def test_the_table_gives_ratios_to_every_baseline_and_the_floor():
    row = {"tokens": 256, "floor_us": 100.0, "stream_us": 130.0, "tile_us": 125.0, "tuned_us": 125.0,
           "baselines_us": {"cupy cublas": 137.5}}
    text = bench.table({"rows": [row]})
    head, line = text.splitlines()
    cells = dict(zip(head.split("  "), line.split("  ")))
    assert cells["tuned/floor"] == "1.25" and cells["x vs cupy cublas"] == "1.10" and cells["tile vs stream"] == "1.04"


def test_a_bench_summary_hands_its_picks_to_the_study(tmp_path):
    tile = Config((T, T), "row", "row", "block", "two_stream")
    stream = Config((T, T), "stream", "row", "block", "serial")
    path = tmp_path / "gpt3.bench.json"
    path.write_text(json.dumps({"rows": [{"label": "gpt3/tokens=256,hidden=12288,ffn=6144",
                                          "tile_config": tile.to_dict(), "stream_config": stream.to_dict()},
                                         {"label": "other", "tile_config": None}]}))
    assert bench.picked_configs(path, "gpt3/tokens=256,hidden=12288,ffn=6144") == [tile, stream]
    assert bench.picked_configs(path, "other") == [] and bench.picked_configs(tmp_path / "none.json", "x") == []
