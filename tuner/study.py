"""Study files and the tuning loop: one Optuna study per (workload, size, device).

Each trial is asked for, checked against the hard constraints and the sync
checker, measured (or served from the measurement cache), and told back at
once, so an interrupted study loses nothing that was measured. The budget is
the number of measured trials in the study: rerunning the same command does
nothing new, raising ``--trials`` continues where the study stopped.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import UsageError, __version__
from .backends.base import FAIL_REASONS, Backend, DeviceInfo, Measurement
from .config import Config
from .paths import home
from .space import FeasibleSet, SearchSpace
from .store import MeasurementStore, open_optuna_storage
from .tomlfile import did_you_mean, read_toml
from .workloads import Chain, WorkloadError, get_workload

SAMPLERS = ("tpe", "random", "grid")
STUDY_KEYS = ("workload", "sizes", "space", "sampler", "seed", "trials", "timeout")
REJECTION_FACTOR = 20  # infeasible suggestions allowed per trial of budget, so a study always ends

Checker = Callable[[Chain, Config], "str | None"]


class StudyError(UsageError):
    """A study file is malformed, or a study cannot run as asked."""


# ---------------------------------------------------------------------------
# Study files


@dataclass(frozen=True)
class StudySpec:
    """What to tune: a workload, the sizes to sweep, the search space and the sampler settings."""

    workload: str
    sizes: Mapping[str, tuple[int, ...]]
    space: Path
    sampler: str = "tpe"
    seed: int = 0
    trials: int = 100
    timeout: float | None = None
    source: str = "<defaults>"

    def chains(self) -> list[Chain]:
        """One chain per combination of the listed sizes."""
        wl = get_workload(self.workload)
        keys = list(self.sizes)
        return [wl.chain(**dict(zip(keys, values))) for values in itertools.product(*(self.sizes[k] for k in keys))]



def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StudyError(f"{where} = {value!r}: accepted: a positive integer")
    return value


def resolve_path(name: str | Path, beside: Path | None = None) -> Path:
    """A relative path is looked up beside the study file first, then under the tuner home."""
    p = Path(name).expanduser()
    if p.is_absolute():
        return p
    if beside is not None and (beside / p).exists():
        return beside / p
    return home() / p


def parse_study(data: Mapping[str, Any], source: str, beside: Path | None = None) -> StudySpec:
    """Validate a study given as a mapping (the parsed TOML); ``source`` names it in errors."""
    for key in data:
        if key not in STUDY_KEYS:
            raise StudyError(f"{source}: unknown key {key!r}{did_you_mean(key, STUDY_KEYS)}; "
                             f"accepted: {', '.join(STUDY_KEYS)}")
    if "workload" not in data:
        raise StudyError(f"{source}: missing key 'workload'")
    try:
        wl = get_workload(str(data["workload"]))
    except WorkloadError as exc:
        raise StudyError(f"{source}: {exc}") from None
    sizes: dict[str, tuple[int, ...]] = {wl.sweep_param: wl.sweep}
    raw = data.get("sizes", {})
    if not isinstance(raw, dict):
        raise StudyError(f"{source}: sizes must be a table such as {{{wl.sweep_param} = [1, 64]}}")
    for key, value in raw.items():
        if key not in wl.params:
            raise StudyError(f"{source}: unknown key sizes.{key}{did_you_mean(key, wl.params)}; "
                             f"accepted: {', '.join(wl.params)}")
        items = value if isinstance(value, list) else [value]
        if not items:
            raise StudyError(f"{source}: sizes.{key} is empty; accepted: a positive integer or a list of them")
        sizes[key] = tuple(_positive_int(v, f"{source}: sizes.{key}") for v in items)
    sampler = data.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise StudyError(f"{source}: sampler = {sampler!r}: accepted: {', '.join(SAMPLERS)}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise StudyError(f"{source}: seed = {seed!r}: accepted: a non-negative integer")
    timeout = data.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise StudyError(f"{source}: timeout = {timeout!r}: accepted: a positive number of seconds")
    space = data.get("space", f"search_spaces/{wl.name}.toml")
    if not isinstance(space, str):
        raise StudyError(f"{source}: space = {space!r}: accepted: the path of a search space file")
    return StudySpec(wl.name, sizes, resolve_path(space, beside), sampler, seed,
                     _positive_int(data.get("trials", 100), f"{source}: trials"),
                     float(timeout) if timeout is not None else None, source)


def load_study_file(path: str | Path) -> StudySpec:
    """Read and validate a study TOML file."""
    path = Path(path)
    data = read_toml(path, "study file", StudyError)
    return parse_study(data, str(path), path.parent)


def default_study(workload: str) -> StudySpec:
    """``studies/<workload>.toml`` when it exists, else the workload's own sweep and search space."""
    wl = get_workload(workload)
    path = home() / "studies" / f"{wl.name}.toml"
    if path.exists():
        return load_study_file(path)
    return parse_study({"workload": wl.name}, f"<defaults for {wl.name}>")


