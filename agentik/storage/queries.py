"""Read side: plain synchronous SQL over read-only connections, run in worker threads by
:class:`Reader`. WAL lets these run while the writer commits; each function reads inside one
transaction, so what it returns is one consistent snapshot of the database."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import trio

from agentik.errors import StorageError
from agentik.storage.writer import StoredEvent, open_connection, row_to_conversation
from agentik.wire import (
    ConversationRecord,
    MessageRecord,
    WorkingItem,
    decode_message,
    decode_working_item,
)

P = ParamSpec("P")
R = TypeVar("R")

_CONVERSATION_COLUMNS = "id, title, is_temporal, created_at, updated_at, seq"


def _message_row(row: tuple[Any, ...]) -> MessageRecord:
    return MessageRecord(
        id=row[0], seq=row[1], conversation_id=row[2], created_at=row[3],
        message=decode_message(row[4]),
    )


def get_conversation(conn: sqlite3.Connection, conversation_id: str) -> ConversationRecord | None:
    row = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversation WHERE id=?", (conversation_id,)
    ).fetchone()
    return row_to_conversation(row) if row else None


def list_conversations(conn: sqlite3.Connection, offset: int, limit: int) -> list[ConversationRecord]:
    rows = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversation ORDER BY updated_at DESC, id "
        "LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()
    return [row_to_conversation(r) for r in rows]


def get_messages(
    conn: sqlite3.Connection, conversation_id: str, after_seq: int, offset: int, limit: int
) -> list[MessageRecord]:
    rows = conn.execute(
        "SELECT id, seq, conversation_id, created_at, payload FROM message "
        "WHERE conversation_id=? AND seq > ? ORDER BY seq LIMIT ? OFFSET ?",
        (conversation_id, after_seq, limit, offset),
    ).fetchall()
    return [_message_row(r) for r in rows]


def journal(
    conn: sqlite3.Connection,
    conversation_id: str | None,
    after_seq: int,
    up_to_seq: int | None,
    limit: int,
) -> list[MessageRecord]:
    sql = "SELECT id, seq, conversation_id, created_at, payload FROM message WHERE seq > ?"
    args: list[Any] = [after_seq]
    if conversation_id is not None:
        sql += " AND conversation_id=?"
        args.append(conversation_id)
    if up_to_seq is not None:
        sql += " AND seq <= ?"
        args.append(up_to_seq)
    sql += " ORDER BY seq LIMIT ?"
    args.append(limit)
    return [_message_row(r) for r in conn.execute(sql, args).fetchall()]


def journal_count(conn: sqlite3.Connection, conversation_id: str | None, after_seq: int) -> int:
    if conversation_id is None:
        row = conn.execute("SELECT COUNT(*) FROM message WHERE seq > ?", (after_seq,)).fetchone()
    else:
        row = conn.execute(
            "SELECT COUNT(*) FROM message WHERE conversation_id=? AND seq > ?",
            (conversation_id, after_seq),
        ).fetchone()
    return int(row[0])


def working_memory(conn: sqlite3.Connection, conversation_id: str) -> list[tuple[int, WorkingItem]]:
    rows = conn.execute(
        "SELECT order_idx, payload FROM working_memory WHERE conversation_id=? ORDER BY order_idx",
        (conversation_id,),
    ).fetchall()
    return [(r[0], decode_working_item(r[1])) for r in rows]


def outbox_page(
    conn: sqlite3.Connection,
    after: int,
    conversation_id: str | None,
    kind: str | None,
    limit: int,
) -> tuple[int, int, list[StoredEvent]]:
    """One consistent read of the outbox: (oldest retained offset, highest stored offset, rows
    with offset > after matching the filter, at most ``limit``)."""
    conn.execute("BEGIN")
    try:
        # One aggregate per SELECT: SQLite's min/max optimisation (one index probe) only applies
        # then; MIN and MAX together scan the whole outbox (8 ms per page at 100k rows).
        (lo,) = conn.execute('SELECT MIN("offset") FROM outbox').fetchone()
        next_seq = int(conn.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0])
        sql = 'SELECT "offset", conversation_id, kind, payload FROM outbox WHERE "offset" > ?'
        args: list[Any] = [after]
        if conversation_id is not None:
            sql += " AND conversation_id=?"
            args.append(conversation_id)
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        sql += ' ORDER BY "offset" LIMIT ?'
        args.append(limit)
        rows = conn.execute(sql, args).fetchall()
    finally:
        conn.execute("COMMIT")
    head = next_seq - 1
    oldest = lo if lo is not None else next_seq
    # Not decoded here: StoredEvent decodes ``event`` on first use (SSE and WebSocket never do).
    events = [StoredEvent(r[0], r[1], r[2], None, bytes(r[3])) for r in rows]
    return oldest, head, events


def has_conversation_events(conn: sqlite3.Connection, conversation_id: str, after: int) -> bool:
    row = conn.execute(
        'SELECT 1 FROM outbox WHERE conversation_id=? AND "offset" > ? LIMIT 1',
        (conversation_id, after),
    ).fetchone()
    return row is not None


# --- A2A tasks (docs/A2A.md) ------------------------------------------------------------------------


def idempotency_key(conn: sqlite3.Connection, key: str, now: float) -> tuple[str, str] | None:
    """(fingerprint, result_id) stored under an Idempotency-Key that has not expired."""
    row = conn.execute(
        "SELECT fingerprint, result_id FROM idempotency_key WHERE key = ? AND expires_at > ?",
        (key, now),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


@dataclass(frozen=True, slots=True)
class A2ATaskRow:
    """One stored A2A task: ``payload`` is its A2A Task JSON; ``first_seq`` the offset of its
    first event, ``seq`` of its last change."""

    id: str
    context_id: str
    conversation_id: str | None
    state: str
    created_at: float
    updated_at: float
    first_seq: int
    seq: int
    payload: bytes


_A2A_TASK_COLUMNS = (
    "id, context_id, conversation_id, state, created_at, updated_at, first_seq, seq, payload"
)


def _a2a_task_row(row: tuple[Any, ...]) -> A2ATaskRow:
    return A2ATaskRow(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], bytes(row[8]))


def get_a2a_task(conn: sqlite3.Connection, task_id: str) -> A2ATaskRow | None:
    row = conn.execute(
        f"SELECT {_A2A_TASK_COLUMNS} FROM a2a_task WHERE id=?", (task_id,)
    ).fetchone()
    return _a2a_task_row(row) if row else None


def latest_a2a_task_of_context(conn: sqlite3.Connection, context_id: str) -> A2ATaskRow | None:
    """The context's most recently created task (its conversation is the context's), or None for
    a context no task has used yet."""
    row = conn.execute(
        f"SELECT {_A2A_TASK_COLUMNS} FROM a2a_task WHERE context_id=? "
        "ORDER BY first_seq DESC LIMIT 1",
        (context_id,),
    ).fetchone()
    return _a2a_task_row(row) if row else None


def list_a2a_tasks(
    conn: sqlite3.Connection,
    context_id: str | None,
    state: str | None,
    before_first_seq: int | None,
    limit: int,
) -> tuple[list[A2ATaskRow], int]:
    """One consistent read: (tasks matching the filters, newest first by creation, created before
    ``before_first_seq`` if given, at most ``limit``; how many match the filters in all)."""
    where = []
    args: list[Any] = []
    if context_id is not None:
        where.append("context_id=?")
        args.append(context_id)
    if state is not None:
        where.append("state=?")
        args.append(state)
    cond = (" WHERE " + " AND ".join(where)) if where else ""
    conn.execute("BEGIN")
    try:
        (total,) = conn.execute(f"SELECT COUNT(*) FROM a2a_task{cond}", args).fetchone()
        page_cond = cond
        page_args = list(args)
        if before_first_seq is not None:
            page_cond += (" AND " if cond else " WHERE ") + "first_seq < ?"
            page_args.append(before_first_seq)
        rows = conn.execute(
            f"SELECT {_A2A_TASK_COLUMNS} FROM a2a_task{page_cond} ORDER BY first_seq DESC LIMIT ?",
            [*page_args, limit],
        ).fetchall()
    finally:
        conn.execute("COMMIT")
    return [_a2a_task_row(r) for r in rows], int(total)


def a2a_tasks_in_states(conn: sqlite3.Connection, states: tuple[str, ...]) -> list[A2ATaskRow]:
    """Every task in one of ``states`` (start-up: the tasks a dead process left running)."""
    marks = ", ".join("?" for _ in states)
    rows = conn.execute(
        f"SELECT {_A2A_TASK_COLUMNS} FROM a2a_task WHERE state IN ({marks}) ORDER BY first_seq",
        states,
    ).fetchall()
    return [_a2a_task_row(r) for r in rows]


class Reader:
    """A small pool of read connections used from worker threads.

    ``run(fn, *args)`` runs ``fn(conn, *args)`` in a thread with a pooled connection and converts
    sqlite3 errors to StorageError. Concurrency is bounded by a CapacityLimiter so a burst of reads
    cannot take every worker thread.
    """

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

    def _call(self, fn: Callable[..., R], *args: Any) -> R:
        conn = self._acquire()
        try:
            return fn(conn, *args)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            raise StorageError(f"read failed: {exc}") from exc
        finally:
            self._release(conn)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)

    async def outbox_page(
        self, after: int, conversation_id: str | None, kind: str | None, limit: int
    ) -> tuple[int, int, list[StoredEvent]]:
        return await self.run(outbox_page, after, conversation_id, kind, limit)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
