"""Strategy benchmark on the recorded H200 measurements (replayed, so it runs in CI without a GPU):
TPE reaches within 3% of the recorded best in fewer trials than random search, median over seeds."""
from __future__ import annotations

from statistics import median

import pytest

from tuner.backends.replay import ReplayBackend
from tuner.paths import home
from tuner.space import load_space
from tuner.study import run_study
from tuner.workloads import get_workload

RECORDING = home() / "studies" / "gpt3.measurements.json"
SEEDS = range(5)
WITHIN = 1.03


def trials_to_reach(storage: str, target: float) -> int:
    """1-based number of the first measured trial within WITHIN of the target (budget + 1 if none)."""
    import optuna

    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    for i, t in enumerate(measured, 1):
        if t.value is not None and t.value <= target * WITHIN:
            return i
    return len(measured) + 1


# Slow (nightly, python -m pytest -m slow). It has never passed: on the first H200 recording (29 to
# 45 configs per size) TPE needed a median of 12 and 11 trials, random search 10 and 9; on the
# recording of 66c0085 (26-27 whole-chain configs per size, all of them pairings of each stage's
# fastest tilings, so nearly any is within 3% of the best) both need 4, and again on the
# recording of 4f7d436 (42-44 configs per size). A recording of a broad
# sample of the space is what this comparison needs; it is kept as the benchmark to rerun then.
@pytest.mark.slow
@pytest.mark.skipif(not RECORDING.exists(), reason="no H200 recording in studies/ yet")
@pytest.mark.parametrize("tokens", [1, 64])
def test_tpe_reaches_the_recorded_best_sooner_than_random_search(tokens, fast_dir, capsys):
    backend = ReplayBackend([RECORDING])
    chain = get_workload("gpt3").chain(tokens=tokens)
    if chain.label not in backend.labels():
        pytest.skip(f"{chain.label} is not in the recording")
    space = load_space(home() / "search_spaces" / "gpt3.toml")
    recorded = [r.measurement.median_us for r in backend.recordings[0].records
                if r.label == chain.label and r.measurement.ok]
    best = min(recorded)
    budget = len(recorded)
    reached = {}
    for sampler in ("tpe", "random"):
        reached[sampler] = []
        for seed in SEEDS:
            storage = f"sqlite:///{fast_dir / f'strategy-{tokens}-{sampler}{seed}.db'}"
            run_study(chain, space, backend, storage, sampler=sampler, seed=seed, trials=budget)
            reached[sampler].append(trials_to_reach(storage, best))
    with capsys.disabled():
        print(f"\n{chain.label} (replayed H200 recording, {budget} configs): trials to within 3% of the best, "
              f"per seed: tpe {reached['tpe']}, random {reached['random']}")
    assert median(reached["tpe"]) < median(reached["random"])