# ---------------------------------------------------------------------------
# Reading a study's trials


def study_name(chain: Chain, device: DeviceInfo | str) -> str:
    """The Optuna study name: chain label and device, e.g. ``gpt3/tokens=64,hidden=12288,ffn=6144/NVIDIA H200``."""
    name = device if isinstance(device, str) else device.name
    return f"{chain.label}/{name}"


def trial_config(trial: Any, n_stages: int) -> Config | None:
    """The config a trial was given (its params, or the fixed params of a queued trial)."""
    # A trial cut short while its params were being stored holds only some: its fixed params are whole.
    for params in (trial.params, trial.system_attrs.get("fixed_params", {})):
        try:
            return Config.from_params(params, n_stages)
        except (KeyError, TypeError, ValueError):
            continue
    return None


def is_stream(trial: Any) -> bool:
    return trial.params.get("policy") == "stream"


@dataclass
class TrialSummary:
    """What a study's trials add up to."""

    measured: int = 0
    rejected: int = 0  # suggestions refused before measuring (hard constraint or sync checker)
    best: Any = None  # the fastest complete trial (earliest on ties)
    baseline: Any = None  # the fastest complete stream-policy trial
    failures: Counter = field(default_factory=Counter)  # by reason, rejected suggestions included

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
        if attrs.get("measured"):
            self.measured += 1
        if trial.state == TrialState.COMPLETE:
            if self.best is None or trial.value < self.best.value:
                self.best = trial
            if is_stream(trial) and (self.baseline is None or trial.value < self.baseline.value):
                self.baseline = trial
        elif trial.state == TrialState.FAIL and attrs.get("reason") in FAIL_REASONS:
            self.failures[attrs["reason"]] += 1
            if not attrs.get("measured"):
                self.rejected += 1


def summarize(trials: Iterable[Any]) -> TrialSummary:
    s = TrialSummary()
    for t in sorted(trials, key=lambda t: t.number):
        s.add(t)
    return s


# ---------------------------------------------------------------------------
# The tuning loop


@dataclass
class StudyOutcome:
    """How one study run ended."""

    name: str
    label: str
    device: str
    feasible: int
    summary: TrialSummary
    new_trials: int = 0
    new_rejected: int = 0
    cache_hits: int = 0
    stop: str = "budget"  # budget, timeout, rejections, exhausted or interrupted
    replayed: bool = False
    synthetic: bool = False

    @property
    def interrupted(self) -> bool:
        return self.stop == "interrupted"


def figure_tag(backend: Backend) -> str:
    """The label every figure from ``backend`` carries."""
    if getattr(backend, "synthetic", False):
        return " (replayed, synthetic)"
    return " (replayed)" if backend.replayed else ""


def load_checker(backend: Backend) -> Checker | None:
    """The sync-protocol checker; without it, only replayed figures may be produced."""
    try:
        from .checker import check  # noqa: PLC0415 - imported when a study runs
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.checker":
            raise
        if backend.replayed:
            return None
        raise StudyError("the sync-protocol checker (tuner.checker) is not installed; a GPU study would run "
                         "unchecked protocols that may deadlock; accepted: --backend replay") from None
    return check


