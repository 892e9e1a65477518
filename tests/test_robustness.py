"""A study survives crashes, hangs, wrong answers, kill -9 and bad input.

The faults come from ``chaos_backend.ChaosBackend`` (synthetic times, CPU only) run in
the same worker process isolation as the GPU backend, and from killing a real
``python -m tuner study`` run on the replay backend.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import optuna
import pytest
from chaos_backend import DEVICE_NAME, ILLEGAL_ADDRESS, ChaosBackend
from optuna.trial import TrialState
from test_cli import assert_one_line_error

import tuner.backends
import tuner.backends.worker
import tuner.codegen.compile
from tuner.backends.base import DeviceInfo
from tuner.backends.worker import WorkerBackend
from tuner.chain.workloads import get_workload
from tuner.checker.checks import check
from tuner.cli import main
from tuner.search.space import parse_space
from tuner.storage.trials import study_name, summarize
from tuner.study.loop import run_study

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "data" / "synthetic_measurements.json"
CHAIN = get_workload("gpt3").chain(tokens=64)
DEVICE = DeviceInfo(name=DEVICE_NAME, toolkit="none")
STAGE = {"bm": [16, 32, 64], "bn": [64, 128], "bk": [64], "wm": [1, 2], "wn": [1, 2], "stages": [3], "split_k": [1, 2]}
SPACE = parse_space({"stage": STAGE}, "chaos-space.toml")
DEADLINE_S = 2.0  # a chaos measurement answers in milliseconds; only a hang comes near this

# n-th measured trial -> what the chaos backend does on it; the others measure normally.
SCRIPT = {3: "exit", 5: "hang", 7: "incorrect", 9: "sticky", 11: "sticky_reply", 13: "abort"}
REASON = {"exit": "launch", "abort": "launch", "sticky": "launch", "sticky_reply": "launch", "hang": "timeout",
          "incorrect": "incorrect"}
TRIALS = 14


@pytest.fixture
def url(fast_dir, request) -> str:
    folder = fast_dir / request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    folder.mkdir()
    return f"sqlite:///{folder / 'tuner.db'}"


def measured_trials(url: str, device: str = DEVICE_NAME) -> list:
    study = optuna.load_study(study_name=study_name(CHAIN, device), storage=url)
    return [t for t in study.get_trials() if t.user_attrs.get("measured")]


def pid(trial) -> int:
    """The worker process that measured a trial (the chaos backend records it)."""
    return trial.user_attrs["resources"]["pid"]


# ---------------------------------------------------------------------------
# Crashes, hangs and wrong answers in the middle of a study


@pytest.fixture(scope="module")
def chaos_study(fast_dir):
    """One study whose worker crashes, hangs, raises and answers wrong on the trials SCRIPT names."""
    folder = fast_dir / "chaos"
    folder.mkdir()
    url = f"sqlite:///{folder / 'tuner.db'}"
    backend = WorkerBackend("chaos_backend:ChaosBackend",
                            kwargs={"script": SCRIPT, "counter": str(folder / "calls")}, deadline_s=DEADLINE_S)
    try:
        outcome = run_study(CHAIN, SPACE, backend, url, strategy="random", seed=0, trials=TRIALS)
    finally:
        backend.close()
    return types.SimpleNamespace(url=url, outcome=outcome, restarts=backend.restarts,
                                 trials=sorted(measured_trials(url), key=lambda t: t.number))


def test_each_fault_fails_its_own_trial_and_only_that_one(chaos_study):
    got = [t.user_attrs.get("reason") if t.state == TrialState.FAIL else "ok" for t in chaos_study.trials]
    want = [REASON[SCRIPT[n]] if n in SCRIPT else "ok" for n in range(1, TRIALS + 1)]
    assert got == want
    messages = {n: chaos_study.trials[n - 1].user_attrs["message"] for n in SCRIPT}
    assert "exit code 1" in messages[3]
    assert f"within {DEADLINE_S:.0f}s" in messages[5]
    assert messages[9].startswith("CUDADriverError: " + ILLEGAL_ADDRESS)
    assert messages[11].startswith(ILLEGAL_ADDRESS)
    assert "exit code -6" in messages[13]  # SIGABRT


def test_the_study_completes_its_budget_despite_the_faults(chaos_study):
    out = chaos_study.outcome
    assert out.stop == "budget" and out.summary.measured == TRIALS and out.new_trials == TRIALS
    measured_failures = {k: v for k, v in out.summary.failures.items() if k != "constraint" and v}
    assert measured_failures == {"launch": 4, "timeout": 1, "incorrect": 1}
    assert sum(t.state == TrialState.COMPLETE for t in chaos_study.trials) == TRIALS - len(SCRIPT)


def test_a_fresh_worker_takes_over_after_a_crash_or_hang_but_not_after_a_wrong_answer(chaos_study):
    trials = chaos_study.trials
    for n, behaviour in SCRIPT.items():
        before, after = pid(trials[n - 2]), pid(trials[n])  # the trials either side of the fault (1-based n)
        if behaviour == "incorrect":
            assert after == before, "a wrong answer does not poison the worker"
        else:
            assert after != before, f"{behaviour}: the next trial must run in a new worker"
    assert chaos_study.restarts == len(SCRIPT) - 1


def test_show_reports_failures_by_reason(chaos_study, capsys):
    assert main(["show", "gpt3", "--storage", chaos_study.url]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if DEVICE_NAME in line]
    assert len(rows) == 1 and "launch 4, timeout 1, incorrect 1" in rows[0]
    assert main(["show", "gpt3", "--storage", chaos_study.url, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["trials"] == TRIALS
    assert {k: v for k, v in row["failures"].items() if k != "constraint"} == {
        "compile": 0, "resources": 0, "launch": 4, "timeout": 1, "incorrect": 1}
    assert row["failures"]["constraint"] == row["refused"]  # refused by the checker, never measured


# ---------------------------------------------------------------------------
# Planted faults


def test_a_planted_fault_reaches_the_trial_it_names(url):
    backend = WorkerBackend("chaos_backend:ChaosBackend", deadline_s=DEADLINE_S,
                            plant={2: "illegal_address", 4: "missing_post"})
    try:
        out = run_study(CHAIN, SPACE, backend, url, strategy="random", seed=1, trials=5)
    finally:
        backend.close()
    trials = sorted(measured_trials(url), key=lambda t: t.number)
    assert out.summary.measured == 5
    assert [t.user_attrs.get("reason") for t in trials] == [None, "launch", None, "timeout", None]
    assert ILLEGAL_ADDRESS in trials[1].user_attrs["message"]
    assert "bounded spin" in trials[3].user_attrs["message"]


def test_the_trial_right_after_a_sticky_error_gets_a_fresh_worker():
    # The poisoned worker exits by itself after answering; the next trial must not be sent to it.
    cfg = SPACE.feasible(CHAIN, DEVICE).baselines()[0]
    backend = WorkerBackend("chaos_backend:ChaosBackend", deadline_s=DEADLINE_S, plant={1: "illegal_address"})
    try:
        first = backend.measure(CHAIN, cfg)
        second = backend.measure(CHAIN, cfg)
    finally:
        backend.close()
    assert first.reason == "launch" and ILLEGAL_ADDRESS in first.message
    assert second.ok, second.message
    assert backend.restarts == 1


def test_the_plant_fault_option_of_the_study_command_reaches_its_trial(url, tmp_path, monkeypatch, capsys):
    class ChaosWorker(WorkerBackend):
        """What --backend gpu builds, with the chaos backend in place of the GPU one."""

        def __init__(self, factory: str, **kwargs):
            kwargs["deadline_s"] = DEADLINE_S
            super().__init__("chaos_backend:ChaosBackend", **kwargs)

    monkeypatch.setattr(tuner.backends, "gpu_visible", lambda: True)
    monkeypatch.setitem(sys.modules, "tuner.backends.gpu", types.SimpleNamespace(GpuBackend=ChaosBackend))
    monkeypatch.setattr(tuner.backends.worker, "WorkerBackend", ChaosWorker)
    space = tmp_path / "space.toml"
    space.write_text("[stage]\n" + "".join(f"{k} = {v}\n" for k, v in STAGE.items()))
    rc = main(["study", "gpt3", "--tokens", "64", "--trials", "4", "--strategy", "random", "--backend", "gpu",
               "--space", str(space), "--plant-fault", "3:illegal_address", "--storage", url])
    assert rc == 0, capsys.readouterr().err
    trials = sorted(measured_trials(url), key=lambda t: t.number)
    assert [t.user_attrs.get("reason") for t in trials] == [None, None, "launch", None]
    assert ILLEGAL_ADDRESS in trials[2].user_attrs["message"]


# ---------------------------------------------------------------------------
# kill -9 and resuming


def _states(db: Path) -> Counter:
    """Trial states in the database, read without taking part in its writes."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return Counter(dict(conn.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall()))
    except sqlite3.OperationalError:  # not created yet, or busy
        return Counter()


def test_kill_9_mid_study_loses_nothing_and_measures_nothing_twice(fast_dir):
    db = fast_dir / "killed" / "s.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    cmd = [sys.executable, "-m", "tuner", "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
           "--tokens", "64", "--trials", "40", "--seed", "3", "--strategy", "random", "--storage", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        give_up = time.monotonic() + 120
        # Kill with some trials complete and, most likely, one being measured.
        while not _states(db)["COMPLETE"] >= 5:
            assert proc.poll() is None, f"the study ended before it could be killed: {proc.stderr.read()}"
            assert time.monotonic() < give_up, "no trial completed within 120 s"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    name = study_name(CHAIN, "Synthetic H200 model (not a device)")
    left = optuna.load_study(study_name=name, storage=url).get_trials()
    done = {t.number: (t.params, t.value) for t in left if t.state == TrialState.COMPLETE}
    assert not [t for t in left if t.state == TrialState.RUNNING]  # a trial is written only when decided
    assert 5 <= len(done) < 40

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr

    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    by_number = {t.number: t for t in trials}
    assert all(by_number[n].state == TrialState.COMPLETE and (by_number[n].params, by_number[n].value) == pv
               for n, pv in done.items()), "a trial completed before the kill changed or vanished"
    measured = [t for t in trials if t.user_attrs.get("measured")]
    per_config = Counter(json.dumps(t.params, sort_keys=True) for t in measured)
    assert len(measured) == summarize(trials).measured == 40
    assert per_config.most_common(1)[0][1] == 1, "a config was measured twice"
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]


