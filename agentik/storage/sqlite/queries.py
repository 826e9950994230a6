"""The SQLite read side's SQL (``reads.Queries``): plain synchronous functions over a read-only
connection, run in worker threads by ``sqlite.reader.Reader``. WAL lets these run while the
writer commits; each reads inside one transaction, so what it returns is one consistent
snapshot of the database."""

from __future__ import annotations

import sqlite3
from typing import Any

from agentik.storage.types import (
    A2A_TASK_COLUMNS,
    CONVERSATION_COLUMNS,
    DELIVERY_COLUMNS,
    MESSAGE_COLUMNS,
    WEBHOOK_COLUMNS,
    A2ATaskRow,
    DeliveryRow,
    StoredEvent,
    WebhookRow,
    a2a_task_of,
    conversation_of,
    delivery_of,
    message_of,
    webhook_of,
)
from agentik.wire import (
    ConversationRecord,
    Message,
    MessageRecord,
    WorkingItem,
    decode_message,
    decode_working_item,
)


def get_conversation(conn: sqlite3.Connection, conversation_id: str) -> ConversationRecord | None:
    row = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversation WHERE id=?", (conversation_id,)
    ).fetchone()
    return conversation_of(row) if row else None


def list_conversations(conn: sqlite3.Connection, offset: int, limit: int) -> list[ConversationRecord]:
    rows = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversation ORDER BY updated_at DESC, id "
        "LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()
    return [conversation_of(r) for r in rows]


def get_messages(
    conn: sqlite3.Connection, conversation_id: str, after_seq: int, offset: int, limit: int
) -> list[MessageRecord]:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM message "
        "WHERE conversation_id=? AND seq > ? ORDER BY seq LIMIT ? OFFSET ?",
        (conversation_id, after_seq, limit, offset),
    ).fetchall()
    return [message_of(r) for r in rows]


def branched(conn: sqlite3.Connection, conversation_id: str) -> bool:
    """Whether the conversation's journal has a branch point (docs/PROTOCOL.md "Branches")."""
    return conn.execute("SELECT 1 FROM message WHERE conversation_id=? AND type='branch_point' "
                        "LIMIT 1", (conversation_id,)).fetchone() is not None


def journal(
    conn: sqlite3.Connection,
    conversation_id: str | None,
    after_seq: int,
    up_to_seq: int | None,
    limit: int,
) -> list[MessageRecord]:
    sql = f"SELECT {MESSAGE_COLUMNS} FROM message WHERE seq > ?"
    args: list[Any] = [after_seq]
    if conversation_id is not None:
        sql += " AND conversation_id=?"
        args.append(conversation_id)
    if up_to_seq is not None:
        sql += " AND seq <= ?"
        args.append(up_to_seq)
    sql += " ORDER BY seq LIMIT ?"
    args.append(limit)
    return [message_of(r) for r in conn.execute(sql, args).fetchall()]


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


def queued_turns(conn: sqlite3.Connection, conversation_id: str) -> list[tuple[str, Message]]:
    """The conversation's accepted turns that have not started (their message stored, queued
    behind a turn when the process stopped), in the order they came: (turn id, its message)."""
    rows = conn.execute(
        "SELECT t.id, m.payload FROM turn t JOIN message m ON m.seq = t.seq "
        "WHERE t.conversation_id=? AND t.state='queued' ORDER BY t.seq",
        (conversation_id,),
    ).fetchall()
    return [(r[0], decode_message(r[1])) for r in rows]