def _proposals(fs: FeasibleSet, sampler: str, seed: int, seen: set[Config]) -> Iterator[Config]:
    """Unseen feasible configs for the random and grid samplers, in an order fixed by the seed."""
    if sampler == "random":
        rng = np.random.default_rng(seed)
        misses = 0
        while misses < 1000:  # nearly everything seen: finish the set in grid order instead
            c = fs.sample(rng)
            if c in seen:
                misses += 1
                continue
            misses = 0
            yield c
    for c in fs.grid(seed):
        if c not in seen:
            yield c


def _draw_unseen(fs: FeasibleSet, seen: set[Config], accept: Callable[[Config], bool], seed: int, salt: int,
                 tries: int = 100) -> Config | None:
    """A feasible config not yet in the study that ``accept`` takes, drawn at random (deterministic in seed, salt)."""
    rng = np.random.default_rng([seed, salt])
    for _ in range(tries):
        c = fs.sample(rng)
        if c not in seen and accept(c):
            return c
    return None


def _check_distributions(study: Any, domains: Mapping[str, list], name: str) -> None:
    """Optuna refuses a parameter whose choices changed; say so before the first trial, in our words."""
    from optuna.distributions import CategoricalDistribution  # noqa: PLC0415

    for t in study.get_trials(deepcopy=False):
        for param, dist in t.distributions.items():
            if param in domains and dist != CategoricalDistribution(domains[param]):
                raise StudyError(
                    f"study {name!r} was run with other choices for {param} ({list(dist.choices)} now "
                    f"{domains[param]}): the search space, device or recordings changed; "
                    "accepted: the same space, or a new --storage")
        if t.distributions:
            return


