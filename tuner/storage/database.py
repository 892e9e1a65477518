"""Opening a storage URL: SQLite or PostgreSQL, read-only where the command only reads.

Every module that touches the database opens it here, so the drivers, the read-only forms and
the errors for a missing or foreign database are defined once.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from .. import UsageError

DEFAULT_STORAGE = "sqlite:///tuner.db"


T = TypeVar("T")


METADATA = sa.MetaData()


class StorageError(UsageError):
    """The storage URL cannot be opened, read or written."""


def accepted_urls() -> str:
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


def engine_for(url: str, read_only: bool = False) -> sa.Engine:
    try:
        engine = sa.create_engine(driver_url(read_only_url(url) if read_only else url),
                                  connect_args=_connect_args(url, read_only))
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StorageError(f"storage URL {url!r} is not valid: {exc}; {accepted_urls()}") from None
    except ImportError as exc:
        raise StorageError(f"storage URL {url!r} needs a database driver that is not installed ({exc}); "
                           f"{accepted_urls()}, and for PostgreSQL: pip install -e '.[postgresql]'") from None
    if sqlite_path(url) is not None and not read_only:
        # Readers do not block the writer, nor it them (the mode is kept in the file).
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        except sa.exc.SQLAlchemyError:
            pass  # read-only or not there: the first real use says so, in our words
    return engine


def create_tables(engine: sa.Engine, tables: list[sa.Table] | None = None) -> None:
    """Create our tables where missing (see :func:`_retry_race`)."""
    _retry_race(lambda: METADATA.create_all(engine, tables=tables))


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
        raise StorageError(f"cannot open storage {url}: {first_line(exc)}; {accepted_urls()}") from None


def has_studies(url: str) -> bool:
    """Whether the database at ``url`` has Optuna's study table, asked without writing to it."""
    engine = engine_for(url, read_only=True)
    try:
        return sa.inspect(engine).has_table("studies")
    except sa.exc.SQLAlchemyError as exc:
        raise StorageError(f"cannot read storage {url}: {first_line(exc)}; {accepted_urls()}") from None
    finally:
        engine.dispose()


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
