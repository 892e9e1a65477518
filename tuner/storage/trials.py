"""Trials in the Optuna storage: naming, writing, reading back and summing up.

A chain's study is named ``<chain label>/<device>``; each stage timed alone has a study of
its own, ``<chain label>/<stage>/<device>``. A trial is written whole, once its outcome is
known (``Study.add_trial``), so a process killed mid-measurement leaves nothing half done:
the config is simply measured again when the study resumes. Finalist trials (the interleaved
re-timing of the fastest configs) carry ``phase = "finalists"``; where they exist they, not
the single timings, give the study's best.
"""
from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from .. import UsageError, shortlist, shown
from ..backends.base import FAIL_REASONS, DeviceInfo, Measurement
from ..chain.tiling import refitted
from ..chain.workloads import Chain, get_workload
from ..config import Config, ConfigError, legacy_names, renamed

FINALISTS = "finalists"


class StudyError(UsageError):
    """A study file is malformed, or a study cannot run as asked."""


GRAPHS_SUFFIX = "/graphs"  # the studies timed as CUDA graph replays, apart from those timed as launches



def study_summaries(rdb: Any) -> list[Any]:
    """Every study the storage holds, without loading their trials."""
    import optuna  # noqa: PLC0415

    return optuna.get_all_study_summaries(rdb, include_best_trial=False)


def stored_trials(rdb: Any, name: str, states: tuple[Any, ...] | None = None) -> list[Any]:
    """The trials of study ``name`` (of ``states`` only, if given), not copied: read, never change them."""
    import optuna  # noqa: PLC0415

    return optuna.load_study(study_name=name, storage=rdb).get_trials(deepcopy=False, states=states)

def study_name(chain: Chain, device: DeviceInfo | str, graphs: bool = False) -> str:
    """The Optuna study name: chain label and device, e.g. ``gpt3/tokens=64,hidden=12288,ffn=6144/NVIDIA H200``,
    and ``/graphs`` after it for a study timed as CUDA graph replays (their times are not comparable)."""
    name = device if isinstance(device, str) else device.name
    return f"{chain.label}/{name}" + (GRAPHS_SUFFIX if graphs else "")


def stage_study_name(chain: Chain, j: int, device: DeviceInfo | str, graphs: bool = False) -> str:
    """The study of stage ``j`` timed alone, e.g. ``gpt3/tokens=64,hidden=12288,ffn=6144/gemm1/NVIDIA H200``."""
    name = device if isinstance(device, str) else device.name
    return f"{chain.label}/{chain.stages[j].name}/{name}" + (GRAPHS_SUFFIX if graphs else "")


def trial_config(trial: Any, names: Sequence[str], study: str = "a study") -> Config | None:
    """The config a trial was given (its params, or the fixed params of a queued trial) to a chain of
    stages ``names``, every value checked (:meth:`Config.from_params`); None for a trial given none.
    A stored value this version cannot run (edited in the database, say) is a :class:`ConfigError`
    naming ``study`` and the trial."""
    params = trial.params or trial.system_attrs.get("fixed_params") or {}
    where = f"study {study!r}, trial {trial.number}"
    config = Config.from_params(params, names, where=where) if params else None
    said = trial.user_attrs.get("config")
    if said is not None and Config.from_dict(said, where) != config:
        raise ConfigError(f"{where}: its stored config and its parameters disagree")
    return config


def is_stream(trial: Any) -> bool:
    return trial.params.get("policy") == "stream"


def is_final(trial: Any) -> bool:
    return trial.user_attrs.get("phase") == FINALISTS


def final_heat(trial: Any) -> float:
    """A finalist's sustained load: the seconds of its own runs each of its timings followed (0: idle)."""
    return float(trial.user_attrs.get("sustained_s", 0.0))


