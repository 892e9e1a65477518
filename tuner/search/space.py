"""Search spaces: which tilings and sync choices to try.

A search space file (TOML) lists candidate values per knob. Most combinations are impossible (a
warp grid that does not divide the tile, too much shared memory, a sync policy whose wait formula
needs aligned tiles, ...): :mod:`tuner.search.constraints` defines those hard constraints, and
:meth:`SearchSpace.feasible` solves them for one chain and device (:mod:`tuner.search.feasible`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import UsageError
from ..chain.tiling import TILE_LIMITS, TILE_SWITCHES, fitted_heights
from ..chain.workloads import Chain
from ..config import GLOBAL_CHOICES, GLOBAL_DEFAULTS, TILE_CHOICES, TILE_DEFAULTS, TILE_FIELDS
from ..device import DeviceInfo
from ..tomlfile import did_you_mean, read_toml
from .constraints import Limits
from .feasible import FeasibleSet


class SpaceError(UsageError):
    """A search space file is malformed, or leaves nothing feasible."""


# What a space file that leaves a key out searches: every value, but a field with a default
# (one added later, opt-in) only that.
DEFAULT_GLOBALS: dict[str, tuple[str, ...]] = {**GLOBAL_CHOICES, **{f: (v,) for f, v in GLOBAL_DEFAULTS.items()}}
TABLES = ("stage", "global", "limits")
# Keys of a [stage] table that derive tile values from the stage's shape rather than list them.
# bm_fit: also the tile heights that cut the stage's M into each of these counts of tiles of whole
# 8-row groups, where no listed height does as well (tiling.fitted_heights), for the tiles whose
# rows may be any multiple of 8.
FIT_KEY = "bm_fit"
STAGE_KEYS = TILE_FIELDS + (FIT_KEY,)


LIMIT_KEYS = tuple(Limits.__dataclass_fields__)


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values for every knob; ``overrides`` replaces some of them for named stages."""

    stage: Mapping[str, tuple[Any, ...]]
    overrides: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    globals: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_GLOBALS))
    limits: Limits = Limits()
    source: str = "<search space>"
    fits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # bm_fit: "" for [stage], else per stage

    def stage_domain(self, stage_name: str, m: int | None = None) -> dict[str, tuple[Any, ...]]:
        """Candidate values of each tile field for one stage; given the stage's ``m``, the listed
        heights and those that ``bm_fit`` derives from it, in ascending order."""
        dom = {**self.stage, **self.overrides.get(stage_name, {})}
        parts = self.fits.get(stage_name, self.fits.get("", ()))
        if m is not None and parts:
            dom["bm"] = tuple(sorted(set(dom["bm"]) | set(fitted_heights(m, parts, dom["bm"]))))
        return dom

    def feasible(self, chain: Chain, device: DeviceInfo) -> FeasibleSet:
        """Every config of this space that can run on ``device`` for ``chain``."""
        names = [s.name for s in chain.stages]
        for name in self.overrides:
            if name not in names:
                raise SpaceError(f"{self.source}: [stage.{name}] names no stage of {chain.workload}"
                                 f"{did_you_mean(name, names)}; stages: {', '.join(names)}")
        return FeasibleSet(chain, device, self)


