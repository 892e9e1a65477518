"""A tuning configuration: a frozen value validated once, then trusted downstream.

``Config`` carries everything rendering needs. Its flat form (``params``) is what
Optuna sees: one named parameter per knob, a stage's prefixed by the stage's name
(``qkv.bm``, ``attn.bn``, ``conv2.split_k``) and the chain's bare (``policy``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from . import UsageError, shown
from .chain.tiling import (  # noqa: F401
    TILE_CHOICES,
    TILE_DEFAULTS,
    TILE_FIELDS,
    TILE_LIMITS,
    TILE_OMITTED_AT_DEFAULT,
    TILE_SWITCHES,
    WARPGROUP_MMAS,
    StageGrid,
    StageTiles,
    cdiv,
)
from .chain.workloads import Chain
from .sync.policies import DISPATCHES, LAUNCHES, ORDERS, POLICIES
from .sync.prefetch import PREFETCHES

GLOBAL_FIELDS = ("policy", "order", "dispatch", "launch", "prefetch")
# What a config recorded before a global field existed meant by it.
GLOBAL_DEFAULTS = {"prefetch": "none"}
# The names each global field accepts: everything that reads a config checks against these.
GLOBAL_CHOICES: dict[str, tuple[str, ...]] = {
    "policy": tuple(POLICIES),
    "order": tuple(ORDERS),
    "dispatch": tuple(DISPATCHES),
    "launch": tuple(LAUNCHES),
    "prefetch": PREFETCHES,
}
MAX_STAGES = 64  # stages of one chain a config may tile: a stored list longer than this is refused


def legacy_names(n_stages: int) -> tuple[str, ...]:
    """The stage prefixes of parameters stored before they were named by stage: ``gemm1``, ``gemm2``, ...
    whatever the stage's kind (and ``gemm1`` for any stage timed alone)."""
    return tuple(f"gemm{i + 1}" for i in range(n_stages))


def renamed(params: Mapping[str, Any], names: Sequence[str], to: Sequence[str]) -> dict[str, Any]:
    """``params`` with each stage prefix of ``names`` replaced by its counterpart in ``to``."""
    new = dict(zip(names, to))
    out = {}
    for key, value in params.items():
        prefix, dot, field = key.partition(".")
        out[f"{new.get(prefix, prefix)}.{field}" if dot else key] = value
    return out


