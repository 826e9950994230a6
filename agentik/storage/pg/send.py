"""Sending a commit statement now and reading its answer later, on the writer's connection.

``psycopg.Connection.execute`` sends a statement and waits for its answer; the writer wants the
server to run batch k's statement while it plans batch k+1 in Python (``PgWriter.follow``). So
the statement is sent through libpq's asynchronous calls (``psycopg.pq``): Parse/Bind/Execute
and Sync go out together, so the server runs AND commits it on its own, without waiting for the
client (the counter row's lock is still held only while the server runs the statement: a node
stopped between send and read holds no lock). :meth:`Sender.wait` reads the answer.

Parameters are dumped by psycopg's own adapters (``Transformer``), in binary, and the statement is
prepared once per shape and parameter types, as psycopg's ``execute`` would. A failed statement
raises the ``psycopg.Error`` subclass of its SQLSTATE, so callers convert and classify errors
(``engine.is_transient``) as they do for ``execute``.
"""

from __future__ import annotations

import re
import select
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import abc, pq
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer

from agentik.storage.pg.connect import gave_up

_PLACEHOLDER = re.compile(r"%\((\w+)\)[bs]")


@lru_cache(maxsize=256)
def _numbered(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """``sql`` with psycopg's named placeholders (``%(x)b``, ``%(x)s``) as ``$n``, and the names
    in their order."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return _PLACEHOLDER.sub(number, sql).encode(), tuple(names)


@dataclass
class Dumped:
    """A statement's parameters, dumped (``Sender.dump``)."""

    query: bytes
    types: tuple[int, ...]
    values: list[Buffer | None]
    formats: list[pq.Format]
    #: parameters given only when it is sent: name -> position
    late: dict[str, int]
    tx: abc.Transformer  # the one that dumped them


class Sender:
    """One statement in flight at a time on ``conn`` (which is used for nothing else meanwhile).
    Made per connection: its prepared statements live and die with it."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self.in_flight = False
        #: time.monotonic() when the statement in flight was sent
        self._sent_at = 0.0
        #: a statement went out and its answer was not read (the connection failed first): the
        #: server may still run and commit it
        self.unanswered = False

    def send(self, sql: str, args: Mapping[str, Any]) -> None:
        """Send the statement (and its Sync) without waiting for its answer. Raises
        psycopg.Error."""
        self.send_dumped(self.dump(sql, args))

    def dump(self, sql: str, args: Mapping[str, Any], late: tuple[str, ...] = ()) -> Dumped:
        """The statement's parameters dumped, to be sent later; the ``late`` ones are given at
        :meth:`send_dumped` (their type must not change: the statement is prepared for it). Can
        run while another statement is in flight (it does not touch the connection)."""
        query, names = _numbered(sql)
        tx = Transformer.from_context(self._conn)
        values = list(tx.dump_sequence([args[n] for n in names], [PyFormat.BINARY] * len(names)))
        return Dumped(query, tuple(tx.types or ()), values, list(tx.formats or ()),
                      {n: names.index(n) for n in late if n in names}, tx)

    def send_dumped(self, d: Dumped, late: Mapping[str, Any] | None = None) -> None:
        """Send a dumped statement with its ``late`` parameters. Raises psycopg.Error."""
        assert not self.in_flight
        values = d.values
        for n, i in d.late.items():
            assert late is not None
            values[i] = d.tx.dump_sequence([late[n]], [PyFormat.BINARY])[0]
        name = self._prepared.get((d.query, d.types))
        try:
            if name is None:
                # asynchronously too: libpq's own PQprepare would wait for a server that
                # stopped answering without any limit
                name = f"agentik_{len(self._prepared)}".encode()
                self.in_flight = True
                self._sent_at = time.monotonic()
                self._pg.send_prepare(name, d.query, d.types)
                self._flush()
                for res in self._results():
                    _check(res, self._conn)
                self._prepared[(d.query, d.types)] = name
            self.unanswered = True  # from here on, the server may have it
            self._pg.send_query_prepared(name, values, d.formats)
            self.in_flight = True
            self._sent_at = time.monotonic()
            self._flush()
        except OSError as exc:  # the socket itself failed
            self.in_flight = False
            raise psycopg.OperationalError(f"connection lost: {exc}") from exc
        except BaseException:
            self.in_flight = False
            raise

    def wait(self) -> tuple[bytes | None, ...] | None:
        """The first row of the statement's answer (text values), or None when it returned no
        row. Raises psycopg.Error (the statement failed, or the connection did)."""
        assert self.in_flight
        try:
            row: tuple[bytes | None, ...] | None = None
            error: psycopg.Error | None = None
            for res in self._results():
                if res.status == pq.ExecStatus.TUPLES_OK:
                    if res.ntuples:
                        row = tuple(res.get_value(0, i) for i in range(res.nfields))
                elif res.status != pq.ExecStatus.COMMAND_OK and error is None:
                    error = _error(res, self._conn)
            if error is not None:
                raise error
            return row
        except OSError as exc:  # the socket itself failed
            raise psycopg.OperationalError(f"connection lost: {exc}") from exc
        finally:
            self.in_flight = False

    def _flush(self) -> None:
        while self._pg.flush():  # the rest of the message once the socket takes it
            self._select([], [self._pg.socket])

    def _results(self) -> list[pq.abc.PGresult]:
        """Every result of what was sent, once the server has answered all of it (bounded)."""
        pg = self._pg
        pg.consume_input()
        while pg.is_busy():
            self._select([pg.socket], [])
            pg.consume_input()
        out = []
        while (res := pg.get_result()) is not None:
            out.append(res)
        self.in_flight = self.unanswered = False
        return out

    def remaining(self) -> float | None:
        """Seconds left for the statement in flight to answer: the connection's
        ``answer_within`` (``pg.connect.Connection``) from when it was sent; None: no limit."""
        within: float | None = getattr(self._conn, "answer_within", None)
        if within is None:
            return None
        return max(0.0, self._sent_at + within - time.monotonic())

    def _select(self, read: list[int], write: list[int]) -> None:
        """Wait until the socket is ready, until ``answer_within`` seconds after the statement
        was sent; after that the server is taken for gone: the connection is closed and
        OperationalError raised (a statement already sent may still commit on the server: its
        outcome is unknown)."""
        ready = select.select(read, write, [], self.remaining())
        if not (ready[0] or ready[1]):
            raise gave_up(self._conn)


def _error(res: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> psycopg.Error:
    state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode("utf-8", "replace")
    try:
        cls: type[psycopg.Error] = psycopg.errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    message = (res.error_message or b"").decode(conn.info.encoding, "replace").strip()
    return cls(message, info=res, encoding=conn.info.encoding)


def _check(res: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> None:
    if res.status != pq.ExecStatus.COMMAND_OK:
        raise _error(res, conn)
