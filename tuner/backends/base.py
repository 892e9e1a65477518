"""The backend interface: given a chain and a config, compile, verify and time it, or fail with a reason."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from ..chain.workloads import Chain
from ..config import Config
from ..device import DeviceInfo

# Every failed trial carries exactly one of these.
FAIL_REASONS = ("constraint", "compile", "resources", "launch", "timeout", "incorrect")


@dataclass
class Measurement:
    """The outcome of one config on one device: a time, or a failure with its reason."""

    ok: bool
    median_us: float | None = None
    times_us: list[float] = field(default_factory=list)
    error: float | None = None  # relative Frobenius error against the float32 reference
    reason: str | None = None  # one of FAIL_REASONS when not ok
    message: str = ""
    source_hash: str = ""
    compile_s: float = 0.0
    resources: dict[str, Any] = field(default_factory=dict)  # per kernel: registers, smem, spills
    replayed: bool = False
    graphs: bool = False  # timed as replays of a CUDA graph, not as launches

    def __post_init__(self) -> None:
        if not self.ok and self.reason not in FAIL_REASONS:
            raise ValueError(f"failure reason must be one of {FAIL_REASONS}, got {self.reason!r}")

    def to_dict(self) -> dict[str, Any]:
        """As JSON data; ``graphs`` only where set, so records timed as launches read as they always did."""
        d = asdict(self)
        if not self.graphs:
            del d["graphs"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @classmethod
    def failed(cls, reason: str, message: str, **kw: Any) -> "Measurement":
        return cls(ok=False, reason=reason, message=message, **kw)


# What a backend may offer beyond the interface every backend implements; each one declares the
# ones it has (``Backend.features``), and the study loop asks it (``supports``) instead of probing.
FEATURES = {
    "labels": "labels(): the chain labels it can answer for (a replay's recordings)",
    "screens": "measure(chain, config, screen=True): a quicker timing, good enough to rank tilings",
    "source_hash": "source_hash(chain, config): the kernel source's hash, without rendering it here",
    "time_rounds": "time_rounds(chain, configs, rounds, heat_s=...): interleaved final rounds",
}


class Backend(ABC):
    """Compiles, verifies and times configs of a chain on one device."""

    name: str = "abstract"
    replayed: bool = False  # True when figures come from a recording, not a measurement
    synthetic: bool = False  # True when its figures come from a cost model (a synthetic recording)
    graphs: bool = False  # True when every run it times is a CUDA graph's replay (the kernels number their runs)
    features: frozenset[str] = frozenset()  # of FEATURES

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        unknown = set(cls.features) - set(FEATURES)
        if unknown:
            raise TypeError(f"{cls.__name__} declares unknown features {sorted(unknown)}; known: {sorted(FEATURES)}")

    def supports(self, feature: str) -> bool:
        """Whether this backend offers ``feature`` (one of :data:`FEATURES`)."""
        if feature not in FEATURES:
            raise ValueError(f"unknown backend feature {feature!r}; known: {', '.join(FEATURES)}")
        return feature in self.features

    @abstractmethod
    def device_info(self) -> DeviceInfo:
        """The device this backend measures on (or replays for)."""

    @abstractmethod
    def measure(self, chain: Chain, config: Config) -> Measurement:
        """Compile, verify, then time ``config``; never raises for a bad config, returns a failure."""

    def set_reference_time(self, us: float) -> None:
        """A measured chain time (the baseline) from which a backend may derive trial deadlines."""

    def restrict(self, chain: Chain, configs: Iterable[Config]) -> list[Config] | None:
        """Configs this backend can answer for, or None when it can answer any."""
        return None

    def prepare(self, targets: Sequence[tuple[Chain, Config]]) -> Iterator[int]:
        """Get ``targets`` ready to measure (compile ahead, in parallel); yields their indices as each is
        ready, so the caller measures one while the others still compile. By default: in order, at once."""
        return iter(range(len(targets)))

    def close(self) -> None:
        """Release the device and any worker process."""