class ConfigError(UsageError):
    """A config read from outside (a storage, a bundle, a summary file) is not one this version can run."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def field_value(name: str, value: Any, where: str = "config") -> Any:
    """``value`` for the config field ``name`` (a tile field or a global one), checked against
    the field's type and the values it accepts; anything else is a :class:`ConfigError` naming
    ``where``. Never coerces: a stored ``"12"`` or ``12.5`` for a count is refused, not read as 12."""
    choices = GLOBAL_CHOICES.get(name) or TILE_CHOICES.get(name)
    if choices is not None:
        if isinstance(value, str) and value in choices:
            return value
        accepted = ", ".join(choices)
    elif name in TILE_SWITCHES:
        if _is_int(value) and value in TILE_SWITCHES[name]:
            return value
        accepted = ", ".join(map(str, TILE_SWITCHES[name]))
    elif name in TILE_LIMITS:
        least, most = TILE_LIMITS[name]
        if _is_int(value) and least <= value <= most:
            return value
        accepted = f"an integer from {least} to {most}"
    else:
        raise ConfigError(f"{where}: unknown field {name!r}; accepted: {', '.join(TILE_FIELDS + GLOBAL_FIELDS)}")
    raise ConfigError(f"{where}: {name} = {shown(value)}: accepted: {accepted}")


@dataclass(frozen=True)
class Config:
    """One point of the search space."""

    tiles: tuple[StageTiles, ...]
    policy: str
    order: str
    dispatch: str
    launch: str
    prefetch: str = "none"  # see tuner.sync.prefetch

    def params(self, names: Sequence[str]) -> dict[str, Any]:
        """Flat parameter dict, stage knobs prefixed by the stage's name in ``names`` (``attn.bm``)."""
        if len(names) != len(self.tiles):
            raise ValueError(f"{len(names)} stage names for a config of {len(self.tiles)} stages")
        out: dict[str, Any] = {}
        for name, t in zip(names, self.tiles):
            for f in TILE_FIELDS:
                out[f"{name}.{f}"] = getattr(t, f)
        for f in GLOBAL_FIELDS:
            out[f] = getattr(self, f)
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, Any], names: Sequence[str], where: str = "config") -> "Config":
        """The config of Optuna's flat ``params`` for stages named ``names``, every value checked
        (:func:`field_value`); a tile field left out takes its default where it has one (records
        made before it existed). A stage none of whose knobs carries its name is read under its
        :func:`legacy_names` prefix, so studies stored before stages named their knobs still load."""
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where}: expected a mapping of parameters, got {type(params).__name__}")
        if not 1 <= len(names) <= MAX_STAGES:
            raise ConfigError(f"{where}: {len(names)} stages: accepted: 1 to {MAX_STAGES}")
        tiles = []
        for name, old in zip(names, legacy_names(len(names))):
            prefix = name if any(f"{name}.{f}" in params for f in TILE_FIELDS) else old
            tiles.append(_tiles({f: params[k] for f in TILE_FIELDS if (k := f"{prefix}.{f}") in params},
                                f"{where}: {prefix}"))
        return cls(tuple(tiles), *_globals(params, where))

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON data; a global field at its default is left out, and so is a tile
        field of :data:`TILE_OMITTED_AT_DEFAULT`, so a config keeps the form (and the storage key)
        it had before the field existed."""
        return {"tiles": [{k: v for k, v in asdict(t).items()
                           if not (k in TILE_OMITTED_AT_DEFAULT and v == TILE_DEFAULTS[k])} for t in self.tiles],
                **{f: getattr(self, f) for f in GLOBAL_FIELDS if GLOBAL_DEFAULTS.get(f) != getattr(self, f)}}

    @classmethod
    def from_dict(cls, d: Any, where: str = "config") -> "Config":
        """The config of its JSON form (:meth:`to_dict`), every value checked (:func:`field_value`)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("tiles"), list):
            raise ConfigError(f"{where}: expected an object with a list of tiles, got {type(d).__name__}")
        if not 1 <= len(d["tiles"]) <= MAX_STAGES:
            raise ConfigError(f"{where}: {len(d['tiles'])} tilings: accepted: 1 to {MAX_STAGES}")
        unknown = sorted(str(k) for k in d if k != "tiles" and k not in GLOBAL_FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown field {shown(unknown[0])}; accepted: tiles, {', '.join(GLOBAL_FIELDS)}")
        tiles = []
        for i, t in enumerate(d["tiles"]):
            if not isinstance(t, Mapping):
                raise ConfigError(f"{where}: tiles[{i}] is a {type(t).__name__}, not an object")
            odd = sorted(str(k) for k in t if k not in TILE_FIELDS)
            if odd:
                raise ConfigError(f"{where}: tiles[{i}]: unknown field {shown(odd[0])}; accepted: {', '.join(TILE_FIELDS)}")
            tiles.append(_tiles(t, f"{where}: tiles[{i}]"))
        return cls(tuple(tiles), *_globals(d, where))

    def check(self, where: str = "config") -> "Config":
        """This config, once every field is checked as :meth:`from_dict` checks a stored one: what
        renders a config into source calls it, so no value reaches a template unchecked."""
        if not isinstance(self.tiles, tuple) or not 1 <= len(self.tiles) <= MAX_STAGES:
            raise ConfigError(f"{where}: expected 1 to {MAX_STAGES} stage tilings")
        for i, t in enumerate(self.tiles):
            if not isinstance(t, StageTiles):
                raise ConfigError(f"{where}: tiles[{i}] is a {type(t).__name__}, not a StageTiles")
            _tiles(asdict(t), f"{where}: tiles[{i}]")
        _globals({f: getattr(self, f) for f in GLOBAL_FIELDS}, where)
        return self

    @property
    def globals(self) -> tuple[str, ...]:
        """The chain-wide choices, in :data:`GLOBAL_FIELDS` order: (policy, order, dispatch, launch, prefetch)."""
        return tuple(getattr(self, f) for f in GLOBAL_FIELDS)

    def grids(self, chain: Chain) -> tuple[StageGrid, ...]:
        return tuple(StageGrid(s, t) for s, t in zip(chain.stages, self.tiles))

    def short(self) -> str:
        """A compact one-line description for tables and logs."""
        t = " | ".join(x.short() for x in self.tiles)
        pre = "" if self.prefetch == "none" else f"+{self.prefetch}"
        return f"{self.policy}/{self.launch}/{self.order}-{self.dispatch}{pre} [{t}]"


def _tiles(values: Mapping[str, Any], where: str) -> StageTiles:
    """One stage's tiling from its fields, each checked; a field left out takes its default."""
    missing = [f for f in TILE_FIELDS if f not in values and f not in TILE_DEFAULTS]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return StageTiles(**{f: field_value(f, values[f] if f in values else TILE_DEFAULTS[f], f"{where}")
                         for f in TILE_FIELDS})


def _globals(values: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The global fields of ``values``, each checked; one left out takes its default where it has one."""
    missing = [f for f in GLOBAL_FIELDS if f not in values and f not in GLOBAL_DEFAULTS]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return tuple(field_value(f, values.get(f, GLOBAL_DEFAULTS.get(f)), where) for f in GLOBAL_FIELDS)