def run_study(chain: Chain, space: SearchSpace, backend: Backend, storage: str, *, sampler: str = "tpe",
              seed: int = 0, trials: int = 100, timeout: float | None = None, check: Checker | None = None,
              progress: bool = False, warm: Sequence[Config] = (),
              log: Callable[[str], Any] | None = None) -> StudyOutcome:
    """Tune ``chain`` until the study holds ``trials`` measured trials, or time/suggestions run out.

    ``check`` is the sync-protocol checker (default: :func:`tuner.checker.check`). ``warm`` are
    configs known to be good (a bench's picks), measured first where the space holds them (its
    stream configs lead, else the space's stream baselines do); ``log`` hears how many were.
    Ctrl-C ends the run cleanly: the trial in flight is requeued and the outcome
    says ``stop == "interrupted"``.
    """
    import optuna  # noqa: PLC0415 - slow import
    from optuna.trial import TrialState  # noqa: PLC0415

    if sampler not in SAMPLERS:
        raise StudyError(f"unknown sampler {sampler!r}; accepted: {', '.join(SAMPLERS)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = backend.device_info()
    fs = space.feasible(chain, device)
    narrowed = backend.restrict(chain, fs)
    if narrowed is not None:
        fs = fs.restricted_to(narrowed)
    tag = figure_tag(backend)
    if fs.size == 0:
        raise StudyError(f"no feasible config for {chain.label} on {device.name}{tag}: {'; '.join(fs.reasons)}")
    if check is None:
        check = load_checker(backend)

    store = MeasurementStore(storage)
    rdb = open_optuna_storage(storage)
    name = study_name(chain, device)
    opt_sampler = (optuna.samplers.TPESampler(seed=seed) if sampler == "tpe"
                   else optuna.samplers.RandomSampler(seed=seed))
    study = optuna.create_study(study_name=name, storage=rdb, sampler=opt_sampler, direction="minimize",
                                load_if_exists=True)
    for key, value in {"workload": chain.workload, "size": chain.size_dict, "label": chain.label,
                       "device": device.name, "backend": backend.name, "replayed": backend.replayed,
                       "synthetic": bool(getattr(backend, "synthetic", False))}.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)

    domains = fs.domains()
    _check_distributions(study, domains, name)
    n_stages = len(chain.stages)
    _abandon_running(study, fs, n_stages)
    history = study.get_trials(deepcopy=False)
    summary = summarize(history)
    seen = {c for c in (trial_config(t, n_stages) for t in history) if c is not None}
    # Configs the study has decided (measured or refused), with the trial that did: never decided twice.
    tried = {c: t.number for t in history if _decided(t) and (c := trial_config(t, n_stages)) is not None}
    waiting = sum(t.state == TrialState.WAITING for t in history)
    outcome = StudyOutcome(name, chain.label, device.name, fs.size, summary, replayed=backend.replayed,
                           synthetic=bool(getattr(backend, "synthetic", False)))
    if summary.measured >= trials:
        return outcome
    if summary.baseline is not None:
        backend.set_reference_time(summary.baseline.value)

    fit = [c for c in warm if fs.contains(c) is None]
    if warm and log is not None:
        log(f"{chain.label}: warm start: {len(fit)} of {len(warm)} configs a bench picked are in this space"
            + ("" if len(fit) == len(warm) else " (and recorded)" if backend.replayed else ""))
    # The bench's stream pick is the best stream baseline known, so it goes first (a study always
    # starts with a stream-policy trial); without one, the space's stream baselines lead.
    fit.sort(key=lambda c: c.policy != "stream")
    first = [*fit, *fs.baselines()] if fit and fit[0].policy == "stream" else [*fs.baselines(), *fit]
    for cfg in first:
        if cfg not in seen:
            study.enqueue_trial(cfg.params())
            seen.add(cfg)
            waiting += 1
    proposals = _proposals(fs, sampler, seed, seen) if sampler != "tpe" else None
    verdicts: dict[Config, str | None] = {}

    def verdict(c: Config) -> str | None:
        """The sync checker's answer, asked once per config."""
        if check is None:
            return None
        if c not in verdicts:
            verdicts[c] = check(chain, c)
        return verdicts[c]

    def repair(cfg: Config) -> bool:
        """Queue the closest unseen feasible config the checker accepts; False when none is left.

        TPE learns nothing from failed trials and would propose the same thing again; it does
        learn from the measured neighbour.
        """
        nonlocal waiting
        sound = lambda c: verdict(c) is None  # noqa: E731
        repaired = fs.nearest(cfg, seen, sound) or _draw_unseen(fs, seen, sound, seed, len(seen))
        if repaired is None:
            return False
        study.enqueue_trial(repaired.params())
        seen.add(repaired)
        waiting += 1
        return True

    source_hash = _source_hasher(backend)
    device_attr = device.to_dict()
    deadline = time.monotonic() + timeout if timeout else None
    cap = REJECTION_FACTOR * trials
    repeats = 0
    bar = _progress_bar(progress, trials, summary.measured, chain.label + tag)
    _show(bar, summary, tag)

    current = None
    current_cfg: Config | None = None
    try:
        while summary.measured < trials:
            if deadline is not None and time.monotonic() >= deadline:
                outcome.stop = "timeout"
                break
            if outcome.new_rejected + repeats >= cap:
                outcome.stop = "rejections"
                break
            if proposals is not None and waiting <= 0:
                nxt = next(proposals, None)
                if nxt is None:
                    outcome.stop = "exhausted"
                    break
                study.enqueue_trial(nxt.params())
                seen.add(nxt)
                waiting += 1
            current, current_cfg = study.ask(), None
            waiting = max(0, waiting - 1)
            params = {p: current.suggest_categorical(p, choices) for p, choices in domains.items()}
            cfg = Config.from_params(params, n_stages)
            seen.add(cfg)
            if cfg in tried:
                # TPE proposes from what it learnt, which can be a config the study already holds;
                # measuring it again would spend the budget on nothing new.
                _finish(study, current, TrialState.FAIL, None,
                        {"message": f"repeats trial {tried[cfg]}; not measured again"})
                repeats += 1
                current = None
                if sampler == "tpe" and not repair(cfg):
                    outcome.stop = "exhausted"
                    break
                continue
            tried[cfg] = current.number
            why = fs.contains(cfg)
            if why is None and verdict(cfg) is not None:
                why = f"sync_checker: {verdict(cfg)}"
            if why is not None:
                # Kept short: refused suggestions can outnumber measured trials, and each attribute is a write.
                _finish(study, current, TrialState.FAIL, None,
                        {"measured": False, "reason": "constraint", "message": why})
                _count_rejection(summary)
                outcome.new_rejected += 1
                current = None
                if sampler == "tpe":
                    repair(cfg)
                continue
            current_cfg = cfg
            sh = source_hash(chain, cfg) if source_hash is not None else None
            m = store.lookup(device, chain.label, cfg, replayed=backend.replayed, source_hash=sh)
            cached = m is not None
            if m is None:
                m = backend.measure(chain, cfg)
            else:
                outcome.cache_hits += 1
            attrs: dict[str, Any] = {"config": cfg.to_dict(), "tuner_version": __version__, "backend": backend.name,
                                     "device": device_attr, **_measurement_attrs(m), "cached": cached,
                                     "measured": True}
            if m.ok and (m.median_us is None or not math.isfinite(m.median_us)):
                raise RuntimeError(f"backend {backend.name} reported success for {cfg.short()} without a time")
            if not m.ok:
                attrs.update(reason=m.reason, message=m.message)
            # A measurement is written whole: Ctrl-C here takes effect once the trial is stored.
            with _interrupts_deferred():
                if not cached:
                    store.save(device, chain.label, cfg, m)
                frozen = _finish(study, current, TrialState.COMPLETE if m.ok else TrialState.FAIL,
                                 m.median_us if m.ok else None, attrs)
                current = current_cfg = None
                outcome.new_trials += 1
                before = summary.baseline
                summary.add(frozen)
                if summary.baseline is not before:
                    study.set_user_attr("baseline_us", summary.baseline.value)
                    backend.set_reference_time(summary.baseline.value)
            if bar is not None:
                bar.update(1)
            _show(bar, summary, tag)
    except KeyboardInterrupt:
        outcome.stop = "interrupted"
        _requeue(study, current, current_cfg)
    except Exception as exc:
        # Not the config's fault (those come back as failed Measurements): close the trial, then let it surface.
        _requeue(study, current, None, f"the run stopped on {type(exc).__name__}: {exc}")
        raise
    finally:
        if bar is not None:
            bar.close()
        store.close()
    return outcome


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT back for the duration (main thread only); a Ctrl-C that came meanwhile is raised
    as KeyboardInterrupt on the way out, so the block is never left half done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _source_hasher(backend: Backend) -> Callable[[Chain, Config], str | None] | None:
    """How to get a config's kernel source hash before measuring it, so the cache can be asked first.

    A backend may offer ``source_hash(chain, config)``; a measuring backend otherwise
    renders the source. Without a hash (replays) the cache matches any source.
    """
    own = getattr(backend, "source_hash", None)
    if callable(own):
        return own
    if backend.replayed:
        return None
    from .render import render  # noqa: PLC0415 - only measuring backends render

    def rendered_hash(chain: Chain, config: Config) -> str | None:
        try:
            return render(chain, config).hash
        except Exception:  # a config the templates refuse fails in measure(), with its reason
            return None

    return rendered_hash


