"""The bench's choices that need no GPU: how the final rounds interleave, which finalists the
rounds pick, and the table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.backends.base import DeviceInfo
from tuner.backends.gpu import GpuBackend
from tuner.bench import runs as bench
from tuner.chain.workloads import get_workload
from tuner.config import Config, StageTiles
from tuner.study.final import finalists

H200 = DeviceInfo("NVIDIA H200")
T = StageTiles(128, 192, 64, 2, 1, 4, 1, "wgmma_tma")


class FakeRunner:
    def __init__(self, name, log, flag=0, device_epoch=False):
        self.name, self.log, self.flag, self.device_epoch = name, log, flag, device_epoch
        self.captured = False

    def time(self, warmup, reps, hold=False):
        self.log.append(self.name + (" held" if hold else ""))
        return [10.0 + len(self.log)] * reps

    def capture(self):
        if not self.device_epoch:
            raise ValueError("a chain whose epoch is a kernel argument cannot be replayed from a graph")
        self.captured = True

    def time_graphs(self, warmup, reps, hold=False):
        assert self.captured
        self.log.append(f"{self.name} graph" + (" held" if hold else ""))
        return [9.0] * reps

    def error_flag(self):
        return self.flag


class FakeBackend:
    """What GpuBackend.time_rounds uses of its backend: load, verify and the repetition counts."""

    warmup, reps, IDLE_S, SCREEN_REPS = 1, 3, 0.0, 2
    ready = GpuBackend.ready  # the real one, over the fake load and verify

    def __init__(self, log, broken=(), broken_after_timing=(), graphs=False):
        self.log, self.broken, self.broken_after_timing, self.graphs = log, broken, broken_after_timing, graphs

    def load(self, chain, cfg, fault="none", device_epoch=False):
        from tuner.backends.base import Measurement

        return FakeRunner(cfg.policy, self.log, device_epoch=device_epoch), Measurement(ok=True)

    def verify(self, chain, runner):
        timed = runner.name in self.log
        if runner.name in self.broken or (timed and runner.name in self.broken_after_timing):
            return 0.0, "incorrect"
        return 0.001, None


CHAIN64 = get_workload("gpt3").chain(tokens=64)
STREAM = Config((T, T), "stream", "row", "block", "serial")
TILE = Config((T, T), "tile", "row", "block", "two_stream")


def test_final_rounds_interleave_every_contestant_and_leave_out_one_that_fails_verification():
    log: list[str] = []
    extra = {"cublas": lambda w, r: log.append("cublas") or [50.0] * r}
    out = GpuBackend.time_rounds(FakeBackend(log, broken=("tile",)), CHAIN64, [STREAM, TILE], 3, extra=extra)
    assert log == ["stream", "cublas"] * 3
    assert len(out[STREAM]) == 3 and len(out["cublas"]) == 3 and out[TILE] == "incorrect"


def test_final_rounds_leave_out_a_config_that_goes_wrong_while_it_is_timed():
    log: list[str] = []
    out = GpuBackend.time_rounds(FakeBackend(log, broken_after_timing=("tile",)), CHAIN64, [STREAM, TILE], 2)
    assert log == ["stream", "tile"] * 2  # it verified before, so it was timed
    assert len(out[STREAM]) == 2 and out[TILE] == "incorrect after the timed rounds"


def test_a_backend_timing_graphs_times_its_final_rounds_as_graph_replays():
    log: list[str] = []
    out = GpuBackend.time_rounds(FakeBackend(log, graphs=True), CHAIN64, [STREAM], 2)
    assert log == ["stream graph"] * 2 and out[STREAM] == [9.0, 9.0]


def test_a_backend_timing_graphs_times_the_search_as_graph_replays_too(monkeypatch):
    """The search's single timings and the final rounds time the same way: as launches, a chain
    of short kernels can wait on the host between kernels, which a captured chain never does."""
    import types

    from tuner.backends import gpu

    monkeypatch.setattr(gpu, "_cp", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(driver=types.SimpleNamespace(CUDADriverError=RuntimeError))))
    for graphs, timed in ((True, "stream graph held"), (False, "stream held")):
        log: list[str] = []
        fake = FakeBackend(log, graphs=graphs)
        fake.load = lambda chain, cfg, fault="none", device_epoch=False, fake=fake: (
            FakeRunner(cfg.policy, log, device_epoch=device_epoch), gpu.Measurement(ok=True))
        fake.verify = lambda chain, runner: (0.001, None)
        fake._refs = {}
        # Two input sets: the check that repeated runs still match reads one set's output only.
        fake_problem = types.SimpleNamespace(xs=[0, 1])
        FakeRunner.problem = fake_problem
        try:
            m = GpuBackend.measure(fake, CHAIN64, STREAM, screen=True)
        finally:
            del FakeRunner.problem
        assert m.ok and log == [timed] and m.graphs is graphs and len(m.times_us) == FakeBackend.SCREEN_REPS


def test_a_held_timing_queues_every_run_behind_one_hold_and_a_caller_timing_does_not(monkeypatch):
    """The search's trials are timed behind a hold (the GPU's time, not the host's launch rate);
    the final rounds time as a caller runs the chain, host included."""
    import types

    from tuner.backends import gpu

    calls: list = []

    class Event:
        def record(self, stream):
            calls.append("event")

    fake = types.SimpleNamespace(uint64=int, cuda=types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: 0.01))
    monkeypatch.setattr(gpu, "_cp", lambda: fake)
    monkeypatch.setattr(gpu, "_hold_kernel", lambda: lambda grid, block, args, stream: calls.append(("hold", args[0])))
    stream = types.SimpleNamespace(synchronize=lambda: None)
    assert gpu._time_runs(lambda i: calls.append("run"), stream, 2, 3, hold=True) == [10.0] * 3
    assert calls[0] == ("hold", gpu.hold_ns(5)) and calls.count("run") == 5 and ("hold", gpu.hold_ns(5)) not in calls[1:]
    calls.clear()
    gpu._time_runs(lambda i: calls.append("run"), stream, 2, 3)
    assert not [c for c in calls if isinstance(c, tuple)]
    assert gpu.hold_ns(10) == 10 * gpu.HOLD_NS_PER_RUN and gpu.hold_ns(10**6) == gpu.HOLD_MAX_NS


def test_the_three_fastest_of_each_kind_go_to_the_final_rounds_and_the_rounds_pick():
    cfg = {name: Config((T, T), pol, order, "block", launch)
           for name, pol, order, launch in (("s1", "stream", "row", "serial"), ("s2", "stream", "col", "serial"),
                                            ("p1", "stream", "row", "pdl"),
                                            ("t1", "tile", "row", "two_stream"), ("t2", "tile", "col", "two_stream"),
                                            ("t3", "row", "row", "two_stream"), ("t4", "row", "col", "two_stream"))}
    passed = [(130.0, cfg["s2"]), (129.0, cfg["s1"]), (131.0, cfg["t1"]), (129.5, cfg["t2"]), (140.0, cfg["t4"]),
              (130.5, cfg["t3"]), (128.0, cfg["p1"])]
    # Stream order, stream order with programmatic dependent launches, tile-level sync: each its own kind.
    assert finalists(passed) == [cfg["s1"], cfg["s2"], cfg["p1"], cfg["t2"], cfg["t3"], cfg["t1"]]
    fin = bench.named_finalists(passed)
    assert fin == {"stream": cfg["s1"], "stream#2": cfg["s2"], "pdl": cfg["p1"], "tile": cfg["t2"],
                   "tile#2": cfg["t3"], "tile#3": cfg["t1"]}
    # The rounds, at one clock for all, decide: stream#2 wins its kind; tile#2 was left out.
    final = {"stream": 128.6, "stream#2": 128.1, "pdl": 127.7, "tile": 129.9, "tile#3": 129.2, "cupy cublas": 125.9}
    assert bench.fastest_per_kind(fin, final) == {"stream": "stream#2", "pdl": "pdl", "tile": "tile#3"}


def test_the_table_gives_ratios_to_every_baseline_and_the_floor():
    row = {"tokens": 256, "floor_us": 100.0, "stream_us": 130.0, "tile_us": 125.0, "tuned_us": 125.0,
           "baselines_us": {"cupy cublas": 137.5}}
    text = bench.table({"rows": [row]})
    head, line = text.splitlines()
    cells = dict(zip(head.split("  "), line.split("  ")))
    assert cells["tuned/floor"] == "1.250" and cells["x vs cupy cublas"] == "1.100" and cells["tile vs stream"] == "1.040"
    assert cells["tuned HBM"] == "-"  # a summary from before the bytes' floor was kept


def test_the_table_gives_the_tuned_chains_share_of_hbm_bandwidth():
    row = {"tokens": 1, "floor_us": 100.0, "bytes_us": 80.0, "stream_us": 130.0, "tile_us": 125.0, "tuned_us": 100.0,
           "baselines_us": {}}
    head, line = bench.table({"rows": [row]}).splitlines()
    assert dict(zip(head.split("  "), line.split("  ")))["tuned HBM"] == "80%"


def test_a_bench_summary_hands_its_picks_to_the_study(tmp_path):
    tile = Config((T, T), "row", "row", "block", "two_stream")
    stream = Config((T, T), "stream", "row", "block", "serial")
    path = tmp_path / "gpt3.bench.json"
    path.write_text(json.dumps({"rows": [{"label": "gpt3/tokens=256,hidden=12288,ffn=6144",
                                          "tile_config": tile.to_dict(), "stream_config": stream.to_dict()},
                                         {"label": "other", "tile_config": None}]}))
    assert bench.picked_configs(path, "gpt3/tokens=256,hidden=12288,ffn=6144") == [tile, stream]
    assert bench.picked_configs(path, "other") == [] and bench.picked_configs(tmp_path / "none.json", "x") == []


def test_the_whole_network_figure_weights_each_layer_by_its_multiplicity():
    from tuner.bench.runs import network_figures, network_table
    from tuner.chain.workloads import get_workload

    wl = get_workload("resnet38")
    rows = []
    for i, (layer, _) in enumerate(wl.network):
        size = wl.chain(batch=8, **layer).size_dict
        rows.append({"size": size, "tuned_us": 10.0 * (i + 1), "stream_us": 11.0 * (i + 1), "floor_us": 1.0,
                     "baselines_us": {"torch graph": 20.0 * (i + 1), "cupy cublas": 30.0}})
    rows.append({**rows[0], "size": wl.chain(batch=4, **wl.network[0][0]).size_dict})  # batch 4 lacks layers
    (fig,) = network_figures({"rows": rows}, "resnet38")
    # multiplicities 3, 4, 6, 3
    assert fig["batch"] == 8
    assert fig["us"] == {"tuned": 10 * (3 + 8 + 18 + 12), "stream": 11 * 41, "floor": 16.0,
                         "torch graph": 20 * 41, "cupy cublas": 30 * 16}
    assert fig["formula"] == "3 x 56x56x64 + 4 x 28x28x128 + 6 x 14x14x256 + 3 x 7x7x512"
    assert "best PyTorch / tuned 2.00" in network_table([fig], "batch")


def test_network_sizes_cover_every_layer_at_every_batch():
    from tuner.chain.workloads import get_workload

    sizes = get_workload("vgg19").network_sizes((1, 4))
    layers = [{"height": 56, "width": 56, "channels": 128, "depth": 2},
              {"height": 28, "width": 28, "channels": 256, "depth": 4},
              {"height": 14, "width": 14, "channels": 512, "depth": 4}]
    assert sizes == [{"batch": b, **layer} for b in (1, 4) for layer in layers]


def test_a_baseline_over_several_input_sets_takes_them_in_turn():
    """Our chains rotate over input sets so that none is read from L2; the baselines rotate over
    the same sets, call after call, warm-up included."""
    from tuner.bench.baselines import rotating

    seen: list[int] = []
    call = rotating([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        call()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_a_recorded_config_is_picked_by_label_text_and_rank():
    """The profiling scripts pick a recorded config by text of its label and its rank by median."""
    from tuner.backends.replay import ReplayError, read_recording

    rec = read_recording(Path(__file__).parents[1] / "studies" / "llama-attn-decode.measurements.json")
    first, second = rec.pick("llama-attn/tokens=1,"), rec.pick("llama-attn/tokens=1,", 1)
    assert first.label == second.label and first.measurement.median_us <= second.measurement.median_us
    with pytest.raises(ReplayError, match="matches 8 labels"):
        rec.pick("llama-attn")
    with pytest.raises(ReplayError, match="rank 9999"):
        rec.pick("llama-attn/tokens=1,", 9999)


def test_an_ablation_times_each_kind_s_leader_with_every_other_allowed_value_of_a_global_choice():
    # The shipped spaces leave the prefetch out; an ablation times it all the same.
    from tuner.search.cases import coverage

    decode = get_workload("llama-attn").chain(tokens=1)
    cfgs = coverage(decode)
    lead = {"stream": next(c for c in cfgs if c.launch == "serial" and c.prefetch == "none"),
            "tile": next(c for c in cfgs if c.launch == "fused" and c.prefetch == "none")}
    got = bench.ablations({**lead, "tile#2": cfgs[-1]}, ["prefetch"], decode, H200)
    assert got == {f"{k} prefetch=l2": replace(c, prefetch="l2") for k, c in lead.items()}
    # The GPT-3 MLP's second GEMM does not fit half of L2; a tile policy runs in no serial launch,
    # and fused needs ticket dispatch: only what the constraints allow is timed.
    assert bench.ablations({"stream": STREAM}, ["prefetch"], CHAIN64, H200) == {}
    assert bench.ablations({"tile": TILE}, ["launch"], CHAIN64, H200) == {"tile launch=pdl": replace(TILE, launch="pdl")}
    assert bench.ablations({"tile": TILE}, ["dispatch"], CHAIN64, H200) == {
        "tile dispatch=ticket": replace(TILE, dispatch="ticket")}


def test_each_stage_alone_is_timed_again_with_its_fastest_tilings_against_the_library(tmp_path, monkeypatch):
    """A study replayed from the GPT-3 recording holds the stage pass; the stage rounds time its
    fastest tilings of each stage with that stage's baselines."""
    from tuner.backends.replay import ReplayBackend
    from tuner.bench import baselines
    from tuner.paths import home
    from tuner.search.space import load_space
    from tuner.study.loop import run_study

    chain = get_workload("gpt3").chain(tokens=256)
    rec = home() / "studies" / "gpt3-graphs-256.measurements.json"
    replay = ReplayBackend([rec])
    storage = f"sqlite:///{tmp_path}/s.db"
    run_study(chain, load_space(home() / "search_spaces" / "gpt3.toml"), replay, storage, trials=40, final=False,
              log=lambda *_: None)

    class Gpu:
        timed: list = []
        heat: list = []

        def problem(self, ch):
            return type("P", (), {"xs": [0], "ws": [[0]]})()

        def time_rounds(self, ch, cfgs, rounds, extra, graphs, heat_s):
            self.timed.append((ch.label, cfgs, sorted(extra)))
            self.heat.append(heat_s)
            return {**{c: [10.0 + i] * rounds for i, c in enumerate(cfgs)}, **{k: [11.0] * rounds for k in extra}}

    import optuna

    for j in range(2):  # equal times must not make the configs themselves compared
        name = f"{chain.label}/gemm{j + 1}/{replay.device_info().name}"
        study = optuna.load_study(study_name=name, storage=storage)
        best, other = sorted((t for t in study.trials if t.value is not None), key=lambda t: t.value)[:2]
        study.add_trial(optuna.trial.create_trial(params=other.params, distributions=other.distributions,
                                                  value=best.value, user_attrs=other.user_attrs))
    monkeypatch.setattr(baselines, "baseline_timers", lambda ch, sets, graphs, compiled=False: {"cupy cublas": None})
    gpu = Gpu()
    rows = bench.stage_rounds(gpu, chain, storage, replay.device_info(), False, log=lambda *_: None, sustained_s=2.0)
    assert [r["stage"] for r in rows] == ["gemm1", "gemm2"] and [t[0] for t in gpu.timed] == [
        chain.alone(0).label, chain.alone(1).label]
    assert gpu.heat == [2.0, 2.0]  # bench --sustained reaches each stage's rounds
    for r, (_, cfgs, names) in zip(rows, gpu.timed):
        assert 1 <= len(cfgs) <= bench.STAGE_FINALISTS and all(len(c.tiles) == 1 for c in cfgs)
        assert r["ours_us"] == 10.0 and r["config"] == cfgs[0].short() and r["baselines_us"] == {"cupy cublas": 11.0}
    text = bench.stages_table({"rows": [{"label": chain.label, "stages_alone": rows}]})
    assert "gpt3.gemm1  256x6144x12288  gelu" in text.splitlines()[1] and "(cupy cublas)  1.10" in text.splitlines()[1]


def test_the_library_profiling_script_refuses_a_label_no_workload_has_in_one_line(run_benchmark):
    done = run_benchmark("profile_library.py", "gpt3.gemm9/tokens=256")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["'gpt3.gemm9/tokens=256': gpt3 has no stage 'gemm9'; stages: gemm1, gemm2"]


def test_the_template_ab_script_refuses_a_variant_without_kernel_templates_in_one_line(tmp_path, run_benchmark):
    done = run_benchmark("template_ab.py", tmp_path, "--config", "studies/recheck/gpt3-256.measurements.json",
                         "gpt3.gemm2/tokens=256")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"{tmp_path}: no kernel_templates/ folder in it (a variant holds a copy of kernel_templates/)"]


def test_the_template_ab_script_refuses_timing_only_without_a_variant_in_one_line(run_benchmark):
    done = run_benchmark("template_ab.py", "--timing-only", "--config", "studies/recheck/gpt3-256.measurements.json",
                         "gpt3.gemm2/tokens=256")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "--timing-only applies to variant folders; give one (a folder holding kernel_templates/)"]


def test_template_ab_also_changes_global_fields_and_drops_changes_the_space_or_checker_refuse(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from template_ab import tile_variant

    chain, dev = get_workload("gpt3").chain(tokens=2048), DeviceInfo("H200")
    t = StageTiles(128, 256, 64, 2, 1, 3, 1, "wgmma_tma", persist=1)
    cfg = Config((t, t), "stream", "col", "block", "pdl")
    tiled = tile_variant(chain, cfg, "policy=tile,launch=two_stream,order=row", dev)
    assert tiled == Config((t, t), "tile", "row", "block", "two_stream")
    assert tile_variant(chain, cfg, "persist=0,launch=serial", dev) == replace(
        cfg, tiles=(replace(t, persist=0),) * 2, launch="serial")
    assert tile_variant(chain, cfg, "launch=two_stream", dev) is None  # no policy: nothing orders the stages
    assert tile_variant(chain, cfg, "policy=tile,launch=fused,dispatch=ticket", dev) is None  # persistent blocks
    assert tile_variant(chain, cfg, "persist=1", dev) is None  # nothing changes
    notes: list[str] = []
    assert tile_variant(chain, cfg, "launch=two_stream", dev, notes) is None
    assert len(notes) == 1 and notes[0].startswith("the chain's constraints refuse") and "launch_mode" in notes[0]


def test_template_ab_says_why_a_stage_keeps_its_tiling(monkeypatch):
    """A change the stage's constraints refuse is named with the constraint, not skipped in silence."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from template_ab import tile_variant

    chain, dev = get_workload("gpt3").chain(tokens=2048), DeviceInfo("H200")
    t = StageTiles(256, 128, 64, 1, 2, 3, 1, "wgmma_tma_t", persist=1)
    notes: list[str] = []
    assert tile_variant(chain, Config((t, t), "stream", "col", "block", "serial"), "wn=3,bn=192", dev, notes) is None
    assert notes[:2] == [f"{st.name} keeps 256x128x64 T1x2 s3 p: 256x192x64 T1x3 s3 p breaks accumulators (128 "
                         "accumulator registers plus 56 others exceed the 152 per thread that 512 threads leave)"
                         for st in chain.stages]
    assert notes[2:] == ["nothing changes"]


@pytest.mark.parametrize("script", ["template_ab.py", "sass_stats.py"])
def test_the_variant_scripts_refuse_a_config_the_recording_lacks_in_one_line(script, tmp_path, run_benchmark):
    (tmp_path / "kernel_templates").mkdir()
    done = run_benchmark(script, tmp_path, "--config", "studies/recheck/gpt3-256.measurements.json", "gpt3.gemm9/tokens=256")
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("--config studies/recheck/gpt3-256.measurements.json gpt3.gemm9/tokens=256: ")


def test_the_sustained_clock_script_alternates_ours_and_the_library_and_summarizes_the_loaded_samples(tmp_path):
    """benchmarks/sustained_clock.sh, run with a scripted nvidia-smi (an idle sample, then loaded
    ones) and stand-ins for the two profiling scripts: four runs, each summarized from the samples
    drawing at least half the run's peak power."""
    root = Path(__file__).resolve().parents[1]
    bench_dir = tmp_path / "benchmarks"
    bench_dir.mkdir()
    shutil.copy(root / "benchmarks" / "sustained_clock.sh", bench_dir)
    for name in ("profile_config.py", "profile_library.py"):
        (bench_dir / name).write_text(f"import sys, time\ntime.sleep(0.4)\nprint('{name}', *sys.argv[1:])\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\necho '345, 70.00, 0x1'\n"
                   "while true; do echo '1400, 650.00, 0x0'; sleep 0.02; done\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IDLE_S": "0"}
    done = subprocess.run(["bash", str(bench_dir / "sustained_clock.sh"), out, "rec.json", "gpt3.gemm2/tokens=2048",
                           "1", "gpt3.gemm2/tokens=2048,hidden=12288,ffn=6144", "torch graph", "10"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["ours", "library", "ours", "library"]
    assert all("1400 MHz" in ln and "650 W (peak 650 W)" in ln for ln in lines), lines
    assert (out / "run_1_ours.txt").read_text().split() == [
        "profile_config.py", "rec.json", "--label", "gpt3.gemm2/tokens=2048", "--rank", "1", "--runs", "10"]
    assert "--variant torch graph --runs 10" in (out / "run_2_library.txt").read_text()


@pytest.mark.parametrize("script, arguments", [("sustained_clock.sh", "OUTDIR RECORDING LABEL RANK LIBRARY_LABEL"),
                                               ("ncu_gemm.sh", "OUTDIR RECORDING LABEL RANKS LIBRARY_LABEL")])
def test_the_profiling_scripts_say_how_to_call_them_when_arguments_are_missing(script, arguments):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", str(root / "benchmarks" / script), "out"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("usage: ") and arguments in done.stderr


def test_the_ncu_script_profiles_each_rank_and_the_library_at_base_clocks_and_tabulates_medians(tmp_path):
    """benchmarks/ncu_gemm.sh with a scripted ncu: one profile per recorded rank and one of the
    library (its kernels by their own regex), at locked base clocks in base units, and a table of
    the medians over launches (durations in µs, sectors in millions)."""
    root = Path(__file__).resolve().parents[1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    # three launches; the library's kernel takes 2 µs longer and reads fewer sectors
    ncu.write_text(r"""#!/usr/bin/env bash
echo "$@" >> "$NCU_CALLS"
echo '==PROF== Connected to process'
case "$*" in *regex:stage*) k=stage0_kernel; d=0; r=77000000 ;; *) k='nvjet_sm90_hsh_256x128(int)'; d=2000; r=64000000 ;; esac
echo '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
for i in 0 1 2; do
  echo "\"$i\",\"$k\",\"gpu__time_duration.sum\",\"ns\",\"$((440000 + d + i * 1000))\""
  echo "\"$i\",\"$k\",\"sm__cycles_elapsed.max\",\"cycle\",\"62$i,000\""
  echo "\"$i\",\"$k\",\"lts__t_sectors_srcunit_tex_op_read.sum\",\"sector\",\"$((r + i))\""
  echo "\"$i\",\"$k\",\"l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum\",\"byte\",\"3,600,000,000\""
  echo "\"$i\",\"$k\",\"lrc__average_xbar2gpc_sectors_op_read.ratio\",\"\",\"1.53\""
done
""")
    ncu.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NCU_CALLS": str(calls)}
    done = subprocess.run(["bash", str(root / "benchmarks" / "ncu_gemm.sh"), tmp_path / "out", "rec.json",
                           "gpt3.gemm2/tokens=2048", "1,6+cm=2+stages=4", "gpt3.gemm2/tokens=2048,hidden=12288,ffn=6144",
                           "torch graph", "3"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    made = calls.read_text().splitlines()
    assert len(made) == 3 and all("--clock-control base" in c and "--print-units base" in c for c in made)
    assert "--rank 1 " in made[0] and "--also" not in made[0] and "regex:nvjet|gemm|xmma" in made[2]
    assert "--rank 6 --also cm=2,stages=4 " in made[1]  # a rank with fields changed, as profile_config.py takes them
    assert all("--launch-count 3" in c for c in made)
    # ncu is asked for what the table reads, the TMA receive counters among them
    assert all("--metrics gpu__time_duration.sum,sm__cycles_elapsed.max," in c and
               "tma_ld_dest_multicast.sum " in c for c in made)
    rows = [ln for ln in done.stdout.splitlines() if ln.startswith("| rank") or ln.startswith("| library")]
    assert [r.split(" | ")[0] for r in rows] == ["| rank1", "| rank6_cm_2_stages_4", "| library"]
    assert rows[0].split(" | ")[1:5] == ["`stage0_kernel`", "3", "441.0", "621,000"]
    assert rows[2].split(" | ")[1:4] == ["`nvjet_sm90_hsh_256x128`", "3", "443.0"]
    assert rows[0].split(" | ")[7] == "77.0" and rows[2].split(" | ")[7] == "64.0"  # SM reads, millions
    assert rows[0].split(" | ")[11] == "1.53"  # sectors sent to the SMs per sector read from L2
    assert rows[0].split(" | ")[12] == "3,600"  # what the SMs received from TMA loads, MB
    assert rows[0].endswith(" - |")  # a metric ncu did not give


def test_sustained_final_rounds_time_each_source_right_after_its_own_long_run_without_idle(monkeypatch):
    """time_rounds(heat_s=...): a probe of each source sets how many of its runs fill heat_s, and
    each timing queues that many of its own runs first; nothing sleeps between sources."""
    import time as time_module

    slept = []
    monkeypatch.setattr(time_module, "sleep", lambda s: slept.append(s))
    calls = []
    extra = {"ours": lambda w, r: calls.append(("ours", w, r)) or [100.0] * r,
             "torch graph": lambda w, r: calls.append(("torch graph", w, r)) or [400.0] * r}
    backend = FakeBackend([])
    backend.IDLE_S = 0.3
    out = GpuBackend.time_rounds(backend, CHAIN64, [], 2, extra=extra, heat_s=2.0)
    assert calls == [("ours", 1, 5), ("torch graph", 1, 5),  # the probes
                     ("ours", 20000, 3), ("torch graph", 5000, 3), ("ours", 20000, 3), ("torch graph", 5000, 3)]
    assert out == {"ours": [100.0, 100.0], "torch graph": [400.0, 400.0]} and slept == []


def test_template_ab_refuses_a_sustained_time_that_is_not_positive_in_one_line(run_benchmark):
    done = run_benchmark("template_ab.py", "--sustained", "0", "--config", "studies/recheck/gpt3-256.measurements.json",
                         "gpt3.gemm2/tokens=256")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: argument --sustained: expected a positive number of seconds, got '0'")


def test_the_layer_baseline_takes_the_built_in_models_shards_and_moves_at_least_their_weights(monkeypatch):
    """benchmarks/layer_baseline.py's layers are the built-in MLP and attention workloads' shapes;
    its floor counts every weight once, the KV cache it reads and the rows it writes."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from layer_baseline import SHAPES

    llama, gpt3 = SHAPES["llama"], SHAPES["gpt3"]
    mlp, attn = get_workload("llama").chain(tokens=1), get_workload("llama-attn").chain(tokens=1)
    weights = sum(st.weight_bytes for st in mlp.stages) + sum(st.weight_bytes for st in attn.stages
                                                                if st.kind == "gemm")
    assert llama.weight_bytes() == weights + 2 * 2 * llama.hidden  # and the two norms' weights
    assert (gpt3.heads, gpt3.kv_heads, gpt3.llama) == (12, 12, False)
    kv_row = 2 * llama.kv_heads * llama.head_dim * 2
    assert llama.floor_bytes(4, 1024) - llama.floor_bytes(4, 0) == 1024 * kv_row
