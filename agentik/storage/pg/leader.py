"""One node of a PostgreSQL cluster does a job all of them could (webhook deliveries): the node
that holds a session advisory lock named after the job and the schema. The lock lives with its
connection, so a node that dies or loses the database lets it go and another node (each tries
now and then) takes it over; the holder checks its connection as often and stops the job at
once when it is gone (the job is then at least once: an event sent just before is sent again,
with the same id, by the next holder)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import trio

from agentik.storage.pg.connect import connect

log = logging.getLogger(__name__)

_TRY = "SELECT pg_try_advisory_lock(hashtext('agentik-job:' || current_schema() || ':' || %s))"


def _try_lock(url: str, name: str, timeout: float) -> psycopg.Connection[Any] | None:
    """A connection holding the job's lock, or None (another node holds it)."""
    conn = connect(url, timeout=timeout)
    try:
        conn.autocommit = True
        row = conn.execute(_TRY, (name,)).fetchone()
        if row is not None and row[0]:
            return conn
    except BaseException:
        conn.close()
        raise
    conn.close()
    return None


def _alive(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1")


async def lead(url: str, name: str, job: Callable[[], Awaitable[None]], *,
               db_timeout: float, every: float) -> None:
    """Run ``job`` whenever this node holds the job's lock: tried every ``every`` seconds,
    checked as often while held; never returns unless ``job`` does. (``db_timeout``: each
    connection's, ``pg.connect``.)"""
    while True:
        try:
            conn = await trio.to_thread.run_sync(_try_lock, url, name, db_timeout)
        except psycopg.Error as exc:
            log.warning("%s: cannot reach the database for the job's lock: %s", name, exc)
            conn = None
        if conn is None:
            await trio.sleep(every)
            continue
        log.info("%s: this node does the job now", name)
        try:
            async with trio.open_nursery() as nursery:
                done = await _hold(nursery, conn, job, every)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)
        if done:
            return
        log.warning("%s: the job's lock was lost; trying to take it again", name)


async def _hold(nursery: trio.Nursery, conn: psycopg.Connection[Any],
                job: Callable[[], Awaitable[None]], every: float) -> bool:
    """Run ``job`` while ``conn`` answers; True when ``job`` ended by itself."""
    ended: list[bool] = []

    async def run_job() -> None:
        await job()
        ended.append(True)
        nursery.cancel_scope.cancel()

    nursery.start_soon(run_job)
    while True:
        await trio.sleep(every)
        try:
            await trio.to_thread.run_sync(_alive, conn)
        except psycopg.Error:
            nursery.cancel_scope.cancel()
            return bool(ended)
