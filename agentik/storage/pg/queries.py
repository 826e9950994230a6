"""The PostgreSQL read side's SQL (``reads.Queries``), run by ``pg.reader.PgReader`` on a pooled
autocommit connection: each function is one statement (one snapshot) or one transaction.

Outbox rows carry offset 0 in their payload (the writer learns the offset only inside its
statement), so :func:`stamp` puts the row's offset into the cursor and the record before an
event is handed out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg

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
    CommonEvent,
    ConversationRecord,
    Created,
    Cursor,
    Message,
    MessageRecord,
    WorkingItem,
    decode_common_event,
    decode_message,
    decode_working_item,
    encode,
)

Conn = psycopg.Connection[Any]


def get_conversation(conn: Conn, conversation_id: str) -> ConversationRecord | None:
    row = conn.execute(f"SELECT {CONVERSATION_COLUMNS} FROM conversation WHERE id = %s",
                       (conversation_id,)).fetchone()
    return conversation_of(row) if row else None


def list_conversations(conn: Conn, offset: int, limit: int) -> list[ConversationRecord]:
    rows = conn.execute(f"SELECT {CONVERSATION_COLUMNS} FROM conversation "
                        "ORDER BY updated_at DESC, id OFFSET %s LIMIT %s", (offset, limit))
    return [conversation_of(r) for r in rows]


def get_messages(conn: Conn, conversation_id: str, after_seq: int, offset: int, limit: int
                 ) -> list[MessageRecord]:
    rows = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM message WHERE conversation_id = %s "
                        "AND seq > %s ORDER BY seq OFFSET %s LIMIT %s",
                        (conversation_id, after_seq, offset, limit))
    return [message_of(r) for r in rows]


def branched(conn: Conn, conversation_id: str) -> bool:
    """Whether the conversation's journal has a branch point (docs/PROTOCOL.md "Branches")."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM message WHERE conversation_id = %s "
                       "AND type = 'branch_point')", (conversation_id,)).fetchone()
    return bool(row and row[0])


def _where(**filters: object) -> str:
    """`` AND column = %(column)s`` for each filter given (not None): a plan for the filters at
    hand, not one that tests each parameter for NULL."""
    return "".join(f" AND {column} = %({column})s" for column, value in filters.items()
                   if value is not None)


def journal(conn: Conn, conversation_id: str | None, after_seq: int, up_to_seq: int | None,
            limit: int) -> list[MessageRecord]:
    upto = "" if up_to_seq is None else " AND seq <= %(upto)s"
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM message WHERE seq > %(after)s"
        f"{_where(conversation_id=conversation_id)}{upto} ORDER BY seq LIMIT %(limit)s",
        {"after": after_seq, "conversation_id": conversation_id, "upto": up_to_seq,
         "limit": limit})
    return [message_of(r) for r in rows]


def journal_count(conn: Conn, conversation_id: str | None, after_seq: int) -> int:
    row = conn.execute(
        f"SELECT count(*) FROM message WHERE seq > %(after)s"
        f"{_where(conversation_id=conversation_id)}",
        {"after": after_seq, "conversation_id": conversation_id}).fetchone()
    return int(row[0]) if row else 0


def working_memory(conn: Conn, conversation_id: str) -> list[tuple[int, WorkingItem]]:
    rows = conn.execute("SELECT order_idx, payload FROM working_memory WHERE conversation_id = %s "
                        "ORDER BY order_idx", (conversation_id,))
    return [(int(r[0]), decode_working_item(r[1])) for r in rows]


def queued_turns(conn: Conn, conversation_id: str) -> list[tuple[str, Message]]:
    rows = conn.execute("SELECT t.id, m.payload FROM turn t JOIN message m ON m.seq = t.seq "
                        "WHERE t.conversation_id = %s AND t.state = 'queued' ORDER BY t.seq",
                        (conversation_id,))
    return [(r[0], decode_message(r[1])) for r in rows]


def waiting_turn(conn: Conn, conversation_id: str) -> tuple[str, int] | None:
    row = conn.execute("SELECT id, seq FROM turn WHERE conversation_id = %s AND state = 'waiting' "
                       "ORDER BY seq LIMIT 1", (conversation_id,)).fetchone()
    return None if row is None else (row[0], int(row[1]))


def conversations_with_queued_turns(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT conversation_id FROM turn WHERE state IN ('queued', 'waiting') "
                        "GROUP BY conversation_id ORDER BY min(seq)")
    return [r[0] for r in rows]


def has_conversation_events(conn: Conn, conversation_id: str, after: int) -> bool:
    return conn.execute('SELECT 1 FROM outbox WHERE conversation_id = %s AND "offset" > %s '
                        "LIMIT 1", (conversation_id, after)).fetchone() is not None


def idempotency_key(conn: Conn, key: str, now: float) -> tuple[str, str] | None:
    row = conn.execute("SELECT fingerprint, result_id FROM idempotency_key "
                       "WHERE key = %s AND expires_at > %s", (key, now)).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def get_a2a_task(conn: Conn, task_id: str) -> A2ATaskRow | None:
    row = conn.execute(f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE id = %s",
                       (task_id,)).fetchone()
    return a2a_task_of(row) if row else None


def latest_a2a_task_of_context(conn: Conn, context_id: str) -> A2ATaskRow | None:
    row = conn.execute(f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE context_id = %s "
                       "ORDER BY first_seq DESC LIMIT 1", (context_id,)).fetchone()
    return a2a_task_of(row) if row else None