def test_a_trial_an_older_version_left_running_is_not_counted_and_its_config_measured_once(url):
    backend = ChaosBackend()
    run_study(CHAIN, SPACE, backend, url, strategy="random", seed=2, trials=3)
    study = optuna.load_study(study_name=study_name(CHAIN, DEVICE), storage=url)
    seen = {json.dumps(t.params, sort_keys=True) for t in study.get_trials()}
    fs = SPACE.feasible(CHAIN, DEVICE)
    pending = next(c for c in fs.grid(7) if json.dumps(c.params(CHAIN.stage_names), sort_keys=True) not in seen
                   and check(CHAIN, c) is None)
    # What a process of an older version, killed mid-trial, left: asked, params stored, part of its
    # outcome stored, never told. (This version writes a trial only once its outcome is known.)
    study.enqueue_trial(pending.params(CHAIN.stage_names))
    cut = study.ask()
    for param, choices in fs.domains().items():
        cut.suggest_categorical(param, choices)
    cut.set_user_attr("measured", True)
    cut.set_user_attr("reason", "launch")

    out = run_study(CHAIN, SPACE, backend, url, strategy="random", seed=2, trials=6)
    trials = study.get_trials()
    assert out.summary.measured == 6 and out.summary.failures["launch"] == 0
    decided = [t for t in trials if t.user_attrs.get("measured") and t.state != TrialState.RUNNING]
    assert len(decided) == 6
    assert all(t.state == TrialState.RUNNING for t in trials if t.number == cut.number)
    assert not [t for t in trials if t.state == TrialState.RUNNING and t.number != cut.number]


def test_tpe_never_measures_a_config_twice(url):
    from tuner.backends.replay import ReplayBackend  # noqa: PLC0415
    from tuner.search.space import load_space  # noqa: PLC0415

    # The recording holds few configs of a size, so TPE proposes ones the study already has.
    backend = ReplayBackend([SYNTHETIC])
    out = run_study(CHAIN, load_space(ROOT / "search_spaces" / "gpt3.toml"), backend, url, strategy="tpe", seed=3,
                    trials=30, check=None)
    measured = measured_trials(url, backend.device_info().name)
    assert out.summary.measured == len(measured) == 30 and out.cache_hits == 0
    assert Counter(json.dumps(t.params, sort_keys=True) for t in measured).most_common(1)[0][1] == 1


