"""A stage's knobs are named by the stage in Optuna's parameters (``attn.bn``, ``conv2.bk``), and a
study stored when every stage's were named ``gemm{i}`` still loads, resumes and writes as it did."""
from __future__ import annotations

import optuna
import pytest
from chaos_backend import DEVICE_NAME, ChaosBackend
from optuna.trial import TrialState

from tuner.backends.base import DeviceInfo
from tuner.chain.workloads import get_workload
from tuner.config import Config, legacy_names, renamed
from tuner.paths import home
from tuner.search.space import load_space
from tuner.storage.trials import stage_study_name, study_name, trial_config
from tuner.study.loop import run_study

CHAIN = get_workload("llama-attn").chain(tokens=1)
SPACE = load_space(home() / "search_spaces" / "llama-attn.toml")
DEVICE = DeviceInfo(name=DEVICE_NAME, toolkit="none")
OLD = legacy_names(3)


def trials(url: str, name: str) -> list:
    return [t for t in optuna.load_study(study_name=name, storage=url).get_trials() if t.state == TrialState.COMPLETE]


def prefixes(ts: list) -> set[str]:
    return {k.split(".")[0] for t in ts for k in t.params if "." in k}


def test_a_new_study_names_each_stages_knobs_by_the_stage(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    run_study(CHAIN, SPACE, ChaosBackend(), url, seed=1, trials=6, final=False, transfer=False)
    chain_trials = trials(url, study_name(CHAIN, DEVICE))
    assert CHAIN.stage_names == ("qkv", "attn", "out")
    assert chain_trials and prefixes(chain_trials) == {"qkv", "attn", "out"}
    for t in chain_trials:
        assert trial_config(t, CHAIN.stage_names) == Config.from_dict(t.user_attrs["config"])
    alone = trials(url, stage_study_name(CHAIN, 1, DEVICE))
    assert alone and prefixes(alone) == {"attn"}


def test_parameters_stored_under_the_old_names_read_as_the_same_config():
    cfg = SPACE.feasible(CHAIN, DEVICE).baselines()[0]
    old = renamed(cfg.params(CHAIN.stage_names), CHAIN.stage_names, OLD)
    assert "gemm2.bn" in old and "attn.bn" not in old
    assert Config.from_params(old, CHAIN.stage_names) == cfg
    # A stage timed alone was stored as gemm1 whatever its place in the chain.
    alone = Config(cfg.tiles[1:2], *cfg.globals)
    assert Config.from_params(renamed(alone.params(("attn",)), ("attn",), ("gemm1",)), ("attn",)) == alone


def _copy_under_old_names(src: str, dst: str, name: str, names: tuple[str, ...], old: tuple[str, ...]) -> None:
    """Study ``name`` of ``src`` written to ``dst`` as a version that named every stage gemm{i} stored it."""
    study = optuna.load_study(study_name=name, storage=src)
    copy = optuna.create_study(study_name=name, storage=dst, direction="minimize")
    for key, value in study.user_attrs.items():
        copy.set_user_attr(key, value)
    for t in study.get_trials():
        copy.add_trial(optuna.trial.create_trial(
            params=renamed(t.params, names, old), distributions=renamed(t.distributions, names, old),
            value=t.value, state=t.state, user_attrs=t.user_attrs))


def test_a_study_stored_under_the_old_names_resumes_under_them_and_measures_nothing_twice(tmp_path):
    new, old = f"sqlite:///{tmp_path}/new.db", f"sqlite:///{tmp_path}/old.db"
    run_study(CHAIN, SPACE, ChaosBackend(), new, seed=1, trials=6, final=False, transfer=False)
    _copy_under_old_names(new, old, study_name(CHAIN, DEVICE), CHAIN.stage_names, OLD)
    for j, st in enumerate(CHAIN.stages):
        _copy_under_old_names(new, old, stage_study_name(CHAIN, j, DEVICE), (st.name,), ("gemm1",))
    before = trials(old, study_name(CHAIN, DEVICE))

    run_study(CHAIN, SPACE, ChaosBackend(), old, seed=1, trials=10, final=False, transfer=False)
    after = trials(old, study_name(CHAIN, DEVICE))
    assert len(after) > len(before) and prefixes(after) == {"gemm1", "gemm2", "gemm3"}
    configs = [trial_config(t, CHAIN.stage_names) for t in after if t.user_attrs.get("measured")]
    assert len(configs) == len(set(configs))  # what the old study measured was known, not measured again
    assert all(Config.from_dict(t.user_attrs["config"]) == c for t, c in
               zip([t for t in after if t.user_attrs.get("measured")], configs))
    assert prefixes(trials(old, stage_study_name(CHAIN, 1, DEVICE))) == {"gemm1"}


@pytest.mark.parametrize("workload, names", [("gpt3", ("gemm1", "gemm2")), ("resnet38", None)])
def test_a_gemm_chain_keeps_the_names_it_always_had_and_a_conv_chain_names_its_convolutions(workload, names):
    chain = get_workload(workload).chain(**({"tokens": 1} if workload == "gpt3" else {"batch": 1}))
    assert chain.stage_names == (names or tuple(f"conv{i + 1}" for i in range(len(chain.stages))))