@dataclass
class TrialSummary:
    """What a study's trials add up to."""

    measured: int = 0
    rejected: int = 0  # refused suggestions stored by older versions (this one stores none)
    failures: Counter = field(default_factory=Counter)  # by reason, of measured trials
    timed_best: Any = None  # the fastest measured trial (earliest on ties)
    timed_baseline: Any = None  # the fastest measured stream-policy trial
    final_best: Any = None  # the fastest finalist of the latest final rounds
    final_baseline: Any = None
    final_set: int = -1
    final_sustained_s: float = 0.0  # the latest final rounds' sustained load (0: after idle)

    @property
    def best(self) -> Any:
        """The study's best: the fastest finalist where final rounds ran, else the fastest single timing."""
        return self.final_best if self.final_best is not None else self.timed_best

    @property
    def baseline(self) -> Any:
        return self.final_baseline if self.final_baseline is not None else self.timed_baseline

    @property
    def best_us(self) -> float | None:
        return self.best.value if self.best is not None else None

    @property
    def baseline_us(self) -> float | None:
        return self.baseline.value if self.baseline is not None else None

    @property
    def speedup(self) -> float | None:
        if self.best is None or self.baseline is None:
            return None
        return self.baseline.value / self.best.value

    def add(self, trial: Any) -> None:
        from optuna.trial import TrialState  # noqa: PLC0415

        attrs = trial.user_attrs
        if is_final(trial):
            if trial.state != TrialState.COMPLETE:
                return
            n, heat = int(attrs.get("final_set", 0)), final_heat(trial)
            # A later set: after more trials, or the same trials timed again under another load (in
            # trial order, the later rounds supersede).
            if n > self.final_set or (n == self.final_set and heat != self.final_sustained_s):
                self.final_set, self.final_sustained_s, self.final_best, self.final_baseline = n, heat, None, None
            if n == self.final_set:
                if self.final_best is None or trial.value < self.final_best.value:
                    self.final_best = trial
                if is_stream(trial) and (self.final_baseline is None or trial.value < self.final_baseline.value):
                    self.final_baseline = trial
            return
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            return  # left by an older version's killed process: nothing was decided
        if attrs.get("measured"):
            self.measured += 1
        if trial.state == TrialState.COMPLETE:
            if self.timed_best is None or trial.value < self.timed_best.value:
                self.timed_best = trial
            if is_stream(trial) and (self.timed_baseline is None or trial.value < self.timed_baseline.value):
                self.timed_baseline = trial
        elif trial.state == TrialState.FAIL and attrs.get("reason") in FAIL_REASONS:
            self.failures[attrs["reason"]] += 1
            if not attrs.get("measured"):
                self.rejected += 1


def summarize(trials: Iterable[Any]) -> TrialSummary:
    s = TrialSummary()
    for t in sorted(trials, key=lambda t: t.number):
        s.add(t)
    return s


def decided(trial: Any) -> bool:
    """Whether a trial holds a measured outcome: a time, or a failure with its reason."""
    from optuna.trial import TrialState  # noqa: PLC0415

    if not trial.user_attrs.get("measured") or is_final(trial):
        return False
    return trial.state == TrialState.COMPLETE or (trial.state == TrialState.FAIL
                                                  and trial.user_attrs.get("reason") in FAIL_REASONS)


def measurement_attrs(m: Measurement) -> dict[str, Any]:
    return {"source_hash": m.source_hash, "compile_s": m.compile_s, "resources": m.resources, "error": m.error,
            "times_us": list(m.times_us), "replayed": m.replayed}


_TOKEN = "claims_token"
TOKEN_WAIT_S = 10.0  # how long a worker waits for the study's maker to write the claims' token