def _count_rejection(summary: TrialSummary) -> None:
    summary.rejected += 1
    summary.failures["constraint"] += 1


def _finish(study: Any, trial: Any, state: Any, value: float | None, attrs: Mapping[str, Any]) -> Any:
    """Store the attributes, tell the outcome, and return the finished trial as stored."""
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    return study.tell(trial, value, state=state, skip_if_finished=False)


def _decided(trial: Any) -> bool:
    """Whether a trial holds an outcome: a time, or a failure with its reason."""
    from optuna.trial import TrialState  # noqa: PLC0415

    return trial.state == TrialState.COMPLETE or (trial.state == TrialState.FAIL
                                                  and trial.user_attrs.get("reason") in FAIL_REASONS)


ABANDONED = "abandoned: the process running it stopped"


def _abandon_running(study: Any, fs: FeasibleSet, n_stages: int) -> int:
    """Close the trials a stopped process left RUNNING, and queue their feasible configs again.

    One process runs a study at a time, so a trial still RUNNING when a run starts was cut
    short (kill -9, a crash, a power cut) before its outcome was told. It is closed as FAIL
    without a reason, so it counts nowhere, even if the process had begun storing its outcome;
    a config it had measured is answered again by the measurement cache, not the device.
    Returns how many trials were closed.
    """
    import optuna  # noqa: PLC0415
    from optuna.trial import TrialState  # noqa: PLC0415

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        live = optuna.trial.Trial(study, t._trial_id)  # noqa: SLF001 - Optuna offers no public way to reopen a trial
        attrs: dict[str, Any] = {"abandoned": True, "message": ABANDONED}
        if "measured" in t.user_attrs:
            attrs["measured"] = False
        if "reason" in t.user_attrs:
            attrs["reason"] = None
        for k, v in attrs.items():
            live.set_user_attr(k, v)
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        cfg = trial_config(t, n_stages)
        if cfg is not None and fs.contains(cfg) is None:
            study.enqueue_trial(cfg.params())
    return len(stale)


