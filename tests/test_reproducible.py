"""A replayed study is reproducible: the same command twice gives the same trials and byte-identical exports."""
from __future__ import annotations

import optuna

from tuner import cli


def trials(url: str) -> list[tuple]:
    out = []
    for summary in sorted(optuna.get_all_study_summaries(url), key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        out += [(summary.study_name, t.number, t.state.name, t.value, t.params) for t in study.trials]
    return out


def test_the_same_replayed_study_twice_gives_identical_trials_and_exports(fast_dir, capsys):
    exports = []
    runs = []
    for run in ("a", "b"):
        url = f"sqlite:///{fast_dir / f'reproducible-{run}.db'}"
        argv = ["study", "gpt3", "--backend", "replay", "--seed", "7", "--trials", "30", "--tokens", "1",
                "--storage", url]
        assert cli.main(argv) == 0
        out = fast_dir / f"reproducible-{run}.json"
        assert cli.main(["export", "gpt3", "--storage", url, "-o", str(out)]) == 0
        exports.append(out.read_bytes())
        runs.append(trials(url))
    assert runs[0] == runs[1] and len(runs[0]) >= 30
    assert exports[0] == exports[1]
