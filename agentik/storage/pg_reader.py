"""PostgreSQL read side: a psycopg_pool of autocommit connections used from worker threads.

The query functions of ``agentik.storage.queries`` are written once, in SQL both engines accept
with ``?`` placeholders; :class:`_Conn` hands them a connection that speaks psycopg's ``%s``. The
outbox is the one read with its own SQL: PostgreSQL rows carry offset 0 in their payload (the
writer learns the offset only inside its statement), so :func:`stamp` puts the row's offset into
the cursor and the record before the event is handed out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import msgspec
import psycopg
import psycopg_pool
import trio

from agentik.errors import StorageError
from agentik.storage.pg_connect import (
    DEFAULT_TIMEOUT,
    Connection,
    connect,
    connect_kwargs,
    set_limits,
)
from agentik.storage.writer import StoredEvent
from agentik.wire import CommonEvent, Created, Cursor, decode_common_event, encode

R = TypeVar("R")
log = logging.getLogger(__name__)


class _Conn:
    """What a query function of ``queries`` needs from a connection, on psycopg."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self._conn.execute(sql.replace("?", "%s"), args)


def stamp(common: CommonEvent, offset: int) -> CommonEvent:
    """The stored event with its offset in its cursor and in the record it carries (a record's
    seq is always its own event's offset)."""
    event: Any = common.event
    record = getattr(event, "record", None)
    if record is not None:
        event = msgspec.structs.replace(event, record=msgspec.structs.replace(record, seq=offset))
    elif isinstance(event, Created):
        event = Created(conversation=msgspec.structs.replace(event.conversation, seq=offset))
    assert common.cursor is not None
    return CommonEvent(cursor=Cursor(epoch=common.cursor.epoch, offset=offset),
                       conversation_id=common.conversation_id, event=event)


def row_to_event(row: Sequence[Any]) -> StoredEvent:
    """(offset, conversation_id, kind, payload) -> StoredEvent with its offset stamped in."""
    common = stamp(decode_common_event(bytes(row[3])), int(row[0]))
    return StoredEvent(int(row[0]), row[1], row[2], common, encode(common))


_PAGE = """
SELECT h.lo, h.head, o."offset", o.conversation_id, o.kind, o.payload
FROM (SELECT (SELECT min("offset") FROM outbox) AS lo, (SELECT v FROM counter WHERE id = 1) AS head) h
LEFT JOIN LATERAL (
    SELECT "offset", conversation_id, kind, payload FROM outbox
    WHERE "offset" > %(after)s {filters} ORDER BY "offset" LIMIT %(limit)s
) o ON true
"""


def outbox_page(
    conn: psycopg.Connection[Any], after: int, conversation_id: str | None, kind: str | None,
    limit: int,
) -> tuple[int, int, list[StoredEvent]]:
    """One statement, so one snapshot: (oldest retained, head, rows after ``after``)."""
    filters = ""
    if conversation_id is not None:
        filters += " AND conversation_id = %(cid)s"
    if kind is not None:
        filters += " AND kind = %(kind)s"
    rows = conn.execute(
        _PAGE.format(filters=filters),
        {"after": after, "limit": limit, "cid": conversation_id, "kind": kind},
    ).fetchall()
    head = int(rows[0][1]) if rows else 0
    lo = rows[0][0] if rows else None
    oldest = int(lo) if lo is not None else head + 1
    events = [row_to_event(r[2:]) for r in rows if r[2] is not None]
    return oldest, head, events


class PgReader:
    """The PostgreSQL :class:`~agentik.storage.engine.ReaderEngine`."""

    def __init__(self, url: str, max_connections: int = 4,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._limiter = trio.CapacityLimiter(max_connections)
        #: the longest wait for a pooled connection: the limiter keeps the threads within the
        #: pool's size, so a read waits here only while the pool cannot connect (the database
        #: is out of reach): it then fails after AGENTIK_DB_TIMEOUT, as a write does
        self._wait = timeout
        self._url, self._size = url, max_connections
        self._renewing = threading.Lock()
        self.pool = self._new_pool()

    def _new_pool(self) -> psycopg_pool.ConnectionPool[Connection]:
        return psycopg_pool.ConnectionPool(
            self._url, min_size=1, max_size=self._size, open=False,
            connection_class=Connection, kwargs=connect_kwargs(self._wait),
            configure=partial(set_limits, timeout=self._wait),
            check=psycopg_pool.ConnectionPool.check_connection,
        )

    def open(self) -> None:
        """Blocking: open the pool (worker thread). Raises StorageError."""
        try:
            self.pool.open(wait=True, timeout=10.0)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise StorageError(f"cannot open the read pool: {exc}") from exc

    def _call(self, fn: Callable[..., R], *args: Any) -> R:
        return self._with(lambda conn: fn(_Conn(conn), *args))

    def _page(self, *args: Any) -> tuple[int, int, list[StoredEvent]]:
        return self._with(lambda conn: outbox_page(conn, *args))

    def _with(self, fn: Callable[[psycopg.Connection[Any]], R]) -> R:
        """``fn`` with a pooled connection. Raises StorageError."""
        pool = self.pool
        try:
            with pool.connection(timeout=self._wait) as conn:
                return fn(conn)
        except psycopg_pool.PoolTimeout:
            pass
        except psycopg_pool.PoolClosed as exc:
            if self.pool is not pool:  # replaced meanwhile (_renew): the new one
                return self._with(fn)
            raise StorageError(f"read failed: {exc}") from exc
        except psycopg.Error as exc:
            raise StorageError(f"read failed: {exc}") from exc
        # No pooled connection in time. After an outage the pool reconnects with a backoff that
        # doubles without a cap (psycopg_pool: 1, 2, 4, 8 s ...), so it may still be waiting
        # although the database is back: one connection of its own tells.
        try:
            with connect(self._url, timeout=self._wait) as conn:
                result = fn(conn)
        except psycopg.Error as exc:
            raise StorageError(f"read failed: {exc}") from exc
        self._renew(pool)  # the database answers: a new pool, with no backoff to wait out
        return result

    def _renew(self, failed: psycopg_pool.ConnectionPool[Connection]) -> None:
        with self._renewing:
            if self.pool is not failed:  # another read renewed it already
                return
            fresh = self._new_pool()
            fresh.open(wait=False)
            self.pool = fresh
        log.warning("the read pool could not reconnect in time although the database "
                    "answers: replaced it")
        failed.close(timeout=1.0)  # connections still lent out are closed when given back

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)

    async def outbox_page(
        self, after: int, conversation_id: str | None, kind: str | None, limit: int
    ) -> tuple[int, int, list[StoredEvent]]:
        return await trio.to_thread.run_sync(
            self._page, after, conversation_id, kind, limit, limiter=self._limiter
        )

    def close(self) -> None:
        with self._renewing:
            self.pool.close()
