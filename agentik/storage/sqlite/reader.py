"""The SQLite read side (``reads.Reads`` over ``sqlite.queries``): a small pool of read-only
connections used from worker threads."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Concatenate, ParamSpec, TypeVar

import trio

from agentik.errors import StorageError
from agentik.storage.reads import Reads
from agentik.storage.sqlite import queries
from agentik.storage.sqlite.writer import open_connection

P = ParamSpec("P")
R = TypeVar("R")


class Reader(Reads[sqlite3.Connection]):
    """The SQLite :class:`~agentik.storage.engine.ReaderEngine`: each read runs ``fn(conn,
    *args)`` in a thread with a pooled connection and converts sqlite3 errors to StorageError.
    Concurrency is bounded by a CapacityLimiter so a burst of reads cannot take every worker
    thread."""

    queries = queries

    def __init__(self, path: str, max_connections: int = 4, busy_timeout: float = 10.0) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._pool: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._limiter = trio.CapacityLimiter(max_connections)
        self._closed = False

    def _acquire(self) -> sqlite3.Connection:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return open_connection(self.path, readonly=True, busy_timeout=self.busy_timeout)

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed:
                self._pool.append(conn)
                return
        conn.close()

    def _call(self, fn: Callable[Concatenate[sqlite3.Connection, P], R], *args: P.args,
              **kwargs: P.kwargs) -> R:
        conn = self._acquire()
        try:
            return fn(conn, *args, **kwargs)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            raise StorageError(f"read failed: {exc}") from exc
        finally:
            self._release(conn)

    async def _read(self, fn: Callable[Concatenate[sqlite3.Connection, P], R], *args: P.args,
                    **kwargs: P.kwargs) -> R:
        return await trio.to_thread.run_sync(partial(self._call, fn, *args, **kwargs),
                                             limiter=self._limiter)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