def _requeue(study: Any, trial: Any, cfg: Config | None, why: str = "interrupted") -> None:
    """Close a trial cut short before it was measured; queue ``cfg`` again, so resuming measures it.

    The closed trial is FAIL without a ``reason``: it was not measured, so it counts nowhere.
    """
    from optuna.trial import TrialState  # noqa: PLC0415

    if trial is None:
        return
    try:
        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("message", f"{why} before it was measured; queued again")
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if cfg is not None:
            study.enqueue_trial(cfg.params())
    except (KeyboardInterrupt, Exception):  # best effort: a second Ctrl-C or a closed trial must not mask the first
        pass


def _measurement_attrs(m: Measurement) -> dict[str, Any]:
    return {"source_hash": m.source_hash, "compile_s": m.compile_s, "resources": m.resources, "error": m.error,
            "times_us": list(m.times_us), "replayed": m.replayed}


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm  # noqa: PLC0415

    # disable=None: draw only on a terminal, so logs and pipes get the summary lines alone.
    return tqdm(total=total, initial=initial, desc=desc, unit="trial", file=sys.stderr, dynamic_ncols=True,
                disable=None)


def _show(bar: Any, summary: TrialSummary, tag: str) -> None:
    if bar is None or summary.best_us is None:
        return
    text = f"best {summary.best_us:.2f} us{tag}"
    if summary.speedup is not None:
        text += f", {summary.speedup:.2f}x vs stream{tag}"
    bar.set_postfix_str(text)


def describe(outcome: StudyOutcome, tag: str = "") -> str:
    """One line summing up a study run, every figure labelled with ``tag``."""
    s = outcome.summary
    parts = [f"{outcome.label} on {outcome.device}:"]
    if s.best is None:
        parts.append("no successful trial yet")
    else:
        parts.append(f"best {s.best_us:.2f} us{tag}")
        if s.baseline_us is not None:
            parts.append(f"stream baseline {s.baseline_us:.2f} us{tag}, speedup {s.speedup:.2f}x{tag}")
    parts.append(f"{s.measured} trials measured ({outcome.new_trials} new, {outcome.cache_hits} from the cache), "
                 f"{s.rejected} infeasible suggestions refused")
    line = ", ".join([parts[0] + " " + parts[1], *parts[2:]])
    notes = {"timeout": "stopped by --timeout", "exhausted": f"all {outcome.feasible} feasible configs tried",
             "rejections": f"stopped after {outcome.new_rejected} infeasible suggestions in this run; "
                           "--sampler random draws feasible configs only"}
    if outcome.stop in notes:
        line += f" [{notes[outcome.stop]}]"
    return line
