"""PostgreSQL read side: a psycopg_pool of autocommit connections used from worker threads,
running ``pg.queries`` (this engine's own SQL); after an outage the pool is replaced when the
database answers again before the pool's own backoff has run out."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
import psycopg_pool
import trio

from agentik.errors import StorageError
from agentik.storage.pg import queries
from agentik.storage.pg.connect import (
    DEFAULT_TIMEOUT,
    Connection,
    connect,
    connect_kwargs,
    set_limits,
)
from agentik.storage.reads import Reads

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger(__name__)


class PgReader(Reads[psycopg.Connection[Any]]):
    """The PostgreSQL :class:`~agentik.storage.engine.ReaderEngine` (``reads.Reads`` over
    ``pg.queries``)."""

    queries = queries

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

    async def _read(self, fn: Callable[Concatenate[psycopg.Connection[Any], P], R],
                    *args: P.args, **kwargs: P.kwargs) -> R:
        return await trio.to_thread.run_sync(
            self._with, lambda conn: fn(conn, *args, **kwargs), limiter=self._limiter)

    def close(self) -> None:
        with self._renewing:
            self.pool.close()