def _int_list(value: Any, where: str, source: str) -> tuple[int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: a positive integer or a non-empty list of them")
    if len(set(items)) != len(items):
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: a list without repeated values")
    return tuple(items)


def _choice_list(value: Any, where: str, accepted: Sequence[str], source: str) -> tuple[str, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in items if v not in accepted]
    if not items or bad or len(set(items)) != len(items):
        what = f"{bad[0]!r} is not one of them" if bad else "a non-empty list without repeated values"
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: {', '.join(accepted)} ({what})")
    return tuple(items)


def _fit_list(value: Any, where: str, source: str) -> tuple[int, ...]:
    """``bm_fit``: tile counts, or an empty list (none: a [stage.NAME] table turning [stage]'s off)."""
    return () if value == [] else _int_list(value, where, source)


def _switch_list(value: Any, where: str, key: str, source: str) -> tuple[int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    values = TILE_SWITCHES[key]
    if not items or any(v not in values or isinstance(v, bool) for v in items) or len(set(items)) != len(items):
        accepted = ", ".join(f"{v} ({what})" for v, what in values.items())
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: {accepted}, or a list of them without repeats")
    return tuple(items)


def _tile_list(value: Any, where: str, key: str, source: str) -> tuple[Any, ...]:
    if key in TILE_CHOICES:
        return _choice_list(value, where, TILE_CHOICES[key], source)
    if key in TILE_SWITCHES:
        return _switch_list(value, where, key, source)
    items = _int_list(value, where, source)
    least, most = TILE_LIMITS[key]
    if not all(least <= v <= most for v in items):
        raise SpaceError(f"{source}: {where} = {value!r}: accepted: integers from {least} to {most}")
    return items


def _unknown(key: str, where: str, valid: Sequence[str], source: str) -> SpaceError:
    return SpaceError(f"{source}: unknown key {where}{did_you_mean(key, valid)}; accepted: {', '.join(valid)}")


def parse_space(data: Mapping[str, Any], source: str = "<search space>") -> SearchSpace:
    """Validate a search space given as a mapping (the parsed TOML); ``source`` names it in errors."""
    for key in data:
        if key not in TABLES:
            raise _unknown(key, repr(key), TABLES, source)
        if not isinstance(data[key], dict):
            raise SpaceError(f"{source}: {key} must be a table ([{key}])")
    raw_stage = data.get("stage")
    if raw_stage is None:
        raise SpaceError(f"{source}: missing table [stage]; it lists {', '.join(TILE_FIELDS)}")
    stage: dict[str, tuple[Any, ...]] = {}
    overrides: dict[str, dict[str, tuple[Any, ...]]] = {}
    fits: dict[str, tuple[int, ...]] = {}
    for key, value in raw_stage.items():
        if isinstance(value, dict):
            sub = {}
            for k, v in value.items():
                if k == FIT_KEY:
                    fits[key] = _fit_list(v, f"stage.{key}.{k}", source)
                elif k in TILE_FIELDS:
                    sub[k] = _tile_list(v, f"stage.{key}.{k}", k, source)
                else:
                    raise _unknown(k, f"stage.{key}.{k}", STAGE_KEYS, source)
            overrides[key] = sub
        elif key == FIT_KEY:
            fits[""] = _fit_list(value, f"stage.{key}", source)
        elif key in TILE_FIELDS:
            stage[key] = _tile_list(value, f"stage.{key}", key, source)
        else:
            raise _unknown(key, f"stage.{key}", STAGE_KEYS, source)
    for key, value in TILE_DEFAULTS.items():
        stage.setdefault(key, (value,))
    missing = [f for f in TILE_FIELDS if f not in stage]
    if missing:
        defaults = ", ".join(f"{k} to {v}" for k, v in TILE_DEFAULTS.items())
        raise SpaceError(f"{source}: [stage] lacks {', '.join(missing)}; it must list every one of "
                         f"{', '.join(TILE_FIELDS)} ({defaults} by default)")
    globals_ = dict(DEFAULT_GLOBALS)
    for key, value in data.get("global", {}).items():
        if key not in GLOBAL_CHOICES:
            raise _unknown(key, f"global.{key}", tuple(GLOBAL_CHOICES), source)
        globals_[key] = _choice_list(value, f"global.{key}", GLOBAL_CHOICES[key], source)
    limits = {}
    for key, value in data.get("limits", {}).items():
        if key not in LIMIT_KEYS:
            raise _unknown(key, f"limits.{key}", LIMIT_KEYS, source)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpaceError(f"{source}: limits.{key} = {value!r}: accepted: a positive integer")
        limits[key] = value
    return SearchSpace(stage, overrides, globals_, Limits(**limits), source, fits)


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search space TOML file."""
    path = Path(path)
    data = read_toml(path, "search space", SpaceError)
    return parse_space(data, str(path))
