"""Storage: opening the study database, and the measurement cache kept beside Optuna's tables.

The cache lives in its own table, ``tuner_measurements``, in the same database as
the Optuna studies, so one URL names everything. A row is keyed by what decides
a measurement: the device, its toolkit, the kernel source hash, the chain label
and the config. Rows from a replayed backend carry ``replayed = true`` and are
only ever served back to a replayed backend; a GPU backend sees measured rows only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from . import UsageError
from .backends.base import DeviceInfo, Measurement
from .config import Config

DEFAULT_STORAGE = "sqlite:///tuner.db"
TABLE = "tuner_measurements"

_metadata = sa.MetaData()
measurements = sa.Table(
    TABLE, _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("device", sa.String(255), nullable=False),
    sa.Column("toolkit", sa.String(64), nullable=False),
    sa.Column("label", sa.String(512), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("source_hash", sa.String(128), nullable=False),
    sa.Column("replayed", sa.Boolean, nullable=False),
    sa.Column("measurement", sa.Text, nullable=False),
    sa.Index("ix_tuner_measurements_key", "device", "label", "toolkit"),
)


class StorageError(UsageError):
    """The storage URL cannot be opened, read or written."""


def _accepted() -> str:
    return f"accepted: an SQLAlchemy database URL, e.g. {DEFAULT_STORAGE}"


def sqlite_path(url: str) -> Path | None:
    """The file behind an ``sqlite:///`` URL, or None for other databases and in-memory SQLite."""
    try:
        u = make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    db = u.database
    if db.startswith("file:"):  # sqlite URI form, e.g. file:tuner.db?mode=ro
        db = db[len("file:"):].split("?", 1)[0]
    return Path(db)


def check_exists(url: str) -> None:
    """Refuse to read a SQLite file that is not there (SQLite would silently create an empty one)."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise StorageError(f"storage {url} does not exist (no file {path}); run python -m tuner study first, "
                           "or pass --storage with the URL the studies were written to")


def _engine(url: str) -> sa.Engine:
    # A database server that does not answer should be an error within seconds, not a hang.
    connect_args = {"connect_timeout": 10} if url.startswith(("postgresql", "mysql")) else {}
    try:
        return sa.create_engine(url, connect_args=connect_args)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StorageError(f"storage URL {url!r} is not valid: {exc}; {_accepted()}") from None
    except ImportError as exc:
        raise StorageError(f"storage URL {url!r} needs a database driver that is not installed ({exc}); "
                           f"{_accepted()}") from None


def open_optuna_storage(url: str):
    """Optuna's RDB storage for ``url``, with a one-line error when it cannot be opened."""
    import optuna  # noqa: PLC0415 - slow import, only for commands that touch studies

    try:
        return optuna.storages.RDBStorage(url)
    except (sa.exc.SQLAlchemyError, ImportError, ValueError, RuntimeError) as exc:
        raise StorageError(f"cannot open storage {url}: {_first_line(exc)}; {_accepted()}") from None


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class MeasurementStore:
    """The measurement cache in the database at ``url``."""

    def __init__(self, url: str, *, writable: bool = True):
        self.url = url
        self.engine = _engine(url)
        try:
            _metadata.create_all(self.engine)
            if writable:
                self._check_writable()
        except sa.exc.SQLAlchemyError as exc:
            raise StorageError(f"cannot use storage {url}: {_first_line(exc)}; {_accepted()}") from None

    def _check_writable(self) -> None:
        # A read-only database only fails on the first write: find out now, not after an hour of tuning.
        with self.engine.connect() as conn:
            conn.execute(measurements.insert().values(device="", toolkit="", label="", config="", source_hash="",
                                                      replayed=False, measurement=""))
            conn.rollback()

    @staticmethod
    def _key(config: Config) -> str:
        return json.dumps(config.to_dict(), sort_keys=True)

    def lookup(self, device: DeviceInfo, label: str, config: Config, *, replayed: bool,
               source_hash: str | None = None) -> Measurement | None:
        """The newest cached outcome for this key, or None.

        ``replayed`` must be the asking backend's flag: replayed rows go to replay
        backends only. Without ``source_hash`` any source hash matches.
        """
        t = measurements.c
        q = (sa.select(t.measurement).where(t.device == device.name, t.toolkit == device.toolkit, t.label == label,
                                            t.config == self._key(config), t.replayed == replayed)
             .order_by(t.id.desc()).limit(1))
        if source_hash is not None:
            q = q.where(t.source_hash == source_hash)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return Measurement.from_dict(json.loads(row[0])) if row else None

    def save(self, device: DeviceInfo, label: str, config: Config, m: Measurement) -> None:
        """Keep one outcome, whatever it was (failures too: they would fail again)."""
        with self.engine.begin() as conn:
            conn.execute(measurements.insert().values(
                device=device.name, toolkit=device.toolkit, label=label, config=self._key(config),
                source_hash=m.source_hash, replayed=m.replayed, measurement=json.dumps(m.to_dict(), sort_keys=True)))

    def records(self, device: DeviceInfo, labels: Iterable[str]) -> list[dict[str, Any]]:
        """Every measured (not replayed) outcome on ``device`` for the chains ``labels``, the newest per
        label and config, as recording records (see :func:`tuner.backends.replay.write_recording`)."""
        t = measurements.c
        q = (sa.select(t.label, t.config, t.measurement)
             .where(t.device == device.name, t.toolkit == device.toolkit, t.label.in_(list(labels)),
                    t.replayed == sa.false())
             .order_by(t.id))
        newest: dict[tuple[str, str], dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for label, config, m in conn.execute(q):
                newest[(label, config)] = {"label": label, "config": json.loads(config), "measurement": json.loads(m)}
        return list(newest.values())

    def count(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(measurements)).scalar_one()

    def close(self) -> None:
        self.engine.dispose()