class TrialBook:
    """One Optuna study in the storage: what it has decided, and the writing of new trials."""

    def __init__(self, rdb: Any, name: str, domains: Mapping[str, list], names: Sequence[str],
                 attrs: Mapping[str, Any]):
        import optuna  # noqa: PLC0415
        from optuna.distributions import CategoricalDistribution  # noqa: PLC0415

        self.name = name
        sampler = optuna.samplers.RandomSampler()
        try:
            self.study = optuna.create_study(study_name=name, storage=rdb, direction="minimize", sampler=sampler)
            # Only the worker that made the study gets here (the storage refuses a second study of
            # the name), so this token is the one every worker reads.
            self.study.set_user_attr(_TOKEN, uuid.uuid4().hex)
        except optuna.exceptions.DuplicatedStudyError:
            self.study = optuna.load_study(study_name=name, storage=rdb, sampler=sampler)
        for key, value in attrs.items():
            if self.study.user_attrs.get(key) != value:
                self.study.set_user_attr(key, value)
        self._scope: str | None = None
        trials = self.study.get_trials(deepcopy=False)
        # The stage prefixes its parameters are written under: a study begun before parameters were
        # named by stage goes on under the old names, so its trials never mix the two forms.
        self.names = tuple(names)
        old = legacy_names(len(names))
        stored = {k.partition(".")[0] for t in trials for k in t.params}
        if old != self.names and trials and not stored & set(self.names):
            self.names = old
            domains = renamed(domains, names, old)
        self.dists = {k: CategoricalDistribution(v) for k, v in domains.items()}
        self.known: dict[Config, tuple[float | None, str | None]] = {}
        self.finals: set[tuple[Config | None, Any, float]] = set()  # (config, final set, sustained load)
        self.summary = TrialSummary()
        self._seen: set[int] = set()
        self._check_distributions(trials)
        self._take_in(trials)

    def _take_in(self, trials: Iterable[Any]) -> None:
        from optuna.trial import TrialState  # noqa: PLC0415

        for t in sorted(trials, key=lambda t: t.number):
            if t.number in self._seen or t.state in (TrialState.RUNNING, TrialState.WAITING):
                continue
            self._seen.add(t.number)
            self.summary.add(t)
            c = self.config_of(t)
            if decided(t) and c is not None:
                self.known[c] = (t.value, t.user_attrs.get("reason"))
            if is_final(t):
                self.finals.add((c, t.user_attrs.get("final_set"), final_heat(t)))

    def config_of(self, trial: Any) -> Config | None:
        """A trial's config, checked as :func:`trial_config` checks it and against this study's
        space: a value outside the choices the study was run with is refused the same way."""
        c = trial_config(trial, self.names, self.name)
        for param, value in (trial.params or {}).items():
            dist = self.dists.get(param)
            if dist is None or value not in dist.choices:
                raise ConfigError(f"study {self.name!r}, trial {trial.number}: {param} = {shown(value)} is not in the "
                                  "search space it was run with; accepted: a value the space lists")
        return c

    @property
    def scope(self) -> str:
        """The claims' scope: the study's name and the token its maker wrote, which every worker reads
        the same and which a study deleted and made again under the same name gets anew. (The
        study's id alone is not enough: SQLite hands a deleted study's id to the next one, whose
        workers would then find the old study's claims and budget slots all taken.)"""
        if self._scope is None:
            deadline = time.monotonic() + TOKEN_WAIT_S
            token = self.study.user_attrs.get(_TOKEN)
            while token is None and time.monotonic() < deadline:  # its maker writes it just after the study
                time.sleep(0.05)
                token = self.study.user_attrs.get(_TOKEN)
            # A study made by a version without tokens: its id is the one thing all workers share.
            self._scope = f"{self.name}#{token or self.study._study_id}"
        return self._scope

    def refresh(self) -> None:
        """Take in the trials written since this book last looked (by this worker or another)."""
        self._take_in(self.study.get_trials(deepcopy=False))

    def _check_distributions(self, trials: list[Any]) -> None:
        """Optuna refuses a parameter whose choices changed; say so before the first trial, in our words."""
        for t in trials:
            for param, dist in t.distributions.items():
                if param in self.dists and dist != self.dists[param]:
                    raise StudyError(
                        f"study {self.name!r}, trial {t.number}: was run with other choices for {param} "
                        f"({shortlist(map(repr, dist.choices))} now {shortlist(map(repr, self.dists[param].choices))}): "
                        "the search space changed, or the storage was edited; accepted: the same space, or a new "
                        "--storage")

    def record(self, config: Config, value: float | None, attrs: Mapping[str, Any]) -> None:
        """Write one finished trial (COMPLETE with ``value``, else FAIL) and take it in."""
        import optuna  # noqa: PLC0415
        from optuna.trial import TrialState  # noqa: PLC0415

        ok = value is not None and math.isfinite(value)
        self.study.add_trial(optuna.trial.create_trial(
            params=config.params(self.names), distributions=self.dists, value=value if ok else None,
            state=TrialState.COMPLETE if ok else TrialState.FAIL, user_attrs=dict(attrs)))
        self.refresh()


