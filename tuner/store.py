"""Storage: opening the study database, and the measurement cache kept beside Optuna's tables.

The cache lives in its own table, ``tuner_measurements``, in the same database as
the Optuna studies, so one URL names everything. A row is keyed by what decides
a measurement: the device, its toolkit, the kernel source hash, the chain label
and the config. Rows from a replayed backend carry ``replayed = true`` and are
only ever served back to a replayed backend; a GPU backend sees measured rows only.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from . import UsageError
from .backends.base import DeviceInfo, Measurement
from .config import Config

DEFAULT_STORAGE = "sqlite:///tuner.db"
TABLE = "tuner_measurements"
T = TypeVar("T")

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


def driver_url(url: str) -> str:
    """``url`` with a PostgreSQL driver that is installed: a plain ``postgresql://`` URL means
    psycopg2 to SQLAlchemy, so it goes through psycopg 3 (the ``postgresql`` extra) when only
    that one is there."""
    import importlib.util  # noqa: PLC0415

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg2") is None \
            and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


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


# Several processes share one SQLite file (workers on one host): a writer waits for another's
# lock this long instead of failing at once.
SQLITE_BUSY_S = 60.0


def _connect_args(url: str, read_only: bool = False) -> dict[str, Any]:
    if url.startswith("postgresql"):
        # A server that does not answer is an error within seconds; a reading command's session
        # cannot write, whatever a bug or a library (Optuna's table creation) would ask of it.
        return {"connect_timeout": 10, **({"options": "-c default_transaction_read_only=on"} if read_only else {})}
    if url.startswith("mysql"):
        return {"connect_timeout": 10}
    if url.startswith("sqlite"):
        return {"timeout": SQLITE_BUSY_S}
    return {}


def read_only_url(url: str) -> str:
    """``url`` opened so that nothing can write to it: an SQLite file in SQLite's read-only mode
    (``mode=ro``), and immutable (no lock files made) while no writer has a journal open beside it,
    so a reading command leaves the directory as it found it. Other URLs are returned as they are
    (a PostgreSQL session is made read-only by :func:`_connect_args`)."""
    path = sqlite_path(url)
    if path is None:
        return url
    live = any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))
    return f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro{'' if live else '&immutable=1'}&uri=true"


def _engine(url: str, read_only: bool = False) -> sa.Engine:
    try:
        engine = sa.create_engine(driver_url(read_only_url(url) if read_only else url),
                                  connect_args=_connect_args(url, read_only))
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StorageError(f"storage URL {url!r} is not valid: {exc}; {_accepted()}") from None
    except ImportError as exc:
        raise StorageError(f"storage URL {url!r} needs a database driver that is not installed ({exc}); "
                           f"{_accepted()}, and for PostgreSQL: pip install -e '.[postgresql]'") from None
    if sqlite_path(url) is not None and not read_only:
        # Readers do not block the writer, nor it them (the mode is kept in the file).
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        except sa.exc.SQLAlchemyError:
            pass  # read-only or not there: the first real use says so, in our words
    return engine


def _create_tables(engine: sa.Engine, tables: list[sa.Table] | None = None) -> None:
    """Create our tables where missing (see :func:`_retry_race`)."""
    _retry_race(lambda: _metadata.create_all(engine, tables=tables))


def _retry_race(make: Callable[[], T]) -> T:
    """``make()``, tried again where it failed because another worker created the same tables at
    the same moment (workers started together race; the one that loses finds them made)."""
    for attempt in range(3):
        try:
            return make()
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as exc:
            if attempt == 2 or "exist" not in str(exc).lower() and "unique" not in str(exc).lower():
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def open_optuna_storage(url: str, *, read_only: bool = False):
    """Optuna's RDB storage for ``url``, with a one-line error when it cannot be opened.

    ``read_only``, for the commands that only read: the database is opened so that nothing can
    write to it (:func:`read_only_url`), Optuna creates no tables, and a database without them
    (empty, or another program's) is a :class:`StorageError` saying it holds no study."""
    import optuna  # noqa: PLC0415 - slow import, only for commands that touch studies

    if read_only:
        check_exists(url)
        if not has_studies(url):
            raise StorageError(f"storage {url} holds no study (no tuner tables in it); run python -m tuner study "
                               "first, or pass --storage with the URL the studies were written to")
    target = driver_url(read_only_url(url) if read_only else url)
    try:
        return _retry_race(lambda: optuna.storages.RDBStorage(
            target, engine_kwargs={"connect_args": _connect_args(url, read_only)},
            skip_compatibility_check=read_only, skip_table_creation=read_only))
    except (sa.exc.SQLAlchemyError, ImportError, ValueError, RuntimeError) as exc:
        raise StorageError(f"cannot open storage {url}: {_first_line(exc)}; {_accepted()}") from None


def has_studies(url: str) -> bool:
    """Whether the database at ``url`` has Optuna's study table, asked without writing to it."""
    engine = _engine(url, read_only=True)
    try:
        return sa.inspect(engine).has_table("studies")
    except sa.exc.SQLAlchemyError as exc:
        raise StorageError(f"cannot read storage {url}: {_first_line(exc)}; {_accepted()}") from None
    finally:
        engine.dispose()


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class MeasurementStore:
    """The measurement cache in the database at ``url``; with ``read_only``, opened so that nothing
    can write to it (:func:`read_only_url`), and a database without the table reads as empty."""

    def __init__(self, url: str, *, read_only: bool = False):
        self.url = url
        self.engine = _engine(url, read_only=read_only)
        self.read_only = read_only
        try:
            if read_only:
                self._empty = not sa.inspect(self.engine).has_table(TABLE)
            else:
                self._empty = False
                _create_tables(self.engine)
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


claims = sa.Table(
    "tuner_claims", _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("scope", sa.String(512), nullable=False),
    sa.Column("item", sa.String(128), nullable=False),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("beat", sa.Float, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False),
    sa.UniqueConstraint("scope", "item", name="uq_tuner_claims_scope_item"),
)


class ClaimBoard:
    """Which worker measures what, for workers that share one storage.

    A claim is a row keyed by (scope, item), unique in the database, so of two workers that
    ask for the same item exactly one gets it, on SQLite and on a server alike. Its owner's
    heartbeat (every ``beat_s``, from a thread) keeps it alive; a claim not done whose heartbeat
    is older than ``grace_s`` belonged to a dead worker and is taken over by the next who asks,
    and so is one of a worker on this host whose process is gone (a study resumed after kill -9
    takes its own dead claims over at once). A done claim is never taken again.
    """

    def __init__(self, url: str, *, beat_s: float = 2.0, grace_s: float = 10.0):
        import os  # noqa: PLC0415
        import socket  # noqa: PLC0415
        import threading  # noqa: PLC0415
        import uuid  # noqa: PLC0415

        self.engine = _engine(url)
        _create_tables(self.engine, [claims])
        self.host = socket.gethostname()
        self.owner = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.beat_s, self.grace_s = beat_s, grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, name="tuner-heartbeat", daemon=True)
        self._thread.start()

    def _now(self) -> float:
        return time.time()

    def _gone(self, owner: str) -> bool:
        """Whether ``owner`` was a process of this host that is no longer running."""
        import os  # noqa: PLC0415

        parts = owner.rsplit(":", 2)
        if len(parts) != 3 or parts[0] != self.host or not parts[1].isdigit() or owner == self.owner:
            return False
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError, OSError):
            return False  # running under another user, or not a pid: let its heartbeat decide
        return False

    def _stale(self, owner: str, beat: float, now: float) -> bool:
        return beat < now - self.grace_s or self._gone(owner)

    def take(self, scope: str, item: str) -> bool:
        """Claim ``item`` of ``scope`` for this worker: True when it is ours (new, already ours, or
        taken over from a dead worker), False when a live worker holds it or it is done."""
        c = claims.c
        now = self._now()
        try:
            with self.engine.begin() as conn:
                conn.execute(claims.insert().values(scope=scope, item=item, owner=self.owner, beat=now, done=False))
            return True
        except sa.exc.IntegrityError:
            pass
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(c.owner, c.beat, c.done).where(c.scope == scope, c.item == item)).first()
            if row is None:  # dropped meanwhile: ask again
                return self.take(scope, item)
            if row.done:
                return False
            if row.owner == self.owner:
                return True
            if not self._stale(row.owner, row.beat, now):
                return False
            # Compare and swap: of two workers taking over the same dead claim, one wins.
            got = conn.execute(claims.update().where(c.scope == scope, c.item == item, c.owner == row.owner,
                                                     c.beat == row.beat, c.done == sa.false())
                               .values(owner=self.owner, beat=now))
            return got.rowcount == 1

    def done(self, scope: str, item: str) -> None:
        """Mark our claim finished: nobody takes it again."""
        c = claims.c
        with self.engine.begin() as conn:
            conn.execute(claims.update().where(c.scope == scope, c.item == item, c.owner == self.owner)
                         .values(done=True, beat=self._now()))

    def drop(self, scope: str, item: str) -> None:
        """Give our claim up unfinished: anyone may take it."""
        c = claims.c
        with self.engine.begin() as conn:
            conn.execute(claims.delete().where(c.scope == scope, c.item == item, c.owner == self.owner,
                                               c.done == sa.false()))

    def forget_done(self, scope: str, item: str) -> None:
        """Remove a done claim whose result is not in the study (a study deleted and made again)."""
        c = claims.c
        with self.engine.begin() as conn:
            conn.execute(claims.delete().where(c.scope == scope, c.item == item, c.done == sa.true()))

    def open_items(self, scope: str, items: Iterable[str]) -> list[str]:
        """Those of ``items`` (in their order) that are unclaimed or held by a dead worker."""
        c = claims.c
        now = self._now()
        with self.engine.connect() as conn:
            held = {row.item for row in conn.execute(sa.select(c.item, c.owner, c.beat, c.done)
                                                     .where(c.scope == scope))
                    if row.done or not self._stale(row.owner, row.beat, now)}
        return [i for i in items if i not in held]

    def holder(self, scope: str, item: str) -> tuple[str, bool, float] | None:
        """(owner, done, seconds since its last heartbeat) of the claim, or None when nobody holds it."""
        c = claims.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(c.owner, c.done, c.beat).where(c.scope == scope, c.item == item)).first()
        return None if row is None else (row.owner, bool(row.done), max(0.0, self._now() - row.beat))

    def _beat_loop(self) -> None:
        c = claims.c
        while not self._stop.wait(self.beat_s):
            try:
                with self.engine.begin() as conn:
                    conn.execute(claims.update().where(c.owner == self.owner, c.done == sa.false())
                                 .values(beat=self._now()))
            except sa.exc.SQLAlchemyError:
                continue  # a busy database: the next beat comes well within the grace period

    def close(self) -> None:
        """Stop the heartbeat and give up every unfinished claim."""
        self._stop.set()
        self._thread.join(timeout=self.beat_s + 1)
        c = claims.c
        try:
            with self.engine.begin() as conn:
                conn.execute(claims.delete().where(c.owner == self.owner, c.done == sa.false()))
        except sa.exc.SQLAlchemyError:
            pass  # left to go stale: others take them over after the grace period
        self.engine.dispose()
