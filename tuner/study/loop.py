"""Study files and the tuning loop: one Optuna study per (workload, size, device).

A search strategy (:mod:`tuner.search.strategies`) proposes batches of feasible measurements; the
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
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from .. import __version__
from ..backends.base import Backend
from ..chain.workloads import Chain
from ..config import GLOBAL_FIELDS, TILE_FIELDS, Config, ConfigError
from ..search.feasible import FeasibleSet
from ..search.space import SearchSpace
from ..search.strategies import DEFAULT as DEFAULT_STRATEGY
from ..search.strategies import (
    STAGE_ALONE,
    STRATEGIES,
    Outcome,
    Prior,
    Proposal,
    SearchContext,
    stage_config,
)
from ..search.strategies import make as make_strategy
from ..storage.claims import ClaimBoard
from ..storage.database import open_optuna_storage
from ..storage.measurements import MeasurementStore
from ..storage.trials import (
    StudyError,
    TrialBook,
    measurement_attrs,
    stage_study_name,
    study_name,
    transfer_candidates,
)
from .final import _final_rounds
from .outcome import StudyOutcome, _progress_bar, _show, figure_tag
from .spec import default_trials

Checker = Callable[[Chain, Config], "str | None"]


CLAIM_GRACE_S = 10.0  # a worker silent this long is taken for dead: its claims go to the others


WAIT_NOTE_S = 5.0  # while a worker waits on another's claims, a line says so this often


PROGRESS_S = 30.0  # without a terminal (a log, a worker of --gpus), a progress line this often


POLL_S = 0.2  # how often a worker looks for the trials of configs another worker is measuring


def load_checker(backend: Backend) -> Checker | None:
    """The sync-protocol checker; without it, only replayed figures may be produced."""
    try:
        from ..checker.checks import check  # noqa: PLC0415 - imported when a study runs
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("tuner.checker"):
            raise
        if backend.replayed:
            return None
        raise StudyError("the sync-protocol checker (tuner.checker) is not installed; a GPU study would run "
                         "unchecked protocols that may deadlock; accepted: --backend replay") from None
    return check


def _stage_domains(fs: FeasibleSet, j: int) -> dict[str, list]:
    """The parameters of stage ``j``'s study: its tile fields, the sync choice fixed."""
    order = fs.param_order()
    name = fs.stage_names[j]
    out = {f"{name}.{f}": order[f"{name}.{f}"] for f in TILE_FIELDS}
    out.update({f: [v] for f, v in zip(GLOBAL_FIELDS, STAGE_ALONE)})
    return out


def run_study(chain: Chain, space: SearchSpace, backend: Backend, storage: str, *, strategy: str = DEFAULT_STRATEGY,
              seed: int = 0, trials: int | None = None, timeout: float | None = None, check: Checker | None = None,
              progress: bool = False, warm: Sequence[Config] = (), transfer: bool = True, final: bool = True,
              log: Callable[[str], Any] | None = None, claim_grace_s: float = CLAIM_GRACE_S,
              sustained_s: float = 0.0) -> StudyOutcome:
    """Tune ``chain`` until its studies hold ``trials`` measured trials, time runs out or the strategy is done.

    ``check`` is the sync-protocol checker (default: :func:`tuner.checker.checks.check`). ``warm`` are
    configs known to be good (a bench's picks), measured first where the space holds them;
    with ``transfer`` the best configs of the nearest sizes in the storage join them. With
    ``final`` and a measuring backend, the fastest few of each kind are timed again in
    interleaved rounds, whose medians give the study's best (with ``sustained_s``, each timing
    right after that many seconds of the config's own runs, not after idle). Ctrl-C ends the run cleanly:
    what was measured is stored and the outcome says ``stop == "interrupted"``.

    Several workers may run the same study on one storage: each config and each of the
    ``trials`` budget slots is claimed before it is measured (:class:`tuner.storage.measurements.ClaimBoard`),
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
                              chain.stage_names, common)
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
                                   _stage_domains(self.fs, j), (st.name,),
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
    from ..codegen.render import render  # noqa: PLC0415 - only measuring backends render

    def rendered_hash(chain: Chain, config: Config) -> str | None:
        try:
            return render(chain, config, device_epoch=backend.graphs).hash
        except Exception:  # a config the templates refuse fails in measure(), with its reason
            return None

    return rendered_hash
