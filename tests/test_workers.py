"""Several workers on one study: PostgreSQL and SQLite storages, kill -9, one worker per GPU.

The PostgreSQL tests need a server: ``.ci/run`` starts one on loopback and passes its URL in
``TUNER_TEST_POSTGRES``; elsewhere they are skipped, unless ``TUNER_REQUIRE_POSTGRES`` is set,
which makes a missing server a failure (CI must not pass by skipping them).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.storage.database import driver_url

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "data" / "synthetic_measurements.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def study_command(url: str, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tuner", "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
            "--tokens", "64", "--trials", str(trials), "--seed", "5", "--storage", url, *extra]


def all_trials(url: str) -> tuple[list, Counter]:
    """Every trial of every study in the storage (the chain's and its stages'), and how often
    each config was measured in each study."""
    trials, per_config = [], Counter()
    for s in optuna.get_all_study_summaries(driver_url(url)):
        got = optuna.load_study(study_name=s.study_name, storage=driver_url(url)).get_trials()
        trials += got
        per_config.update((s.study_name, json.dumps(t.params, sort_keys=True)) for t in got
                          if t.user_attrs.get("measured"))
    return trials, per_config


def measured_count(url: str) -> int:
    try:
        return sum(1 for t in all_trials(url)[0] if t.user_attrs.get("measured"))
    except Exception:  # tables not made yet
        return 0


def assert_budget_measured_once(url: str, trials: int) -> None:
    got, per_config = all_trials(url)
    measured = [t for t in got if t.user_attrs.get("measured")]
    assert len(measured) == trials, "the workers together measure exactly the budget"
    assert per_config.most_common(1)[0][1] == 1, "a config was measured twice"
    assert not [t.number for t in got if t.state == TrialState.RUNNING], "a trial was left RUNNING"


def test_four_workers_on_postgresql_one_killed_mid_study(postgres):
    trials = 60
    # Replayed trials take milliseconds: a short claim grace lets the others take over the
    # killed worker's claims within the test's time.
    cmd = study_command(postgres, trials, "--strategy", "staged", "--claim-grace", "3")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    victim = procs[1]
    try:
        give_up = time.monotonic() + 120
        while measured_count(postgres) < 10:
            assert victim.poll() is None, f"the worker ended before it could be killed: {victim.communicate()}"
            assert time.monotonic() < give_up, "no 10 trials within 120 s"
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert victim.returncode == -signal.SIGKILL
    for p, (out, err) in zip(procs, outs):
        if p is not victim:
            assert p.returncode == 0, err
            assert f"{trials} trials measured" in out
    assert_budget_measured_once(postgres, trials)


def test_a_rerun_on_postgresql_adds_no_trial(postgres):
    cmd = study_command(postgres, 20, "--strategy", "random")
    for _ in range(2):
        done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert "20 trials measured (0 new" in done.stdout
    assert_budget_measured_once(postgres, 20)


def test_one_worker_per_gpu_shares_the_budget(fast_dir):
    # Replayed trials take milliseconds and the workers start a second or two apart: a budget
    # that outlasts the start lets every worker take part.
    url = f"sqlite:///{fast_dir / 'gpus.db'}"
    done = subprocess.run(study_command(url, 200, "--strategy", "staged", "--gpus", "0,1,2"), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "workers: 3 of 3 exited 0" in done.stdout
    lines = [ln for ln in done.stdout.splitlines() if "trials measured" in ln]
    assert sorted(ln.split("]")[0] for ln in lines) == ["[gpu 0", "[gpu 1", "[gpu 2"]
    new = [int(ln.split("trials measured (")[1].split(" new")[0]) for ln in lines]
    assert sum(new) == 200 and max(new) < 200, f"the workers did not share the trials: {new}"
    assert_budget_measured_once(url, 200)


@pytest.mark.parametrize("gpus, error", [("0,0", "GPU 0 is named twice"), ("a", "GPU indices"),
                                         ("all", "--gpus all: no CUDA device is visible")])
def test_bad_gpu_lists_are_one_line_errors(gpus, error):
    from tuner.backends import gpu_visible

    if gpus == "all" and gpu_visible():
        pytest.skip("a GPU is visible: --gpus all is no error here")
    done = subprocess.run(study_command("sqlite://", 5, "--gpus", gpus), cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and error in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_study_commands_a_few_seconds_apart_twenty_times_in_a_row(fast_dir):
    for attempt in range(20):
        url = f"sqlite:///{fast_dir / f'twenty-{attempt}.db'}"
        cmd = study_command(url, 30, "--strategy", "staged")
        first = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        second = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        _, err = first.communicate(timeout=300)
        assert (first.returncode, second.returncode) == (0, 0), f"try {attempt + 1}: {err or second.stderr}"
        assert_budget_measured_once(url, 30)