def transfer_candidates(rdb: Any, chain: Chain, device: DeviceInfo, per_study: int = 3,
                        neighbours: int = 2, graphs: bool = False) -> tuple[list[Config], list[list[Any]]]:
    """The best configs of the nearest sizes already in the storage, for the same device, timed
    the same way (``graphs``: as CUDA graph replays).

    Chain configs come from the studies of the same workload and model shape at the nearest
    token counts (log distance); stage tilings from the stage studies of the same stage shape
    (N, K, epilogue) at the nearest M, which includes the same stage measured in another chain.
    """
    from optuna.trial import TrialState  # noqa: PLC0415

    size = chain.size_dict
    sweep = chain.size[0][0]
    # (distance, study, the rows M of each of its stages)
    chain_near: list[tuple[float, str, tuple[int, ...]]] = []
    # (distance, study, its stage's rows M, its stage's name: a stage of another chain may be named otherwise)
    stage_near: list[list[tuple[float, str, int, str]]] = [[] for _ in chain.stages]
    shapes = [(st.n, st.k, st.epilogue) for st in chain.stages]
    for s in study_summaries(rdb):
        a = s.user_attrs
        if (a.get("device") != device.name or a.get("label") == chain.label or a.get("replayed")
                or bool(a.get("graphs")) != graphs):
            continue
        other = a.get("size") or {}
        if "stage_shape" in a:
            m, n, k, epi = a["stage_shape"]
            for j, shape in enumerate(shapes):
                if (n, k, epi) == shape:
                    stage_near[j].append((abs(math.log(m / chain.stages[j].m)), s.study_name, m,
                                          str(a.get("stage", ""))))
        elif a.get("workload") == chain.workload and sweep in other and all(
                other.get(p) == v for p, v in size.items() if p != sweep):
            rows = tuple(st.m for st in get_workload(chain.workload).chain(**other).stages)
            chain_near.append((abs(math.log(other[sweep] / size[sweep])), s.study_name, rows))

    def best_of(name: str, names: Sequence[str]) -> list[Config]:
        trials = stored_trials(rdb, name, (TrialState.COMPLETE,))
        trials = sorted((t for t in trials if t.user_attrs.get("measured")), key=lambda t: t.value)
        out = [c for t in trials[:per_study] if (c := trial_config(t, names, name)) is not None]
        return out

    # A pick of another size comes as picked, and first with its tile heights refitted to this
    # size's rows (tiling.refitted): a height fitted to that size is rarely one this size's space holds.
    chain_cfgs: list[Config] = []
    for _, name, rows in sorted(chain_near)[:neighbours]:
        for c in best_of(name, chain.stage_names):
            fit = replace(c, tiles=tuple(refitted(t, m, st.m) for t, m, st in zip(c.tiles, rows, chain.stages)))
            chain_cfgs += [x for x in dict.fromkeys((fit, c)) if x not in chain_cfgs]
    stage_tiles = []
    for j, near in enumerate(stage_near):
        tiles: list[Any] = []
        for _, name, m, stage in sorted(near)[:neighbours]:
            for c in best_of(name, (stage,)):
                tiles += [t for t in dict.fromkeys((refitted(c.tiles[0], m, chain.stages[j].m), c.tiles[0]))
                          if t not in tiles]
        stage_tiles.append(tiles)
    return chain_cfgs, stage_tiles


def measured_history(storage: Any, chain: Chain, device: DeviceInfo | str, graphs: bool = False
                     ) -> list[float | None]:
    """Every measured trial of ``chain``'s studies (its stages' alone included) in the order written:
    the whole-chain time, or None for a stage timed alone or a failure."""
    names = [study_name(chain, device, graphs)] + [stage_study_name(chain, j, device, graphs)
                                                   for j in range(len(chain.stages))]
    rows = []
    for name in names:
        try:
            trials = stored_trials(storage, name)
        except KeyError:
            continue
        rows += [(t.datetime_complete, t.value if name == names[0] else None) for t in trials
                 if t.user_attrs.get("measured")]
    return [v for _, v in sorted(rows, key=lambda r: r[0])]


def trials_to_within(history: list[float | None], target: float, within: float) -> int:
    """1-based count of trials up to the first whole-chain time within ``within`` of ``target``;
    one more than all when none is."""
    return next((i for i, v in enumerate(history, 1) if v is not None and v <= target * within), len(history) + 1)