def waiting_turn(conn: sqlite3.Connection, conversation_id: str) -> tuple[str, int] | None:
    """The conversation's turn waiting for a person, if any: (turn id, its message's seq)."""
    row = conn.execute("SELECT id, seq FROM turn WHERE conversation_id=? AND state='waiting' "
                       "ORDER BY seq LIMIT 1", (conversation_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def conversations_with_queued_turns(conn: sqlite3.Connection) -> list[str]:
    """Conversations with queued turns (see :func:`queued_turns`) or a turn waiting for a person
    (:func:`waiting_turn`), oldest turn first."""
    rows = conn.execute(
        "SELECT conversation_id FROM turn WHERE state IN ('queued', 'waiting') "
        "GROUP BY conversation_id ORDER BY MIN(seq)").fetchall()
    return [r[0] for r in rows]


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


def get_a2a_task(conn: sqlite3.Connection, task_id: str) -> A2ATaskRow | None:
    row = conn.execute(
        f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE id=?", (task_id,)
    ).fetchone()
    return a2a_task_of(row) if row else None


def latest_a2a_task_of_context(conn: sqlite3.Connection, context_id: str) -> A2ATaskRow | None:
    """The context's most recently created task (its conversation is the context's), or None for
    a context no task has used yet."""
    row = conn.execute(
        f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE context_id=? "
        "ORDER BY first_seq DESC LIMIT 1",
        (context_id,),
    ).fetchone()
    return a2a_task_of(row) if row else None


def list_a2a_tasks(
    conn: sqlite3.Connection,
    context_id: str | None,
    state: str | None,
    before_first_seq: int | None,
    limit: int,
    user: str | None = None,
) -> tuple[list[A2ATaskRow], int]:
    """One consistent read: (tasks matching the filters, newest first by creation, created before
    ``before_first_seq`` if given, at most ``limit``; how many match the filters in all).
    ``user``: only the tasks of that user's conversations."""
    where = []
    args: list[Any] = []
    if user is not None:
        where.append(f"conversation_id IN ({_OWNED})")
        args.append(user)
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
            f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task{page_cond} ORDER BY first_seq DESC LIMIT ?",
            [*page_args, limit],
        ).fetchall()
    finally:
        conn.execute("COMMIT")
    return [a2a_task_of(r) for r in rows], int(total)


def a2a_tasks_in_states(conn: sqlite3.Connection, states: tuple[str, ...]) -> list[A2ATaskRow]:
    """Every task in one of ``states`` (start-up: the tasks a dead process left running)."""
    marks = ", ".join("?" for _ in states)
    rows = conn.execute(
        f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE state IN ({marks}) ORDER BY first_seq",
        states,
    ).fetchall()
    return [a2a_task_of(r) for r in rows]


# --- users (docs/USERS.md) -----------------------------------------------------------------------

#: the conversations of one user: a sub-select of every read scoped to a user
_OWNED = "SELECT conversation_id FROM conversation_user WHERE user_id=?"


def users_of(conn: sqlite3.Connection, conversation_ids: list[str]) -> dict[str, str]:
    """conversation id -> its user, for those of ``conversation_ids`` that have one (deleted
    ones too: the row outlives the conversation)."""
    out: dict[str, str] = {}
    for i in range(0, len(conversation_ids), 500):  # under SQLite's bound-parameter cap
        chunk = conversation_ids[i:i + 500]
        marks = ", ".join("?" for _ in chunk)
        out.update(conn.execute(
            "SELECT conversation_id, user_id FROM conversation_user "
            f"WHERE conversation_id IN ({marks})", chunk).fetchall())
    return out


def list_conversations_of(
    conn: sqlite3.Connection, user: str, offset: int, limit: int
) -> list[ConversationRecord]:
    rows = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversation WHERE id IN ({_OWNED}) "
        "ORDER BY updated_at DESC, id LIMIT ? OFFSET ?", (user, limit, offset)).fetchall()
    return [conversation_of(r) for r in rows]


def journal_of(conn: sqlite3.Connection, user: str, after_seq: int, up_to_seq: int | None,
               limit: int) -> list[MessageRecord]:
    sql = f"SELECT {MESSAGE_COLUMNS} FROM message WHERE seq > ? AND conversation_id IN ({_OWNED})"
    args: list[Any] = [after_seq, user]
    if up_to_seq is not None:
        sql += " AND seq <= ?"
        args.append(up_to_seq)
    sql += " ORDER BY seq LIMIT ?"
    args.append(limit)
    return [message_of(r) for r in conn.execute(sql, args).fetchall()]


def journal_count_of(conn: sqlite3.Connection, user: str, after_seq: int) -> int:
    row = conn.execute(f"SELECT COUNT(*) FROM message WHERE seq > ? AND conversation_id IN "
                       f"({_OWNED})", (after_seq, user)).fetchone()
    return int(row[0])


def user_standing(conn: sqlite3.Connection, user: str, day: str) -> tuple[int, int, int]:
    """(conversations kept, turns accepted and not ended, tokens used on ``day``), one read."""
    row = conn.execute(
        f"SELECT (SELECT COUNT(*) FROM conversation WHERE id IN ({_OWNED})), "
        f"(SELECT COUNT(*) FROM turn WHERE conversation_id IN ({_OWNED})), "
        "(SELECT COALESCE(SUM(tokens), 0) FROM user_usage WHERE user_id=? AND day=?)",
        (user, user, user, day)).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


# --- webhooks (docs/WEBHOOKS.md) -----------------------------------------------------------------


def webhooks(conn: sqlite3.Connection, task_id: str | None) -> list[WebhookRow]:
    """Every subscription (None), or the A2A push configs of one task, oldest first."""
    sql, args = f"SELECT {WEBHOOK_COLUMNS} FROM webhook", tuple[str, ...]()
    if task_id is not None:
        sql, args = sql + " WHERE task_id = ?", (task_id,)
    return [webhook_of(r) for r in conn.execute(sql + " ORDER BY created_at, id", args)]


def get_webhook(conn: sqlite3.Connection, webhook_id: str) -> WebhookRow | None:
    row = conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhook WHERE id = ?",
                       (webhook_id,)).fetchone()
    return webhook_of(row) if row else None


def webhook_deliveries(conn: sqlite3.Connection, webhook_id: str, limit: int) -> list[DeliveryRow]:
    """The subscription's newest delivery log lines, newest first."""
    return [delivery_of(r) for r in conn.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM webhook_delivery WHERE webhook_id = ? "
        "ORDER BY n DESC LIMIT ?", (webhook_id, limit))]
