"""Study files and the tuning loop: one Optuna study per (workload, size, device).

A search strategy (:mod:`tuner.strategies`) proposes batches of feasible measurements; the
loop answers each from the study's history, the measurement cache or the backend, writes
it as a trial the moment it is known (stages timed alone go to studies of their own), and
tells the strategy. An interrupted study loses nothing that was measured. The budget is the
number of measured trials, stage studies included: rerunning the same command measures
nothing new, raising ``--trials`` continues where the study stopped.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Callable, Iterator, Mapping, Sequence

from . import UsageError, __version__
from .backends.base import Backend
from .config import GLOBAL_FIELDS, TILE_FIELDS, Config, ConfigError
from .paths import home
from .feasible import FeasibleSet
from .space import SearchSpace
from .store import ClaimBoard, MeasurementStore, open_optuna_storage
from .strategies import DEFAULT as DEFAULT_STRATEGY
from .strategies import STAGE_ALONE, STRATEGIES, Outcome, Prior, Proposal, SearchContext, stage_config
from .strategies import make as make_strategy
from .tomlfile import did_you_mean, read_toml
from .trials import (FINALISTS, StudyError, TrialBook, TrialSummary, is_stream, measurement_attrs, stage_study_name,  # noqa: F401
                     study_name, summarize, transfer_candidates, trial_config)
from .workloads import Chain, WorkloadError, get_workload, integer_from

STUDY_KEYS = ("workload", "sizes", "space", "strategy", "seed", "trials", "timeout")
# The budget of one size by default: the staged search's stage pass, chain pass and refinement
# take about two minutes at this size on the H200; the others measure whole chains only.
DEFAULT_TRIALS = {"staged": 400}

Checker = Callable[[Chain, Config], "str | None"]
CLAIM_GRACE_S = 10.0  # a worker silent this long is taken for dead: its claims go to the others
WAIT_NOTE_S = 5.0  # while a worker waits on another's claims, a line says so this often
PROGRESS_S = 30.0  # without a terminal (a log, a worker of --gpus), a progress line this often
POLL_S = 0.2  # how often a worker looks for the trials of configs another worker is measuring


# ---------------------------------------------------------------------------
# Study files


@dataclass(frozen=True)
class StudySpec:
    """What to tune: a workload, the sizes to sweep, the search space and the strategy's settings."""

    workload: str
    sizes: Mapping[str, tuple[int, ...]]  # empty: the workload's built-in sizes
    space: Path
    strategy: str = DEFAULT_STRATEGY
    seed: int = 0
    trials: int | None = None  # None: the strategy's default (see DEFAULT_TRIALS)
    timeout: float | None = None
    source: str = "<defaults>"

    def chains(self) -> list[Chain]:
        """One chain per combination of the listed sizes (or per built-in size)."""
        wl = get_workload(self.workload)
        return [wl.chain(**size) for size in wl.requested_sizes({}, self.sizes or None)]


