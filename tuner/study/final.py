"""The final rounds: the fastest configs of each kind of sync, timed again in interleaved rounds."""
from __future__ import annotations

import time
from statistics import median
from typing import Any, Callable, Sequence

from .. import __version__
from ..backends.base import Backend
from ..chain.workloads import Chain
from ..config import Config
from ..storage.claims import ClaimBoard
from ..storage.trials import (
    FINALISTS,
    TrialBook,
)
from .outcome import StudyOutcome

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
