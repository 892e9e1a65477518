"""The measurement cache, kept beside Optuna's tables.

The cache lives in its own table, ``tuner_measurements``, in the same database as
the Optuna studies, so one URL names everything. A row is keyed by what decides
a measurement: the device, its toolkit, the kernel source hash, the chain label
and the config. Rows from a replayed backend carry ``replayed = true`` and are
only ever served back to a replayed backend; a GPU backend sees measured rows only.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import sqlalchemy as sa

from ..backends.base import DeviceInfo, Measurement
from ..config import Config
from .database import METADATA, StorageError, accepted_urls, create_tables, engine_for, first_line

TABLE = "tuner_measurements"


measurements = sa.Table(
    TABLE, METADATA,
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


class MeasurementStore:
    """The measurement cache in the database at ``url``; with ``read_only``, opened so that nothing
    can write to it (:func:`read_only_url`), and a database without the table reads as empty."""

    def __init__(self, url: str, *, read_only: bool = False):
        self.url = url
        self.engine = engine_for(url, read_only=read_only)
        self.read_only = read_only
        try:
            if read_only:
                self._empty = not sa.inspect(self.engine).has_table(TABLE)
            else:
                self._empty = False
                create_tables(self.engine)
                self._check_writable()
        except sa.exc.SQLAlchemyError as exc:
            raise StorageError(f"cannot use storage {url}: {first_line(exc)}; {accepted_urls()}") from None

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
        if self._empty:
            return None
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
        if self._empty:
            return []
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
        if self._empty:
            return 0
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(measurements)).scalar_one()

    def close(self) -> None:
        self.engine.dispose()
