"""Claims: which worker is measuring which config, so workers on one study never measure one twice."""
from __future__ import annotations

import time
from typing import Iterable

import sqlalchemy as sa

from .database import METADATA, create_tables, engine_for

claims = sa.Table(
    "tuner_claims", METADATA,
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

        self.engine = engine_for(url)
        create_tables(self.engine, [claims])
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
