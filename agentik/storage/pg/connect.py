"""Every PostgreSQL connection agentik opens, made here so that each is bounded in time.

A database that stops answering, or a session that holds a lock agentik's statements need (an
operator's open transaction on the ``counter`` row, a migration's lock on a table), must fail a
write after a while, not leave its callers, and the clients behind them, waiting forever. So each
connection gets, from ``AGENTIK_DB_TIMEOUT`` (``timeout``):

- ``connect_timeout``: a server that takes the TCP connection but never finishes the start-up;
- TCP keepalives and ``tcp_user_timeout``: a host that is gone, or cut off, without closing the
  connection;
- ``statement_timeout`` and ``lock_timeout``: the server itself cancels a statement that runs or
  waits for a lock longer (SQLSTATE 57014 / 55P03, both transient for ``engine.is_transient``: the
  store refuses writes for now, ``/readyz`` says why, the writer probes until it accepts them);
- the writer's commit statement is also waited for at most :func:`answer_within` on the client
  side (``pg.send``): a server that stopped answering altogether (a frozen host) runs no timer of
  its own. The connection is then dropped, and whether that statement committed is unknown.
  Every other wait on a connection made here (reads, lease statements) is bounded the same way
  (:class:`Connection`).

Schema migrations run before the limits are set (``limits=False``): a migration of a large table
may take longer than a statement should, and it runs once, at start-up.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg

from agentik.config import DEFAULT_DB_TIMEOUT

#: ``AGENTIK_DB_TIMEOUT``'s default, seconds
DEFAULT_TIMEOUT = DEFAULT_DB_TIMEOUT


#: what psycopg's waits raise when their timeout expires (internal to psycopg, an
#: OperationalError; looked up so a psycopg without it only loses the client-side bound)
_WAIT_TIMEOUT: Any = getattr(psycopg.errors, "_WaitTimeout", ())


class Connection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server (``execute``, ``fetch*``, commits)
    lasts at most ``answer_within`` seconds: then the connection is closed and OperationalError
    raised, as for a connection that broke."""

    answer_within: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) < 2 and "timeout" not in kwargs:
            kwargs["timeout"] = self.answer_within
        try:
            return super().wait(gen, *args, **kwargs)
        except _WAIT_TIMEOUT:
            raise gave_up(self) from None


def gave_up(conn: psycopg.Connection[Any]) -> psycopg.OperationalError:
    """Close ``conn``, whose server did not answer within its ``answer_within`` (taken for
    gone), and return the error that says so."""
    conn.close()
    return psycopg.OperationalError(
        f"the database did not answer within {getattr(conn, 'answer_within', None):g} s; the "
        "connection was dropped")


def connect(url: str, *, timeout: float, limits: bool = True) -> Connection:
    """An autocommit connection to ``url`` with agentik's time limits. Raises psycopg.Error."""
    conn = Connection.connect(url, **connect_kwargs(timeout))
    if limits:
        try:
            set_limits(conn, timeout)
        except BaseException:
            conn.close()
            raise
    return conn


def connect_kwargs(timeout: float) -> dict[str, Any]:
    """``psycopg.connect``'s keyword arguments (also a pool's ``kwargs``)."""
    seconds = max(2, math.ceil(timeout))  # libpq takes whole seconds, and anything under 2 as 2
    return {
        "autocommit": True, "connect_timeout": seconds,
        # a host that is gone (or cut off) without closing the connection: keepalives notice it
        # on an idle connection (a LISTEN, a statement waiting for its answer), and the kernel
        # gives up on data it sent that is not acknowledged after tcp_user_timeout
        "keepalives": 1, "keepalives_idle": seconds, "keepalives_interval": max(1, seconds // 3),
        "keepalives_count": 3, "tcp_user_timeout": seconds * 1000,
    }


def set_limits(conn: psycopg.Connection[Any], timeout: float) -> None:
    """``statement_timeout`` and ``lock_timeout`` of ``conn``'s session (autocommit: they stay),
    and the client-side bound of a :class:`Connection`'s waits."""
    if isinstance(conn, Connection):
        conn.answer_within = answer_within(timeout)
    ms = max(1, round(timeout * 1000))  # an int: nothing of the caller's reaches the SQL text
    conn.execute(f"SET statement_timeout = {ms}")
    conn.execute(f"SET lock_timeout = {ms}")


def answer_within(timeout: float) -> float:
    """How long the client waits for a statement's answer before it takes the server for gone:
    a server that answers cancels its own statement after ``timeout``, so twice that is past any
    answer a live server gives."""
    return 2 * timeout