# ---------------------------------------------------------------------------
# Bad input: one line, "tuner: error: ...", exit status 2 (the cases tests/test_cli.py does not cover)


def one_line_error(capsys, argv: list[str], *needles: str) -> None:
    rc = main(argv)
    assert_one_line_error(rc, capsys.readouterr().err, *needles)


REPLAY = ["--backend", "replay", "--replay-file", str(SYNTHETIC)]


@pytest.mark.parametrize("args, needles", [
    (["--tokens", "-3"], ["--tokens", "'-3'"]),
    (["--tokens", "1.5"], ["--tokens", "'1.5'"]),
    (["--plant-fault", "0:hang"], ["--plant-fault", "illegal_address"]),
    (["--plant-fault", "3:boom"], ["--plant-fault", "'3:boom'"]),
])
def test_bad_study_arguments(capsys, url, args, needles):
    one_line_error(capsys, ["study", "gpt3", *args, *REPLAY, "--storage", url], *needles)


def test_unreachable_storage_fails_fast(capsys):
    start = time.monotonic()
    one_line_error(capsys, ["study", "gpt3", "--tokens", "64", *REPLAY, "--storage",
                            "postgresql://nobody@127.0.0.1:1/x"], "storage", "postgresql://nobody@127.0.0.1:1/x")
    assert time.monotonic() - start < 10


def test_storage_in_a_read_only_folder(capsys, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root?) may write into a mode 555 folder")
        one_line_error(capsys, ["study", "gpt3", "--tokens", "64", *REPLAY, "--storage",
                                f"sqlite:///{folder / 'tuner.db'}"], "cannot use storage")
    finally:
        folder.chmod(0o755)


def test_compile_when_nvrtc_does_not_load(capsys, monkeypatch):
    def missing():
        raise tuner.codegen.compile.ToolchainMissing("NVRTC is not available (libnvrtc.so: cannot open shared object file); "
                                             "install it with: pip install -e '.[compile]'")

    monkeypatch.setattr(tuner.codegen.compile, "_nvrtc", missing)
    one_line_error(capsys, ["compile", "gpt3", "--tokens", "64", "--limit", "2"], "NVRTC", ".[compile]")


@pytest.mark.parametrize("strategy", ["random", "staged"])
def test_two_study_processes_on_one_sqlite_study_measure_the_budget_once(fast_dir, strategy):
    db = fast_dir / f"two-{strategy}" / "s.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    cmd = [sys.executable, "-m", "tuner", "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
           "--tokens", "64", "--trials", "30", "--seed", "5", "--strategy", strategy, "--storage", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    trials, per_config = [], Counter()
    for s in optuna.get_all_study_summaries(url):  # the chain's study and, for staged, its stages' own
        got = optuna.load_study(study_name=s.study_name, storage=url).get_trials()
        trials += got
        per_config.update((s.study_name, json.dumps(t.params, sort_keys=True)) for t in got
                          if t.user_attrs.get("measured"))
    measured = [t for t in trials if t.user_attrs.get("measured")]
    assert len(measured) == 30, "the two workers together measure exactly the budget"
    assert per_config.most_common(1)[0][1] == 1, "a config was measured twice"
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_the_worker_process_times_final_rounds_under_the_load_asked_for(url):
    """study --sustained reaches the child's time_rounds across the process boundary; without it the
    child is asked for rounds after idle, as before."""
    from chaos_backend import synthetic_us

    from tuner.config import Config

    backend = WorkerBackend("chaos_backend:RoundsBackend", deadline_s=DEADLINE_S)
    try:
        out = run_study(CHAIN, SPACE, backend, url, strategy="random", seed=0, trials=6, sustained_s=1.5)
        finals = [t for t in optuna.load_study(study_name=study_name(CHAIN, DEVICE_NAME), storage=url).get_trials()
                  if t.user_attrs.get("phase") == "finalists"]
        cfg = Config.from_dict(finals[0].user_attrs["config"])
        idle = backend.time_rounds(CHAIN, [cfg], 2)
    finally:
        backend.close()
    assert finals and all(t.user_attrs["sustained_s"] == 1.5 for t in finals)
    assert all(t.value == round(synthetic_us(Config.from_dict(t.user_attrs["config"])) + 1.5, 3) for t in finals)
    assert out.summary.final_sustained_s == 1.5 and idle == {cfg: [synthetic_us(cfg)] * 2}
