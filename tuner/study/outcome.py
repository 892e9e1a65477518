"""How a study run ended, and how that is shown: a progress bar while it runs, lines and a table after."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..backends.base import Backend
from ..config import Config
from ..search.strategies import DEFAULT as DEFAULT_STRATEGY
from ..storage.trials import (
    TrialSummary,
)


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
