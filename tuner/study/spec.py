"""Study files: what to tune (a workload, its sizes, a search space, a strategy and its budget)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..chain.workloads import Chain, WorkloadError, get_workload, integer_from
from ..paths import home
from ..search.strategies import DEFAULT as DEFAULT_STRATEGY
from ..search.strategies import (
    STRATEGIES,
)
from ..storage.trials import (
    StudyError,
)
from ..tomlfile import did_you_mean, read_toml

STUDY_KEYS = ("workload", "sizes", "space", "strategy", "seed", "trials", "timeout")


# The budget of one size by default: the staged search's stage pass, chain pass and refinement
# take about two minutes at this size on the H200; the others measure whole chains only.
DEFAULT_TRIALS = {"staged": 400}


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


def default_trials(strategy: str) -> int:
    """The budget of one size when neither the command line nor the study file sets one."""
    return DEFAULT_TRIALS.get(strategy, 100)
