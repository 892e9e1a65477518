"""Strategy comparison on recorded H200 measurements (replayed, so it runs without a GPU): trials
needed to come within 3% of the recording's best chain, median over seeds, for staged, TPE and
random search. Trials count every measurement, stages timed alone included."""
from __future__ import annotations

from statistics import median

import pytest

from tuner.backends.replay import ReplayBackend
from tuner.chain.workloads import get_workload
from tuner.paths import home
from tuner.search.space import load_space
from tuner.storage.trials import measured_history, trials_to_within
from tuner.study.loop import run_study

SEEDS = range(5)  # 20 took over an hour on a 2-core host
WITHIN = 1.03
CASES = [("gpt3", 256, "gpt3.staged.measurements.json"), ("llama", 320, "llama.measurements.json")]


# Slow (python -m pytest -m slow). Expected to fail with today's recordings: they hold the chains
# the staged search measured (its pairings of each stage's fastest tilings and their neighbours)
# and, for llama, 393 TPE proposals, so random and TPE, which can only draw recorded chains here,
# draw from a set of mostly good configs and reach 3% in a handful of trials. On the GPU, from an
# empty database, 100 TPE trials at gpt3 256 tokens ended at 171 us where staged's 400 reach
# 122.8 (studies/notes/). A fair replay needs a recording that holds a uniform sample of the
# whole space as well.
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.xfail(strict=True, reason="the recordings hold only good chains: random and TPE draw among them")
@pytest.mark.parametrize("workload,tokens,recording", CASES)
def test_staged_needs_at_most_a_third_of_random_searchs_trials(workload, tokens, recording, fast_dir, capsys):
    path = home() / "studies" / recording
    if not path.exists():
        pytest.skip(f"no recording {recording}")
    backend = ReplayBackend([path])
    chain = get_workload(workload).chain(tokens=tokens)
    device = backend.device_info().name
    recorded = [r.measurement.median_us for r in backend.recordings[0].records
                if r.label == chain.label and r.measurement.ok]
    space = load_space(home() / "search_spaces" / f"{workload}.toml")
    alone = {chain.alone(j).label for j in range(len(chain.stages))}
    budget = len(recorded) + sum(r.label in alone for r in backend.recordings[0].records)
    reached: dict[str, list[int]] = {}
    for strategy in ("staged", "tpe", "random"):
        reached[strategy] = []
        for seed in SEEDS:
            storage = f"sqlite:///{fast_dir / f'strategy-{workload}{tokens}-{strategy}{seed}.db'}"
            run_study(chain, space, backend, storage, strategy=strategy, seed=seed, trials=budget, transfer=False,
                      final=False)
            history = measured_history(storage, chain, device)
            reached[strategy].append(trials_to_within(history, min(recorded), WITHIN))
    with capsys.disabled():
        print(f"\n{chain.label} (replayed H200 recording, {len(recorded)} chains): trials to within 3% of the best, "
              + ", ".join(f"{s} median {median(v)} {v}" for s, v in reached.items()))
    assert median(reached["staged"]) * 3 <= median(reached["random"])