def _positive_int(value: Any, where: str, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise StudyError(f"{where} = {value!r}: accepted: {integer_from(least)}")
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
    sizes: dict[str, tuple[int, ...]] = {}
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
        try:
            sizes[key] = tuple(wl.size_param(key).check(v, wl.name) for v in items)
        except WorkloadError as exc:
            raise StudyError(f"{source}: sizes.{key}: {exc}") from None
    if sizes and wl.sweep_param not in sizes:
        sizes[wl.sweep_param] = wl.sweep
    strategy = data.get("strategy", DEFAULT_STRATEGY)
    if strategy not in STRATEGIES:
        raise StudyError(f"{source}: strategy = {strategy!r}: accepted: {', '.join(STRATEGIES)}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise StudyError(f"{source}: seed = {seed!r}: accepted: a non-negative integer")
    timeout = data.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise StudyError(f"{source}: timeout = {timeout!r}: accepted: a positive number of seconds")
    space = data.get("space", f"search_spaces/{wl.name}.toml")
    if not isinstance(space, str):
        raise StudyError(f"{source}: space = {space!r}: accepted: the path of a search space file")
    trials = data.get("trials")
    return StudySpec(wl.name, sizes, resolve_path(space, beside), strategy, seed,
                     None if trials is None else _positive_int(trials, f"{source}: trials"),
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
# The tuning loop


@dataclass
class StudyOutcome:
    """How one study run ended."""

    name: str
    label: str
    device: str
    feasible: int
    summary: TrialSummary
    strategy: str = DEFAULT_STRATEGY
    new_trials: int = 0  # measured in this run, stage studies included
    stage_trials: int = 0  # measured trials of the stage studies, in total
    cache_hits: int = 0
    refused: int = 0  # proposals the loop refused (a strategy bug if ever non-zero); never stored
    elapsed_s: float = 0.0
    stop: str = "budget"  # budget, timeout, exhausted or interrupted
    budget: int = 0
    replayed: bool = False
    synthetic: bool = False
    finalists: dict[str, float] = field(default_factory=dict)  # config short -> median of the final rounds

    @property
    def interrupted(self) -> bool:
        return self.stop == "interrupted"

    @property
    def measured(self) -> int:
        """Measured trials counted against the budget: the chain's and its stages' alone."""
        return self.summary.measured + self.stage_trials

    @property
    def trials_per_min(self) -> float | None:
        return self.new_trials / self.elapsed_s * 60 if self.new_trials and self.elapsed_s > 0 else None


def figure_tag(backend: Backend) -> str:
    """The label every figure from ``backend`` carries."""
    if backend.synthetic:
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


def default_trials(strategy: str) -> int:
    """The budget of one size when neither the command line nor the study file sets one."""
    return DEFAULT_TRIALS.get(strategy, 100)


def _stage_domains(fs: FeasibleSet, j: int) -> dict[str, list]:
    """The parameters of stage ``j``'s study: its tile fields as ``gemm1.*``, the sync choice fixed."""
    order = fs.param_order()
    out = {f"gemm1.{f}": order[f"gemm{j + 1}.{f}"] for f in TILE_FIELDS}
    out.update({f: [v] for f, v in zip(GLOBAL_FIELDS, STAGE_ALONE)})
    return out


def run_study(chain: Chain, space: SearchSpace, backend: Backend, storage: str, *, strategy: str = DEFAULT_STRATEGY,
              seed: int = 0, trials: int | None = None, timeout: float | None = None, check: Checker | None = None,
              progress: bool = False, warm: Sequence[Config] = (), transfer: bool = True, final: bool = True,
              log: Callable[[str], Any] | None = None, claim_grace_s: float = CLAIM_GRACE_S,
              sustained_s: float = 0.0) -> StudyOutcome:
    """Tune ``chain`` until its studies hold ``trials`` measured trials, time runs out or the strategy is done.

    ``check`` is the sync-protocol checker (default: :func:`tuner.checker.check`). ``warm`` are
    configs known to be good (a bench's picks), measured first where the space holds them;
    with ``transfer`` the best configs of the nearest sizes in the storage join them. With
    ``final`` and a measuring backend, the fastest few of each kind are timed again in
    interleaved rounds, whose medians give the study's best (with ``sustained_s``, each timing
    right after that many seconds of the config's own runs, not after idle). Ctrl-C ends the run cleanly:
    what was measured is stored and the outcome says ``stop == "interrupted"``.

    Several workers may run the same study on one storage: each config and each of the
    ``trials`` budget slots is claimed before it is measured (:class:`tuner.store.ClaimBoard`),
    and a worker's claims are taken over by the others ``claim_grace_s`` after its last heartbeat.
    """
    if strategy not in STRATEGIES:
        raise StudyError(f"unknown strategy {strategy!r}; accepted: {', '.join(STRATEGIES)}")
    run = _StudyRun(chain, space, backend, storage, strategy, seed, trials or default_trials(strategy), check,
                    claim_grace_s, log)
    run.open(warm, transfer, progress)
    outcome = run.outcome
    try:
        run.loop(time.monotonic() + timeout if timeout else None)
    except KeyboardInterrupt:
        outcome.stop = "interrupted"
    finally:
        run.close_progress()
    try:
        if final and not outcome.interrupted and backend.supports("time_rounds") and not backend.replayed:
            _final_rounds(run.book, backend, chain, outcome, log, run.board, sustained_s)
    except KeyboardInterrupt:
        outcome.stop = "interrupted"
    finally:
        run.board.close()
    outcome.summary = run.book.summary
    outcome.elapsed_s = time.monotonic() - run.t_start
    return outcome


class _StudyRun:
    """One run of the tuning loop over a chain's studies: what :func:`run_study` sets up, then its
    loop of proposals, claims, measurements and trials."""

    def __init__(self, chain: Chain, space: SearchSpace, backend: Backend, storage: str, strategy: str, seed: int,
                 trials: int, check: Checker | None, claim_grace_s: float, log: Callable[[str], Any] | None):
        import optuna  # noqa: PLC0415 - slow import

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.chain, self.backend, self.strategy, self.seed, self.trials = chain, backend, strategy, seed, trials
        self.log, self.claim_grace_s = log, claim_grace_s
        self.device = backend.device_info()
        fs = space.feasible(chain, self.device)
        narrowed = backend.restrict(chain, fs)
        self.fs = fs.restricted_to(narrowed) if narrowed is not None else fs
        self.tag = figure_tag(backend)
        if self.fs.size == 0:
            raise StudyError(f"no feasible config for {chain.label} on {self.device.name}{self.tag}: "
                             f"{'; '.join(self.fs.reasons)}")
        self.check = check if check is not None else load_checker(backend)
        self.verdicts: dict[Config, str | None] = {}
        self.strat = make_strategy(strategy)
        self.store = MeasurementStore(storage)
        self.rdb = open_optuna_storage(storage)
        self.board = ClaimBoard(storage, beat_s=min(2.0, claim_grace_s / 4), grace_s=claim_grace_s)
        self.alone = [chain.alone(j) for j in range(len(chain.stages))]

    # -- setting up

    def open(self, warm: Sequence[Config], transfer: bool, progress: bool) -> None:
        """The studies in the storage, the strategy started on what they and the prior hold, the bar drawn."""
        chain, backend, fs = self.chain, self.backend, self.fs
        common = {"workload": chain.workload, "size": chain.size_dict, "label": chain.label,
                  "device": self.device.name, "backend": backend.name, "replayed": backend.replayed,
                  "synthetic": backend.synthetic, "graphs": backend.graphs}
        self.book = TrialBook(self.rdb, study_name(chain, self.device, backend.graphs), fs.param_order(),
                              len(chain.stages), common)
        self.stage_books, self.stage_tilings = self._stage_books(common)
        self.outcome = StudyOutcome(self.book.name, chain.label, self.device.name, fs.size, self.book.summary,
                                    strategy=self.strategy, budget=self.trials, replayed=backend.replayed,
                                    synthetic=backend.synthetic)
        self.outcome.stage_trials = sum(b.summary.measured for b in self.stage_books)
        prior = Prior(chain=list(warm))
        if transfer:
            near_chain, near_stages = _transfer(self.book, self.rdb, chain, self.device)
            prior.chain += [c for c in near_chain if c not in prior.chain]
            prior.stages = near_stages
        fit = [c for c in warm if fs.contains(c) is None]
        if warm and self.log is not None:
            self.log(f"{chain.label}: warm start: {len(fit)} of {len(warm)} configs a bench picked are in this space"
                     + ("" if len(fit) == len(warm) else " (and recorded)" if backend.replayed else ""))
        self.strat.start(SearchContext(chain, fs, self.device, self.accept, self.trials, self.seed, prior,
                                       self.stage_tilings))
        if self.book.summary.baseline is not None:
            backend.set_reference_time(self.book.summary.baseline.value)
        self.source_hash = _source_hasher(backend)
        self.device_attr = self.device.to_dict()
        self.budget_scope = f"budget/{self.book.scope}"
        self.t_start = time.monotonic()
        self.bar = _progress_bar(progress, self.trials, self.outcome.measured, chain.label + self.tag)
        self.show()

    def _stage_books(self, common: Mapping[str, Any]) -> tuple[list[TrialBook], list[list]]:
        """The studies of the stages timed alone, and the tilings of each that may be timed."""
        books: list[TrialBook] = []
        tilings: list[list] = []
        if not self.strat.stage_pass:
            return books, tilings
        for j, st in enumerate(self.chain.stages):
            books.append(TrialBook(self.rdb, stage_study_name(self.chain, j, self.device, self.backend.graphs),
                                   _stage_domains(self.fs, j), 1,
                                   {**common, "stage": st.name, "stage_shape": [st.m, st.n, st.k, st.epilogue]}))
            grids = self.fs.tilings[j]
            recorded = self.backend.restrict(self.alone[j], [stage_config(g.tiles) for g in grids])
            if recorded is not None:
                keep = {c.tiles[0] for c in recorded}
                grids = [g for g in grids if g.tiles in keep]
            tilings.append(grids)
        return books, tilings

    # -- what a proposal is

    def accept(self, c: Config) -> bool:
        """The sync checker's answer, asked once per config."""
        if self.check is None:
            return True
        if c not in self.verdicts:
            self.verdicts[c] = self.check(self.chain, c)
        return self.verdicts[c] is None

    def book_of(self, p: Proposal) -> TrialBook:
        return self.book if p.stage is None else self.stage_books[p.stage]

    def refusal(self, p: Proposal) -> str | None:
        if p.stage is None:
            why = self.fs.contains(p.config)
            return why if why is not None else (None if self.accept(p.config)
                                                else f"sync_checker: {self.verdicts[p.config]}")
        if p.stage >= len(self.stage_tilings) or p.tiles not in {g.tiles for g in self.stage_tilings[p.stage]}:
            return f"stage {p.stage}: tiling outside the feasible (or recorded) set"
        return None

    def claim_key(self, p: Proposal) -> tuple[str, str]:
        digest = hashlib.sha256(json.dumps(p.config.to_dict(), sort_keys=True).encode()).hexdigest()[:40]
        return self.book_of(p).scope, digest

    def known(self, p: Proposal) -> Outcome | None:
        hit = self.book_of(p).known.get(p.config)
        return None if hit is None else Outcome(p, hit[0], hit[1], new=False)

    # -- progress

    def count(self) -> None:
        self.outcome.stage_trials = sum(b.summary.measured for b in self.stage_books)
        bar = self.bar
        if bar is not None and bar.n != min(self.outcome.measured, bar.total):
            bar.n = min(self.outcome.measured, bar.total)
            bar.refresh()

    def show(self) -> None:
        _show(self.bar, self.book.summary, self.tag, self.strat.phase())

    def so_far(self) -> str:
        best = self.book.summary.best_us
        return f"{time.monotonic() - self.t_start:.0f} s" + ("" if best is None else f", best {best:.2f} us{self.tag}")

    def close_progress(self) -> None:
        if self.bar is not None:
            if self.outcome.stop == "exhausted":  # the bar ends full at what could be reached, not frozen short
                self.bar.total = self.bar.n
                self.bar.refresh()
            self.bar.close()
        self.store.close()

    # -- claims and measurements

    def claim(self, p: Proposal) -> Outcome | str | None:
        """The config for this worker with a budget slot (the slot), or its outcome where another worker
        wrote it meanwhile; None when a live worker holds it, or when the budget is spent."""
        board = self.board
        if not board.take(*self.claim_key(p)):
            return None
        self.book_of(p).refresh()
        hit = self.known(p)
        if hit is not None:
            board.drop(*self.claim_key(p))
            return hit
        # One slot per measured trial, so workers together measure exactly the budget. Slots are
        # tried in order, a dead worker's too: skipping it would leave the study one trial short.
        for k in board.open_items(self.budget_scope, (str(k) for k in range(1, self.trials + 1))):
            if board.take(self.budget_scope, k):
                return k
        board.drop(*self.claim_key(p))
        return None

    def measure(self, p: Proposal, slot: str) -> Outcome:
        backend, device, outcome, book = self.backend, self.device, self.outcome, self.book
        target = self.chain if p.stage is None else self.alone[p.stage]
        sh = self.source_hash(target, p.config) if self.source_hash is not None else None
        m = self.store.lookup(device, target.label, p.config, replayed=backend.replayed, source_hash=sh)
        cached = m is not None
        if m is None:
            screen = p.screen and backend.supports("screens")
            m = backend.measure(target, p.config, screen=True) if screen else backend.measure(target, p.config)
        else:
            outcome.cache_hits += 1
        if m.ok and (m.median_us is None or not math.isfinite(m.median_us)):
            raise RuntimeError(f"backend {backend.name} reported success for {p.config.short()} without a time")
        attrs: dict[str, Any] = {"config": p.config.to_dict(), "tuner_version": __version__,
                                 "backend": backend.name, "device": self.device_attr, **measurement_attrs(m),
                                 "cached": cached, "measured": True, "phase": p.phase, "screen": p.screen}
        if not m.ok:
            attrs.update(reason=m.reason, message=m.message)
        # A measurement is written whole: Ctrl-C here takes effect once the trial is stored.
        with _interrupts_deferred():
            if not cached:
                self.store.save(device, target.label, p.config, m)
            before = book.summary.baseline
            self.book_of(p).record(p.config, m.median_us if m.ok else None, attrs)
            self.board.done(*self.claim_key(p))
            self.board.done(self.budget_scope, slot)
            outcome.new_trials += 1
            self.count()
            if p.stage is None and book.summary.baseline is not before:
                book.study.set_user_attr("baseline_us", book.summary.baseline.value)
                backend.set_reference_time(book.summary.baseline.value)
        if self.bar is not None:
            self.bar.update(1)
        return Outcome(p, m.median_us if m.ok else None, None if m.ok else m.reason)

    # -- the loop

    def loop(self, deadline: float | None) -> None:
        """Batches from the strategy until the budget, the deadline or the strategy's plan runs out."""
        outcome, strat = self.outcome, self.strat
        phase_now = ""
        self.next_line = time.monotonic() + PROGRESS_S
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                outcome.stop = "timeout"
                return
            left = self.trials - outcome.measured
            batch = strat.propose(left)
            if not batch:
                outcome.stop = "exhausted" if left > 0 else "budget"
                return
            self.show()
            if strat.phase() != phase_now:
                phase_now = strat.phase()
                if self.log is not None:  # the bar is drawn on a terminal only; a log still shows the phases
                    self.log(f"{self.chain.label}: {phase_now} after {outcome.measured} trials, {self.so_far()}")
            results, new = self._answered(batch)
            stopped = self._measure_batch(batch, new[:max(left, 0)] if len(new) > left else new, results, deadline)
            strat.observe([results[i] for i in sorted(results)])
            if stopped:
                return
            if outcome.measured >= self.trials:
                outcome.stop = "budget"  # the strategy may have nothing left anyway: a rerun agrees either way
                return

    def _answered(self, batch: Sequence[Proposal]) -> tuple[dict[int, Outcome], list[int]]:
        """The outcomes the study's history gives (and the refusals), and the indices left to measure."""
        results: dict[int, Outcome] = {}
        new: list[int] = []
        for i, p in enumerate(batch):
            hit = self.book_of(p).known.get(p.config)
            if hit is not None:
                results[i] = Outcome(p, hit[0], hit[1], new=False)
                continue
            why = self.refusal(p)
            if why is not None:
                self.outcome.refused += 1
                if self.log is not None:
                    self.log(f"{self.chain.label}: {self.strategy} proposed a config the loop refuses ({why}); "
                             "not measured")
                results[i] = Outcome(p, None, "constraint", new=False)
                continue
            new.append(i)
        return results, new

    def _measure_batch(self, batch: Sequence[Proposal], new: list[int], results: dict[int, Outcome],
                       deadline: float | None) -> bool:
        """Measure the ``new`` proposals of ``batch`` into ``results``; True when the deadline stopped it.

        Each config is claimed just before it is measured: of several workers on one study, one
        measures it and the others take its trial from the storage, so workers running the same
        plan spread its configs between them. All are compiled ahead all the same."""
        theirs: list[int] = []
        targets = [(self.chain if batch[i].stage is None else self.alone[batch[i].stage], batch[i].config)
                   for i in new]
        for k in self.backend.prepare(targets):
            if deadline is not None and time.monotonic() >= deadline:
                self.outcome.stop = "timeout"
                return True
            i = new[k]
            got = self.claim(batch[i])
            if isinstance(got, Outcome):
                results[i] = got
            elif got is None:
                theirs.append(i)
            else:
                results[i] = self.measure(batch[i], got)
            self.show()
            if self.log is not None and (self.bar is None or self.bar.disable) and time.monotonic() >= self.next_line:
                self.next_line = time.monotonic() + PROGRESS_S
                self.log(f"{self.chain.label}: {self.outcome.measured}/{self.trials} trials, {self.strat.phase()}, "
                         f"{self.so_far()}")
        return self._wait_for_others(batch, theirs, results, deadline)

    def _wait_for_others(self, batch: Sequence[Proposal], theirs: list[int], results: dict[int, Outcome],
                         deadline: float | None) -> bool:
        """Wait for the configs other workers hold, saying so, taking over a dead worker's; True on the deadline."""
        next_note = time.monotonic()
        while theirs and self.outcome.measured < self.trials:
            if deadline is not None and time.monotonic() >= deadline:
                self.outcome.stop = "timeout"
                return True
            if self.log is not None and time.monotonic() >= next_note:
                next_note = time.monotonic() + WAIT_NOTE_S
                holders = [self.board.holder(*self.claim_key(batch[i])) for i in theirs]
                self.log(f"{self.chain.label}: {_waiting_note(holders, self.claim_grace_s)}")
            time.sleep(POLL_S)
            for b in (self.book, *self.stage_books):
                b.refresh()
            self.count()
            theirs = [i for i in theirs if not self._taken_up(batch[i], i, results)]
        return False

    def _taken_up(self, p: Proposal, i: int, results: dict[int, Outcome]) -> bool:
        """Whether ``p``, held by another worker, is settled now: its trial landed, or its claim came to us."""
        held = self.board.holder(*self.claim_key(p))
        if held is not None and held[1] and self.known(p) is None:
            # A claim is marked done only after its trial is written, so the trial may have
            # landed since the refresh: read again before calling the claim stale.
            self.book_of(p).refresh()
            if self.known(p) is None:
                self.board.forget_done(*self.claim_key(p))  # done, no such trial: the study was made anew
        got = self.known(p) or self.claim(p)  # a dead worker's claim goes to the next who asks
        if isinstance(got, Outcome):
            results[i] = got
        elif isinstance(got, str):
            results[i] = self.measure(p, got)
        else:
            return False
        return True


def _waiting_note(holders: Sequence[tuple[str, bool, float] | None], grace_s: float) -> str:
    """What a worker waits for: the configs other workers hold, whose, and when they are taken over."""
    live = [h for h in holders if h is not None and not h[1]]
    if not live:
        return f"waiting for the trials of {len(holders)} configs other workers just measured"
    owner, _, age = max(live, key=lambda h: h[2])
    owners = len({h[0] for h in live})
    return (f"waiting for {len(live)} configs that {owners} other worker{'s' if owners > 1 else ''} "
            f"measure{'' if owners > 1 else 's'} ({owner}, last heartbeat {age:.0f} s ago; taken over "
            f"{max(0.0, grace_s - age):.0f} s from now if it stays silent)")


def _transfer(book: TrialBook, rdb: Any, chain: Chain, device: Any) -> tuple[list[Config], list[list[Any]]]:
    """The nearest sizes' best configs and stage tilings, as this study first saw them.

    Kept in the study at its first run, so a rerun plans the same search (and measures nothing
    new) even where studies of other sizes were added to the storage meanwhile.
    """
    saved = book.study.user_attrs.get("transfer")
    if saved is not None:
        where = f"study {book.name!r}, its saved transfer candidates"
        if not isinstance(saved, dict) or not isinstance(saved.get("chain"), list) \
                or not isinstance(saved.get("stages"), list) or not all(isinstance(ds, list) for ds in saved["stages"]):
            raise ConfigError(f"{where}: expected lists of chain and stage configs")
        return ([Config.from_dict(d, where) for d in saved["chain"]],
                [[Config.from_dict(d, where).tiles[0] for d in ds] for ds in saved["stages"]])
    near_chain, near_stages = transfer_candidates(rdb, chain, device, graphs=book.study.user_attrs.get("graphs", False))
    book.study.set_user_attr("transfer", {"chain": [c.to_dict() for c in near_chain],
                                          "stages": [[stage_config(t).to_dict() for t in ts] for ts in near_stages]})
    return near_chain, near_stages


FINAL_PER_KIND = 3  # fastest configs of each kind of sync into the final rounds
FINAL_ROUNDS = 5
# Kinds of sync, reported apart: stream order (serial kernels), stream order with programmatic
# dependent launches, and tile-level policies.
SYNC_KINDS = ("stream", "pdl", "tile")


def sync_kind(cfg: Config) -> str:
    """``stream`` for serial stream sync, ``pdl`` for stream sync through programmatic dependent
    launches, ``tile`` for any tile-level policy."""
    if cfg.policy != "stream":
        return "tile"
    return "pdl" if cfg.launch == "pdl" else "stream"


def finalists(timed: Sequence[tuple[float, Config]], per_kind: int = FINAL_PER_KIND) -> list[Config]:
    """The fastest ``per_kind`` configs of each kind by their single timings (stream first)."""
    out: list[Config] = []
    for kind in SYNC_KINDS:
        mine = sorted(((us, c) for us, c in timed if sync_kind(c) == kind), key=lambda x: x[0])
        out += [c for _, c in mine[:per_kind] if c not in out]
    return out


def rounds_note(sources: int, what: str, rounds: int, sustained_s: float = 0.0) -> str:
    """What interleaved rounds of ``sources`` (``what`` they are) will do, for the log before they
    start; under sustained load, about how long they take."""
    each = (f"after {sustained_s:g} s of its own load (about {sources * rounds * sustained_s:.0f} s)"
            if sustained_s else "after idle")
    return f"{rounds} interleaved rounds of {sources} {what}, each timing {each}"


def _final_rounds(book: TrialBook, backend: Backend, chain: Chain, outcome: StudyOutcome,
                  log: Callable[[str], Any] | None, board: ClaimBoard, sustained_s: float = 0.0) -> None:
    """Time the finalists again in interleaved rounds after idle (with ``sustained_s``, each timing
    right after that many seconds of the same config's own runs) and store each one's median of rounds.

    Picking the fastest of many noisy timings favours the lucky, and sustained load lowers the
    clock, so the study's best is a finalist's median, all timed at the same clock: after idle, or
    at the clock the power cap leaves under each config's own load, where one that draws more
    power runs slower. A rerun with the same finalists and load adds nothing; under another load
    it times them again, and those rounds give the study's best.
    """
    timed = [(us, c) for c, (us, _) in book.known.items() if us is not None]
    contestants = finalists(timed)
    set_id = outcome.summary.measured
    if not contestants or all((c, set_id, sustained_s) in book.finals for c in contestants):
        return
    key = str(set_id) if not sustained_s else f"{set_id}@{sustained_s:g}s"
    if not board.take(f"finals/{book.scope}", key):
        return  # another worker times this set
    if log is not None:  # a minute or two of silence otherwise, under sustained load
        log(f"{chain.label}: final rounds: {rounds_note(len(contestants), 'finalists', FINAL_ROUNDS, sustained_s)}")
    t0 = time.monotonic()
    rounds = backend.time_rounds(chain, contestants, FINAL_ROUNDS, heat_s=sustained_s)
    if not rounds:
        if log is not None:
            log(f"{chain.label}: no final rounds: the backend gave no timing (the best is a single timing)")
        return
    if log is not None:
        log(f"{chain.label}: final rounds done in {time.monotonic() - t0:.0f} s")
    for c in contestants:
        got = rounds.get(c)
        if isinstance(got, str) or not got:
            if log is not None:
                log(f"{chain.label}: final rounds leave out {c.short()}: {got or 'no timing'}")
            continue
        value = round(median(got), 3)
        heat = {"sustained_s": sustained_s} if sustained_s else {}
        book.record(c, value, {"config": c.to_dict(), "phase": FINALISTS, "final_set": set_id, "rounds_us": got,
                               "measured": False, "tuner_version": __version__, "backend": backend.name, **heat})
        book.finals.add((c, set_id, sustained_s))
        outcome.finalists[c.short()] = value
    board.done(f"finals/{book.scope}", key)


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
    if backend.supports("source_hash"):
        return backend.source_hash  # type: ignore[attr-defined]
    if backend.replayed:
        return None
    from .render import render  # noqa: PLC0415 - only measuring backends render

    def rendered_hash(chain: Chain, config: Config) -> str | None:
        try:
            return render(chain, config, device_epoch=backend.graphs).hash
        except Exception:  # a config the templates refuse fails in measure(), with its reason
            return None

    return rendered_hash


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm  # noqa: PLC0415

    # disable=None: draw only on a terminal, so logs and pipes get the summary lines alone.
    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial", file=sys.stderr,
                dynamic_ncols=True, disable=None)


def _show(bar: Any, summary: TrialSummary, tag: str, phase: str) -> None:
    if bar is None:
        return
    text = phase
    if summary.best_us is not None:
        text += f", best {summary.best_us:.2f} us{tag}"
    if summary.speedup is not None:
        text += f", {summary.speedup:.2f}x vs stream{tag}"
    bar.set_postfix_str(text)


def outcome_table(outcomes: Sequence[StudyOutcome], sweep: str, tag: str = "",
                  library: Mapping[tuple[str, str], float] | None = None) -> str:
    """The sizes of one run side by side: the tuned chain against our stream order and, where a
    bench recorded it, PyTorch's best chain (timed in the process that made the recording)."""
    library = library or {}
    head = (sweep, "tuned us", "stream us", "x stream", "PyTorch us", "x PyTorch", "tuned config")
    rows = [head]
    for o in outcomes:
        s = o.summary
        lib = library.get((o.label, o.device))
        size = o.label.split("/", 1)[1].split(",")[0].split("=", 1)[1]
        rows.append((size, _us(s.best_us), _us(s.baseline_us), _x(s.speedup),
                     _us(lib), _x(lib / s.best_us if lib and s.best_us else None),
                     trial_config_short(s.best)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if 0 < i < 6 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    notes = []
    if tag:
        notes.append(f"every time{tag}")
    if library:
        notes.append("PyTorch's best: CUDA graph, cuBLASLt's fused epilogue where it applies, as the bench run "
                     "that made the recording timed it")
    return "\n".join(lines + ([f"({'; '.join(notes)})"] if notes else []))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def trial_config_short(trial: Any) -> str:
    """The short form of a trial's config, read from its checked attributes; "-" where there is none."""
    cfg = None if trial is None else trial.user_attrs.get("config")
    return "-" if cfg is None else Config.from_dict(cfg, f"trial {trial.number}").short()


def describe(outcome: StudyOutcome, tag: str = "") -> str:
    """One line summing up a study run, every figure labelled with ``tag``."""
    s = outcome.summary
    parts = [f"{outcome.label} on {outcome.device}:"]
    if s.best is None:
        parts.append("no successful trial yet")
    else:
        how = ("a single timing" if s.final_best is None else "median of the final rounds" if not s.final_sustained_s
               else f"median of the final rounds under {s.final_sustained_s:g} s of sustained load")
        parts.append(f"best {s.best_us:.2f} us{tag}, {how}")
        if s.baseline_us is not None:
            parts.append(f"stream baseline {s.baseline_us:.2f} us{tag}, speedup {s.speedup:.2f}x{tag}")
    stages = f", {outcome.stage_trials} of them stages alone" if outcome.stage_trials else ""
    parts.append(f"{outcome.measured} trials measured{stages} ({outcome.new_trials} new, "
                 f"{outcome.cache_hits} from the cache) by {outcome.strategy}")
    if outcome.trials_per_min is not None:
        parts.append(f"{outcome.trials_per_min:.0f} trials/min")
    line = ", ".join([parts[0] + " " + parts[1], *parts[2:]])
    notes = {"timeout": "stopped by --timeout",
             "exhausted": f"{outcome.strategy} had nothing left to try after {outcome.measured} of the "
                          f"{outcome.budget} trials asked for (of {outcome.feasible} feasible configs)"}
    if outcome.stop in notes:
        line += f" [{notes[outcome.stop]}]"
    return line