def list_a2a_tasks(conn: Conn, context_id: str | None, state: str | None,
                   before_first_seq: int | None, limit: int, user: str | None = None
                   ) -> tuple[list[A2ATaskRow], int]:
    """One statement, so one snapshot: the page, and how many match the filters (counted
    before the page's own bound). ``user``: only the tasks of that user's conversations."""
    before = "" if before_first_seq is None else " AND first_seq < %(before)s"
    owned = "" if user is None else (" AND conversation_id IN (SELECT conversation_id FROM "
                                     "conversation_user WHERE user_id = %(user)s)")
    rows = conn.execute(
        f"WITH t AS (SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE true"
        f"{_where(context_id=context_id, state=state)}{owned}) "
        f"SELECT (SELECT count(*) FROM t), p.* FROM (SELECT 1) one LEFT JOIN LATERAL "
        f"(SELECT * FROM t WHERE true{before} ORDER BY first_seq DESC LIMIT %(limit)s) p ON true",
        {"context_id": context_id, "state": state, "before": before_first_seq,
         "limit": limit, "user": user}).fetchall()
    total = int(rows[0][0]) if rows else 0
    return [a2a_task_of(r[1:]) for r in rows if r[1] is not None], total


def a2a_tasks_in_states(conn: Conn, states: tuple[str, ...]) -> list[A2ATaskRow]:
    rows = conn.execute(f"SELECT {A2A_TASK_COLUMNS} FROM a2a_task WHERE state = ANY(%s) "
                        "ORDER BY first_seq", (list(states),))
    return [a2a_task_of(r) for r in rows]


# --- the outbox ------------------------------------------------------------------------------------


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
    conn: Conn, after: int, conversation_id: str | None, kind: str | None,
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


# --- users (docs/USERS.md) -----------------------------------------------------------------------

#: the conversations of one user: a sub-select of every read scoped to a user
_OWNED = "SELECT conversation_id FROM conversation_user WHERE user_id = %(user)s"


def users_of(conn: Conn, conversation_ids: list[str]) -> dict[str, str]:
    """conversation id -> its user, for those of ``conversation_ids`` that have one (deleted
    ones too: the row outlives the conversation)."""
    rows = conn.execute("SELECT conversation_id, user_id FROM conversation_user "
                        "WHERE conversation_id = ANY(%s)", (conversation_ids,))
    return {r[0]: r[1] for r in rows}


def list_conversations_of(conn: Conn, user: str, offset: int, limit: int
                          ) -> list[ConversationRecord]:
    rows = conn.execute(f"SELECT {CONVERSATION_COLUMNS} FROM conversation WHERE id IN ({_OWNED}) "
                        "ORDER BY updated_at DESC, id OFFSET %(offset)s LIMIT %(limit)s",
                        {"user": user, "offset": offset, "limit": limit})
    return [conversation_of(r) for r in rows]


def journal_of(conn: Conn, user: str, after_seq: int, up_to_seq: int | None, limit: int
               ) -> list[MessageRecord]:
    up_to = "" if up_to_seq is None else " AND seq <= %(up_to)s"
    rows = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM message WHERE seq > %(after)s"
                        f" AND conversation_id IN ({_OWNED}){up_to} ORDER BY seq LIMIT %(limit)s",
                        {"user": user, "after": after_seq, "up_to": up_to_seq, "limit": limit})
    return [message_of(r) for r in rows]


def journal_count_of(conn: Conn, user: str, after_seq: int) -> int:
    row = conn.execute(f"SELECT count(*) FROM message WHERE seq > %(after)s AND conversation_id "
                       f"IN ({_OWNED})", {"user": user, "after": after_seq}).fetchone()
    return int(row[0]) if row else 0


def user_standing(conn: Conn, user: str, day: str) -> tuple[int, int, int]:
    """(conversations kept, turns accepted and not ended, tokens used on ``day``), one read."""
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM conversation WHERE id IN ({_OWNED})), "
        f"(SELECT count(*) FROM turn WHERE conversation_id IN ({_OWNED})), "
        "(SELECT COALESCE(sum(tokens), 0) FROM user_usage WHERE user_id = %(user)s "
        "AND day = %(day)s)", {"user": user, "day": day}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


# --- webhooks (docs/WEBHOOKS.md) -----------------------------------------------------------------


def webhooks(conn: Conn, task_id: str | None) -> list[WebhookRow]:
    """Every subscription (None), or the A2A push configs of one task, oldest first."""
    sql, args = f"SELECT {WEBHOOK_COLUMNS} FROM webhook", tuple[str, ...]()
    if task_id is not None:
        sql, args = sql + " WHERE task_id = %s", (task_id,)
    return [webhook_of(r) for r in conn.execute(sql + " ORDER BY created_at, id", args)]


def get_webhook(conn: Conn, webhook_id: str) -> WebhookRow | None:
    row = conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhook WHERE id = %s",
                       (webhook_id,)).fetchone()
    return webhook_of(row) if row else None


def webhook_deliveries(conn: Conn, webhook_id: str, limit: int) -> list[DeliveryRow]:
    """The subscription's newest delivery log lines, newest first."""
    return [delivery_of(r) for r in conn.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM webhook_delivery WHERE webhook_id = %s "
        "ORDER BY n DESC LIMIT %s", (webhook_id, limit))]
