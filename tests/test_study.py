"""The tuning loop: feasibility before measuring, resuming, caching, failures, determinism, study files."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.backends.base import FAIL_REASONS, Backend, DeviceInfo, Measurement
from tuner.backends.replay import Record, ReplayBackend, write_recording
from tuner.chain.workloads import get_workload
from tuner.config import Config
from tuner.paths import home
from tuner.search.space import load_space, parse_space
from tuner.storage.trials import StudyError, study_name, summarize
from tuner.study.loop import run_study
from tuner.study.spec import default_study, load_study_file, parse_study

DEVICE = DeviceInfo("fake GPU")
SMALL = parse_space({
    "stage": {"bm": [16, 32, 64], "bn": [64, 128], "bk": [64], "wm": [1, 2], "wn": [1, 2], "stages": [3],
              "split_k": [1, 2]},
}, "small.toml")
CHAIN = get_workload("gpt3").chain(tokens=64)


def shipped_space():
    return load_space(home() / "search_spaces" / "gpt3.toml")


def _digest(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def no_col_order(chain, cfg: Config) -> str | None:
    """Stand-in for the sync checker: refuses every column-order config."""
    return "column order refused by the stand-in checker" if cfg.order == "col" else None


class FakeBackend(Backend):
    """Answers with a time computed from the config (no device), and checks what it is asked."""

    name = "fake"
    features = frozenset({"source_hash"})

    def __init__(self, check=no_col_order, space=SMALL, fail=None, interrupt_at=None):
        self.calls: list[Config] = []
        self.check = check
        self.fs = space.feasible(CHAIN, DEVICE)
        self.fail = fail
        self.interrupt_at = interrupt_at

    def device_info(self) -> DeviceInfo:
        return DEVICE

    def source_hash(self, chain, cfg: Config) -> str:
        return f"{_digest(chain.label, cfg):08x}"

    def measure(self, chain, cfg: Config) -> Measurement:
        # A measuring backend must never see a config that breaks a constraint or the checker.
        if len(chain.stages) == len(CHAIN.stages):
            assert self.fs.contains(cfg) is None, self.fs.contains(cfg)
            assert self.check is None or self.check(chain, cfg) is None
        else:  # a stage timed alone
            assert self.fs.accepts_tiling(CHAIN.stages.index(next(s for s in CHAIN.stages
                                                                   if s.name == chain.stages[0].name)),
                                          cfg.tiles[0])
        self.calls.append(cfg)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail is not None:
            reason = self.fail(len(self.calls) - 1)
            if reason is not None:
                return Measurement.failed(reason, f"{reason} on purpose", source_hash=self.source_hash(chain, cfg))
        t = 50.0 + _digest(cfg) % 1000 / 10
        return Measurement(ok=True, median_us=t, times_us=[t, t], error=1e-4, source_hash=self.source_hash(chain, cfg))


def trials_of(storage: str, chain=CHAIN, device=DEVICE):
    return optuna.load_study(study_name=study_name(chain, device), storage=storage).get_trials()


def measured(trials):
    return [t for t in trials if t.user_attrs.get("measured")]


@pytest.mark.parametrize("strategy", ["tpe", "random", "grid", "staged"])
def test_no_strategy_stores_a_refused_config_and_the_backend_sees_only_accepted_ones(storage, strategy):
    backend = FakeBackend()  # asserts that every config it measures is feasible and checker-accepted
    out = run_study(CHAIN, SMALL, backend, storage, strategy=strategy, seed=0, trials=12, check=no_col_order)
    assert out.measured == 12 and out.stop == "budget" and out.refused == 0
    trials = trials_of(storage)
    assert all(t.user_attrs["measured"] for t in trials)  # nothing refused, nothing failed on purpose, stored
    fs = SMALL.feasible(CHAIN, DEVICE)
    assert all(fs.contains(Config.from_params(t.params, CHAIN.stage_names)) is None for t in trials)


def test_tpe_replaces_a_refused_suggestion_by_a_close_usable_config(storage):
    from tuner.search.strategies import SearchContext, make

    fs = SMALL.feasible(CHAIN, DEVICE)
    tpe = make("tpe")
    tpe.start(SearchContext(CHAIN, fs, DEVICE, lambda c: no_col_order(CHAIN, c) is None, 40, seed=0))
    drawn = [tpe.draw() for _ in range(40)]
    for c in drawn:
        tpe.seen.add(c)
    assert len(set(drawn)) == 40 and all(fs.contains(c) is None and c.order != "col" for c in drawn)


def test_every_study_holds_a_measured_stream_baseline(storage):
    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="tpe", trials=4, check=no_col_order)
    first = measured(trials_of(storage))[0]
    assert first.params["policy"] == "stream" and first.state == TrialState.COMPLETE
    study = optuna.load_study(study_name=study_name(CHAIN, DEVICE), storage=storage)
    assert study.user_attrs["baseline_us"] == summarize(study.get_trials()).baseline_us
    assert study.user_attrs["workload"] == "gpt3" and study.user_attrs["size"]["tokens"] == 64


def test_warm_start_configs_are_measured_first_stream_pick_leading_and_unfit_ones_are_dropped(storage, tmp_path):
    fs = SMALL.feasible(CHAIN, DEVICE)
    good = next(c for c in fs if c.policy == "tile" and c.order == "row" and c.tiles[0].split_k == 2)
    stream = next(c for c in fs if c.policy == "stream" and c.order == "row" and c not in fs.baselines())
    outside = Config(good.tiles, "tile", "row", "block", "serial")  # the tile policy never runs serially
    backend, heard = FakeBackend(), []
    run_study(CHAIN, SMALL, backend, storage, strategy="tpe", trials=6, check=no_col_order,
              warm=[outside, good, stream], log=heard.append)
    assert backend.calls[:2] == [stream, good] and outside not in backend.calls
    assert backend.calls[2:2 + len(fs.baselines())] == fs.baselines()
    assert heard[0] == f"{CHAIN.label}: warm start: 2 of 3 configs a bench picked are in this space"
    assert [h.split(" after ")[0] for h in heard[1:]] == [f"{CHAIN.label}: opening", f"{CHAIN.label}: tpe"]
    # Without a stream pick, the space's stream baselines still come first.
    other = FakeBackend()
    run_study(CHAIN, SMALL, other, f"sqlite:///{tmp_path / 'w.db'}", strategy="tpe", trials=6, check=no_col_order,
              warm=[good])
    assert other.calls[:3] == [fs.baselines()[0], good, *fs.baselines()[1:2]]


def test_trial_records_what_was_measured(storage):
    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="random", trials=3, check=no_col_order)
    t = measured(trials_of(storage))[0]
    for key in ("config", "source_hash", "compile_s", "resources", "error", "times_us", "device", "tuner_version",
                "backend", "replayed", "cached"):
        assert key in t.user_attrs, key
    assert Config.from_dict(t.user_attrs["config"]) == Config.from_params(t.params, CHAIN.stage_names)
    assert t.user_attrs["device"]["name"] == "fake GPU" and t.user_attrs["replayed"] is False


def test_rerun_with_same_budget_measures_nothing_and_a_larger_budget_continues(storage):
    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="random", trials=5, check=no_col_order)
    again = FakeBackend()
    out = run_study(CHAIN, SMALL, again, storage, strategy="random", trials=5, check=no_col_order)
    assert again.calls == [] and out.new_trials == 0 and out.summary.measured == 5
    more = FakeBackend()
    out = run_study(CHAIN, SMALL, more, storage, strategy="random", trials=8, check=no_col_order)
    assert out.summary.measured == 8 and len(more.calls) == 3


def test_resume_after_interrupt_loses_and_repeats_nothing(storage):
    first = FakeBackend(interrupt_at=4)
    out = run_study(CHAIN, SMALL, first, storage, strategy="random", seed=2, trials=8, check=no_col_order)
    assert out.interrupted and out.summary.measured == 3
    done_before = {Config.from_params(t.params, CHAIN.stage_names) for t in trials_of(storage) if t.state == TrialState.COMPLETE}
    assert len(done_before) == 3
    second = FakeBackend()
    out = run_study(CHAIN, SMALL, second, storage, strategy="random", seed=2, trials=8, check=no_col_order)
    assert out.summary.measured == 8
    assert second.calls[0] == first.calls[3]  # the trial cut short is measured first on resume
    complete = [Config.from_params(t.params, CHAIN.stage_names) for t in trials_of(storage) if t.state == TrialState.COMPLETE]
    assert len(complete) == len(set(complete)) == 8
    assert done_before <= set(complete)
    assert not set(first.calls[:3]) & set(second.calls)


def test_ctrl_c_while_a_result_is_written_takes_effect_once_it_is_stored(storage, monkeypatch):
    import signal

    import tuner.study.loop

    real_save = tuner.study.loop.MeasurementStore.save
    calls: list = []

    def save_interrupted_midway(self, device, label, config, m):
        calls.append(config)
        if len(calls) == 3:  # the third measured result: Ctrl-C between the cache write and the trial's
            signal.raise_signal(signal.SIGINT)
        return real_save(self, device, label, config, m)

    monkeypatch.setattr(tuner.study.loop.MeasurementStore, "save", save_interrupted_midway)
    backend = FakeBackend()
    out = run_study(CHAIN, SMALL, backend, storage, strategy="random", seed=4, trials=8, check=no_col_order)
    assert out.interrupted and out.summary.measured == 3 and len(backend.calls) == 3
    third = measured(trials_of(storage))[2]
    assert third.state == TrialState.COMPLETE and "times_us" in third.user_attrs  # written whole
    monkeypatch.setattr(tuner.study.loop.MeasurementStore, "save", real_save)
    again = FakeBackend()
    run_study(CHAIN, SMALL, again, storage, strategy="random", seed=4, trials=8, check=no_col_order)
    assert not set(backend.calls) & set(again.calls) and len(measured(trials_of(storage))) == 8


def test_cache_answers_a_second_study_without_the_backend(storage):
    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="random", seed=1, trials=5, check=no_col_order)
    optuna.delete_study(study_name=study_name(CHAIN, DEVICE), storage=storage)
    again = FakeBackend()
    out = run_study(CHAIN, SMALL, again, storage, strategy="random", seed=1, trials=5, check=no_col_order)
    assert again.calls == []
    assert out.cache_hits == 5
    assert all(t.user_attrs["cached"] for t in measured(trials_of(storage)))


def test_failures_are_stored_with_their_reason(storage):
    reasons = [r for r in FAIL_REASONS if r != "constraint"]
    backend = FakeBackend(fail=lambda i: reasons[i % len(reasons)] if i >= 1 else None)
    out = run_study(CHAIN, SMALL, backend, storage, strategy="random", trials=1 + len(reasons), check=no_col_order)
    failed = [t for t in measured(trials_of(storage)) if t.state == TrialState.FAIL]
    assert sorted(t.user_attrs["reason"] for t in failed) == sorted(reasons)
    assert all(t.user_attrs["message"].endswith("on purpose") for t in failed)
    assert all(out.summary.failures[r] == 1 for r in reasons)


def test_same_seed_gives_the_same_trials_on_replay(tmp_path, synthetic_file):
    def run(db: str):
        backend = ReplayBackend([synthetic_file])
        url = f"sqlite:///{tmp_path / db}"
        out = run_study(CHAIN, shipped_space(), backend, url, strategy="tpe", seed=3, trials=6, check=no_col_order)
        trials = trials_of(url, device=backend.device_info())
        return [(t.state, t.params, t.value) for t in trials], out.summary.best.params

    assert run("a.db") == run("b.db")


def test_replay_never_asks_for_an_unrecorded_config(storage, synthetic_file):
    backend = ReplayBackend([synthetic_file])
    asked = []
    original = backend.measure

    def spy(chain, cfg):
        asked.append(cfg)
        return original(chain, cfg)

    backend.measure = spy
    out = run_study(CHAIN, shipped_space(), backend, storage, strategy="random", seed=0, trials=10, check=None)
    recorded = set(backend.recorded(CHAIN))
    assert out.summary.measured == 10 and set(asked) <= recorded
    assert all(t.user_attrs["replayed"] for t in measured(trials_of(storage, device=backend.device_info())))


def test_grid_sampler_stops_when_every_recorded_config_was_tried(tmp_path):
    fs = SMALL.feasible(CHAIN, DEVICE)
    picked = list(fs.grid(0))[:3] + fs.baselines()[:1]
    m = Measurement(ok=True, median_us=10.0, times_us=[10.0])
    rec = tmp_path / "few.measurements.json"
    write_recording(rec, DEVICE, [Record(CHAIN.label, c, m) for c in picked], "test")
    out = run_study(CHAIN, SMALL, ReplayBackend([rec]), f"sqlite:///{tmp_path / 'g.db'}", strategy="grid",
                    trials=10, check=None)
    assert out.stop == "exhausted" and out.summary.measured == len(set(picked))


def test_study_always_ends_when_every_suggestion_is_refused(storage):
    refuse_all = lambda chain, cfg: "refused"  # noqa: E731
    out = run_study(CHAIN, SMALL, FakeBackend(check=None), storage, strategy="tpe", trials=1, check=refuse_all)
    assert out.stop == "exhausted" and out.summary.measured == 0 and out.refused == 0
    assert trials_of(storage) == []


def test_timeout_stops_the_study(storage):
    out = run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="random", trials=50, timeout=1e-9,
                    check=no_col_order)
    assert out.stop == "timeout" and out.summary.measured < 50


def test_empty_feasible_set_is_a_study_error(tmp_path):
    bad = Config.from_params({**SMALL.feasible(CHAIN, DEVICE).baselines()[0].params(CHAIN.stage_names), "gemm1.bm": 48}, CHAIN.stage_names)
    rec = tmp_path / "bad.measurements.json"
    write_recording(rec, DEVICE, [Record(CHAIN.label, bad, Measurement(ok=True, median_us=1.0))], "test")
    with pytest.raises(StudyError, match="no feasible config.*recorded"):
        run_study(CHAIN, SMALL, ReplayBackend([rec]), f"sqlite:///{tmp_path / 'e.db'}", trials=3, check=None)


def test_the_default_checker_is_tuner_checker(storage, monkeypatch):
    fake = types.ModuleType("tuner.checker.checks")
    fake.check = lambda chain, cfg: None if cfg.policy == "stream" else "only stream here"
    monkeypatch.setitem(sys.modules, "tuner.checker.checks", fake)
    backend = FakeBackend(check=fake.check)
    run_study(CHAIN, SMALL, backend, storage, strategy="random", trials=4)
    assert backend.calls and all(c.policy == "stream" for c in backend.calls)


def test_without_a_checker_a_measuring_backend_is_refused(storage, monkeypatch):
    monkeypatch.setitem(sys.modules, "tuner.checker.checks", None)
    with pytest.raises(StudyError, match="checker"):
        run_study(CHAIN, SMALL, FakeBackend(), storage, trials=2)


# -- study files


def test_shipped_study_files_load():
    for name in ("gpt3", "llama"):
        spec = default_study(name)
        assert spec.workload == name and spec.sizes["tokens"] == get_workload(name).sweep
        assert spec.space.exists() and spec.strategy == "staged" and spec.trials is None


def test_study_file_typo_names_file_and_nearest_key(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('workload = "gpt3"\ntrails = 5\n')
    with pytest.raises(StudyError) as err:
        load_study_file(p)
    assert str(p) in str(err.value) and "'trials'" in str(err.value)


@pytest.mark.parametrize("text, match", [
    ('workload = "gpt4"', "unknown workload"),
    ('workload = "gpt3"\nstrategy = "bayes"', "staged, tpe, random, grid"),
    ('workload = "gpt3"\nsizes = {tokns = [1]}', "did you mean 'tokens'"),
    ('workload = "gpt3"\nsizes = {tokens = [0]}', "an integer from 1 to 16384"),
    ('workload = "gpt3"\ntrials = 0', "positive integer"),
    ('workload = "gpt3"\ntimeout = -1', "positive number"),
])
def test_bad_study_files_say_what_is_accepted(tmp_path, text, match):
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(StudyError, match=match):
        load_study_file(p)


def test_study_sizes_expand_to_chains():
    spec = parse_study({"workload": "gpt3", "sizes": {"tokens": [1, 64], "hidden": 1024}}, "inline")
    assert [c.label for c in spec.chains()] == ["gpt3/tokens=1,hidden=1024,ffn=6144",
                                                "gpt3/tokens=64,hidden=1024,ffn=6144"]


def test_synthetic_recording_is_reproduced_by_its_script(tmp_path, synthetic_file):
    path = home() / "tests" / "data" / "make_synthetic.py"
    spec = importlib.util.spec_from_file_location("make_synthetic", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OUT = tmp_path / "again.json"
    mod.ROOT = home()
    mod.main()
    assert mod.OUT.read_bytes() == Path(synthetic_file).read_bytes()


def test_a_changed_space_is_refused_on_resume(storage):
    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="random", trials=2, check=no_col_order)
    wider = parse_space({"stage": {**SMALL.stage, "bk": [32, 64]}}, "wider.toml")
    with pytest.raises(StudyError, match="other choices for gemm1.bk"):
        run_study(CHAIN, wider, FakeBackend(space=wider), storage, strategy="random", trials=3, check=no_col_order)


def test_a_new_size_starts_from_the_best_configs_of_the_nearest_sizes_and_stage_shapes(storage):
    from tuner.storage.database import open_optuna_storage
    from tuner.storage.trials import stage_study_name, transfer_candidates, trial_config

    run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="staged", trials=60, check=no_col_order, final=False)
    rdb = open_optuna_storage(storage)

    def fastest(name, names, k=3):
        done = [t for t in optuna.load_study(study_name=name, storage=rdb).get_trials()
                if t.state == TrialState.COMPLETE and t.user_attrs.get("measured")]
        return [trial_config(t, names) for t in sorted(done, key=lambda t: t.value)[:k]]

    near = get_workload("gpt3").chain(tokens=128)
    chains, stages = transfer_candidates(rdb, near, DEVICE)
    assert chains == fastest(study_name(CHAIN, DEVICE), CHAIN.stage_names)
    assert stages == [[c.tiles[0] for c in fastest(stage_study_name(CHAIN, j, DEVICE), (st.name,))]
                      for j, st in enumerate(CHAIN.stages)]
    # Another model shape shares no chain study and no stage shape.
    other = get_workload("gpt3").chain(tokens=128, hidden=4096, ffn=2048)
    assert transfer_candidates(rdb, other, DEVICE) == ([], [[], []])
    # Nothing transfers from another device.
    assert transfer_candidates(rdb, near, DeviceInfo("other GPU")) == ([], [[], []])


def test_a_neighbours_transposed_pick_comes_refitted_to_this_sizes_rows_then_as_picked(storage):
    """One tile of 64 rows at 64 tokens is one of 72 at 72 tokens, the height bm_fit holds there
    (64 rows would leave a second tile of 8); the pick as it was follows it."""
    from tuner.storage.database import open_optuna_storage
    from tuner.storage.trials import transfer_candidates

    space = parse_space({"stage": {"bm": [64], "bm_fit": [1], "bn": [128], "bk": [64], "wm": [1], "wn": [2],
                                   "stages": [3], "split_k": [1], "mma": ["wgmma_tma_t"]}}, "fit.toml")
    run_study(CHAIN, space, FakeBackend(space=space), storage, strategy="staged", trials=10, check=no_col_order,
              final=False)
    near = get_workload("gpt3").chain(tokens=72)
    chains, stages = transfer_candidates(open_optuna_storage(storage), near, DEVICE)
    assert chains and [t.bm for t in chains[0].tiles] == [72, 72] and [t.bm for t in chains[1].tiles] == [64, 64]
    assert chains[1].tiles == tuple(replace(t, bm=64) for t in chains[0].tiles)
    assert [[t.bm for t in ts] for ts in stages] == [[72, 64], [72, 64]]
    assert space.feasible(near, DEVICE).contains(chains[0]) is None


def test_a_study_timed_as_graph_replays_is_kept_apart_from_one_timed_as_launches(storage):
    """Launch gaps make the two kinds of time incomparable: their studies, stage studies and
    transfers never mix, and the cache asks for the source that numbers its runs on the device."""
    from tuner.codegen.render import render
    from tuner.storage.database import open_optuna_storage
    from tuner.storage.trials import transfer_candidates
    from tuner.study.loop import _source_hasher

    launched = run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="staged", trials=20, check=no_col_order,
                         final=False)
    class Graphed(FakeBackend):
        graphs = True

        def source_hash(self, chain, cfg):
            return "g" + super().source_hash(chain, cfg)

        def measure(self, chain, cfg):  # other times, so that the two studies' best differ
            m = super().measure(chain, cfg)
            m.median_us = 200.0 - m.median_us
            return m

    graphed_backend = Graphed()
    graphed = run_study(CHAIN, SMALL, graphed_backend, storage, strategy="staged", trials=20, check=no_col_order,
                        final=False)
    assert len(graphed_backend.calls) == 20  # nothing answered from the other study or its cache
    assert graphed.name == study_name(CHAIN, DEVICE, graphs=True) == launched.name + "/graphs"
    rdb = open_optuna_storage(storage)
    names = {s.study_name: s.user_attrs.get("graphs") for s in optuna.get_all_study_summaries(rdb)}
    assert sum(n.endswith("/graphs") for n in names) == 3 and all(v == n.endswith("/graphs") for n, v in names.items())
    near = get_workload("gpt3").chain(tokens=128)
    assert transfer_candidates(rdb, near, DEVICE, graphs=True)[0] != transfer_candidates(rdb, near, DEVICE)[0]

    class Measuring(Backend):
        name, graphs = "measuring", True

        def device_info(self):
            return DEVICE

        def measure(self, chain, config):
            raise AssertionError

    cfg = next(iter(SMALL.feasible(CHAIN, DEVICE)))
    assert _source_hasher(Measuring())(CHAIN, cfg) == render(CHAIN, cfg, device_epoch=True).hash


def test_show_counts_the_stages_timed_alone_beside_the_chain_trials(storage):
    from tuner.shipping.export import collect

    out = run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="staged", trials=40, check=no_col_order)
    (row,) = collect(storage, "gpt3")  # the stage studies are no results of their own
    assert row["trials"] + row["stage_trials"] == out.measured == 40 and row["stage_trials"] == out.stage_trials > 0


def test_the_history_counts_stages_alone_and_stops_at_the_first_chain_within_reach(storage):
    from tuner.storage.trials import measured_history, trials_to_within

    out = run_study(CHAIN, SMALL, FakeBackend(), storage, strategy="staged", trials=30, check=no_col_order)
    history = measured_history(storage, CHAIN, DEVICE)
    assert len(history) == out.measured == 30 and history.count(None) >= out.stage_trials
    best = min(v for v in history if v is not None)
    assert history[trials_to_within(history, best, 1.0) - 1] == best
    assert trials_to_within(history, best / 2, 1.0) == 31


class RoundsBackend(FakeBackend):
    """Times final rounds too: after idle, each config as measured; under sustained load, the configs
    of an odd digest 30% slower (as a kernel that draws more power runs at a lower clock)."""

    features = frozenset({"source_hash", "time_rounds"})

    def __init__(self):
        super().__init__()
        self.rounds: list[tuple[int, float]] = []

    def time_rounds(self, chain, configs, rounds, heat_s=0.0):
        self.rounds.append((len(configs), heat_s))
        out = {}
        for c in configs:
            t = 50.0 + _digest(c) % 1000 / 10
            out[c] = [t * (1.3 if heat_s and _digest(c) % 2 else 1.0)] * rounds
        return out


def test_final_rounds_give_the_best_and_a_rerun_under_sustained_load_times_them_again(storage, capsys):
    """The finalists' medians give the study's best; a rerun with the same finalists adds nothing,
    one under sustained load times them again (GpuBackend.time_rounds' heat_s), and those rounds
    give the best from then on; under the same load again, nothing."""
    from tuner.study.outcome import describe

    idle = RoundsBackend()
    out = run_study(CHAIN, SMALL, idle, storage, strategy="random", trials=12, check=no_col_order)
    assert [h for _, h in idle.rounds] == [0.0] and out.summary.final_best is not None
    assert out.summary.final_sustained_s == 0.0 and "sustained" not in describe(out)
    finals = [t for t in trials_of(storage) if t.user_attrs.get("phase") == "finalists"]
    assert finals and all("sustained_s" not in t.user_attrs for t in finals)
    idle_best = out.summary.best.value

    again = RoundsBackend()
    run_study(CHAIN, SMALL, again, storage, strategy="random", trials=12, check=no_col_order)
    assert again.rounds == [] and again.calls == []

    hot, heard = RoundsBackend(), []
    out = run_study(CHAIN, SMALL, hot, storage, strategy="random", trials=12, check=no_col_order, sustained_s=2.0,
                    log=heard.append)
    assert hot.calls == [] and [h for _, h in hot.rounds] == [2.0]
    n = hot.rounds[0][0]  # the long wait is announced, with its length
    assert f"{CHAIN.label}: final rounds: 5 interleaved rounds of {n} finalists, each timing after 2 s of its " \
           f"own load (about {n * 5 * 2} s)" in heard
    assert any(line.startswith(f"{CHAIN.label}: final rounds done in ") for line in heard)
    assert out.summary.final_sustained_s == 2.0 and "under 2 s of sustained load" in describe(out)
    heated = [t for t in trials_of(storage) if t.user_attrs.get("sustained_s") == 2.0]
    assert len(heated) == hot.rounds[0][0] and out.summary.best.value == min(t.value for t in heated)
    assert out.summary.best.value >= idle_best
    from tuner.shipping.export import collect

    (row,) = collect(storage, "gpt3")
    assert row["best"]["median_us"] == out.summary.best.value and row["best"]["sustained_s"] == 2.0
    from tuner.cli import main

    main(["show", "gpt3", "--storage", storage])
    assert f"{out.summary.best.value:.2f} us (under 2 s of load)" in capsys.readouterr().out

    still = RoundsBackend()
    run_study(CHAIN, SMALL, still, storage, strategy="random", trials=12, check=no_col_order, sustained_s=2.0)
    assert still.rounds == []
