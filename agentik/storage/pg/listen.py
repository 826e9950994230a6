"""LISTEN without a thread (PostgreSQL), the one listener of the feed and the online relay.

A connection that LISTENs on one channel; the task waits until its socket is readable
(``trio.lowlevel.wait_readable``), consumes the input and hands every notification over. A lost
connection is re-opened with backoff (0.1 s, doubling up to 2 s); a notification sent while it
was away is lost (NOTIFY is a hint: the feed's timer and reconnect wake-up cover it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import trio
import trio.lowlevel
from psycopg import sql

from agentik.storage.pg.connect import DEFAULT_TIMEOUT, connect

log = logging.getLogger(__name__)


async def listen(
    url: str,
    channel: str,
    on_notify: Callable[[list[psycopg.pq.abc.PGnotify]], None],
    *,
    name: str,
    on_connect: Callable[[int], None] | None = None,
    on_disconnect: Callable[[], None] | None = None,
    db_timeout: float = DEFAULT_TIMEOUT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``channel`` until cancelled. ``on_notify`` gets each read's notifications,
    ``on_connect`` the server process id after every (re)connect, ``on_disconnect`` is called
    when the connection is gone. ``task_status.started`` once the first LISTEN is in place;
    raises psycopg.Error or OSError if that first connect fails."""
    started = False
    backoff = 0.1
    while True:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = await trio.to_thread.run_sync(_connect, url, channel, db_timeout)
            backoff = 0.1
            if on_connect is not None:
                on_connect(conn.info.backend_pid)
            if not started:
                started = True
                task_status.started()
            while True:
                await trio.lowlevel.wait_readable(conn.fileno())
                conn.pgconn.consume_input()
                notes = []
                while (note := conn.pgconn.notifies()) is not None:
                    notes.append(note)
                if notes:
                    on_notify(notes)
                if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError(f"{name} connection lost")
        except (psycopg.Error, OSError) as exc:
            if not started:
                raise
            log.warning("%s: %s; reconnecting in %.1f s", name, exc, backoff)
        finally:
            if on_disconnect is not None:
                on_disconnect()
            if conn is not None:
                conn.close()
        await trio.sleep(backoff)
        backoff = min(backoff * 2, 2.0)


def _connect(url: str, channel: str, timeout: float) -> psycopg.Connection[Any]:
    conn = connect(url, timeout=timeout)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn
