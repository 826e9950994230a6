"""The SQLite engine's side of the ops (``storage/apply.py``): :class:`SqliteTarget`, each
primitive as SQL inside the writer's batch transaction (``writer.Writer``), and
:func:`apply_all`, which runs a batch's ops on it. The rows are ``sqlite.rows``'. An op refused
on purpose raises AgentikError: the batch's SAVEPOINT rolls back its rows and hands its seqs
back, so here a check may also come after a write (the conversation's existence is found by the
UPDATE that bumps its seq).
"""

from __future__ import annotations

import sqlite3

import msgspec

from agentik.limits import utc_day
from agentik.storage import apply, ops
from agentik.storage.sqlite.rows import (
    KIND_INDEX,
    KIND_NAMES,
    QUEUED,
    RUNNING,
    TYPE_INDEX,
    Tx,
    bump,
    conversation_exists,
    emit,
    not_found,
    read_record,
    write_rows,
)
from agentik.storage.target import RecordEvent, Target
from agentik.storage.types import MESSAGE_COLUMNS, StoredEvent, message_of
from agentik.wire import (
    AgentEvent,
    CommonEvent,
    ConversationRecord,
    Cursor,
    DurableEvent,
    Message,
    MessageRecord,
    WorkingItem,
    decode_message,
    decode_working_item,
    encode,
)

#: where a journal event's bytes carry the record's message: right after this (the first such
#: key: the ones before it are the cursor's, the conversation's, the event's type and the
#: record's id, seq, conversation and time; an escaped string never holds this sequence), up to
#: the record's, the event's and the CommonEvent's closing braces (each has it last)
_MESSAGE = b'"message":'
#: a payload as JSON (``wire.encode``'s) into a bytearray: what a payload column is bound as.
#: Python's sqlite3 binds a bytearray as it is but sends ``bytes`` (and None) through its adapter
#: look-up first, which fails by way of an AttributeError raised and formatted inside (~3k
#: instructions a parameter)
_encode_into = msgspec.json.Encoder().encode_into


class SqliteTarget:
    """``Target`` (``storage/target.py``) on the writer's connection, in the batch
    transaction ``tx`` (set for each batch: one target a writer, no object a batch): a journal
    record and a result are the values themselves."""

    __slots__ = ("conn", "now", "tx")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.tx = Tx(epoch="", next_seq=0, now=0.0)
        self.now = 0.0

    # --- checks and reads -----------------------------------------------------------------------

    def require(self, conversation_id: str) -> None:
        if conversation_id not in self.tx.seqs:  # found by this transaction, not deleted since
            conversation_exists(self.conn, conversation_id)

    def exists(self, conversation_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM conversation WHERE id=?",
                                 (conversation_id,)).fetchone() is not None

    def idempotency(self, key: str) -> tuple[str, str] | None:
        self.conn.execute("DELETE FROM idempotency_key WHERE expires_at <= ?", (self.now,))
        row = self.conn.execute("SELECT fingerprint, result_id FROM idempotency_key WHERE key=?",
                                (key,)).fetchone()
        return None if row is None else (row[0], row[1])

    def task_seq(self, task_id: str) -> int | str | None:
        row = self.conn.execute("SELECT seq FROM a2a_task WHERE id=?", (task_id,)).fetchone()
        return None if row is None else int(row[0])

    def open_turns(self, conversation_id: str | None) -> list[tuple[str, str]]:
        sql = ("SELECT t.conversation_id, t.id FROM turn t JOIN conversation c ON c.id = "
               "t.conversation_id WHERE t.state = 'running'")
        args: tuple[str, ...] = ()
        if conversation_id is not None:
            sql += " AND t.conversation_id = ?"
            args = (conversation_id,)
        return [(r[0], r[1]) for r in self.conn.execute(sql + " ORDER BY t.seq", args)]

    def turn_calls(self, conversation_id: str, turn_id: str) -> list[Message]:
        rows = self.conn.execute(
            "SELECT m.payload FROM message m JOIN turn t ON t.conversation_id = m.conversation_id "
            "AND t.id = ? WHERE m.conversation_id = ? AND m.seq > t.seq "
            "AND m.type IN ('tool_call', 'tool_result') ORDER BY m.seq", (turn_id, conversation_id))
        return [decode_message(r[0]) for r in rows]

    def temporary(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT id FROM conversation WHERE is_temporal=1")]

    def stored_records(self, ids: tuple[str, ...]) -> list[MessageRecord]:
        if not ids:
            return []
        rows = {r[0]: r for r in self.conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM message WHERE id IN ({','.join('?' * len(ids))})", ids)}
        return [message_of(r) for i in ids if (r := rows.get(i))]

    def turn_open(self, conversation_id: str, turn_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM turn WHERE conversation_id=? AND id=?",
                                 (conversation_id, turn_id)).fetchone() is not None

    def started(self, conversation_id: str, turn_id: str) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM working_memory WHERE conversation_id=? AND source_message_id=?",
            (conversation_id, turn_id)).fetchone() is not None

    def compacted(self, op: ops.Compact) -> bool:
        rows = self.conn.execute(
            "SELECT payload FROM working_memory WHERE conversation_id=? AND order_idx < ? AND "
            "order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=?) "
            "ORDER BY order_idx LIMIT 2",
            (op.conversation_id, op.before_order_idx, op.conversation_id))
        return ops.compacted(op, [decode_working_item(r[0]) for r in rows])

    # --- writes ---------------------------------------------------------------------------------

    def alloc(self) -> int:
        tx = self.tx
        seq = tx.next_seq
        tx.next_seq = seq + 1
        return seq

    def emit(self, seq: int, conversation_id: str | None,
             event: DurableEvent | AgentEvent) -> None:
        emit(self.tx, seq, conversation_id, event)

    def journal(self, conversation_id: str, message_id: str, message: Message,
                event: type[RecordEvent]) -> MessageRecord:
        """The message's record at the next seq, its row pending in ``tx.messages``, and its
        event (``event``) emitted: the event is encoded once and the row's payload is the
        message's part of it (encoding the message again would give the same bytes). (The
        seq's allocation, ``bump``'s note of a conversation already found and ``emit`` inline:
        this runs for every message.)"""
        tx = self.tx
        seq = tx.next_seq
        tx.next_seq = seq + 1
        if conversation_id in tx.seqs:
            tx.seqs[conversation_id] = seq
        else:
            bump(self.conn, tx, conversation_id, seq)
        record = MessageRecord(id=message_id, seq=seq, conversation_id=conversation_id,
                               created_at=tx.now, message=message)
        common = CommonEvent(cursor=Cursor(epoch=tx.epoch, offset=seq),
                             conversation_id=conversation_id, event=event(record=record))
        raw = encode(common)
        stored = bytearray(raw)  # the outbox row's payload, and the journal row's cut from it
        tx.messages += (seq, message_id, conversation_id, TYPE_INDEX[type(message)],
                        stored[raw.index(_MESSAGE) + 10:-3])
        index = KIND_INDEX[event]
        tx.events.append(StoredEvent(seq, conversation_id, KIND_NAMES[index], common, raw))
        tx.outbox += (seq, conversation_id, index, stored)
        return record

    def new_conversation(self, op: ops.CreateConversation, seq: int) -> ConversationRecord:
        now = self.now
        self.conn.execute(
            "INSERT INTO conversation (id, title, is_temporal, created_at, updated_at, seq, "
            "agent, instructions) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (op.conversation_id, op.title, int(op.is_temporal), now, now, seq, op.agent,
             op.instructions))
        self.tx.seqs[op.conversation_id] = 0  # its row has its latest seq
        return ConversationRecord(id=op.conversation_id, title=op.title,
                                  is_temporal=op.is_temporal, created_at=now, updated_at=now,
                                  seq=seq, agent=op.agent, instructions=op.instructions)

    def rename(self, conversation_id: str, title: str | None, seq: int) -> None:
        cur = self.conn.execute("UPDATE conversation SET title=?, updated_at=?, seq=? WHERE id=?",
                                (title, self.now, seq, conversation_id))
        if cur.rowcount == 0:
            raise not_found(conversation_id)
        self.tx.seqs[conversation_id] = 0  # its row has its latest seq

    def bump(self, conversation_id: str, seq: int, *, touch: bool = False) -> None:
        bump(self.conn, self.tx, conversation_id, seq, self.now if touch else None)

    def remember(self, conversation_id: str, item: WorkingItem, source: str | None) -> None:
        payload = bytearray()  # bound as a bytearray: see ``_encode_into``
        _encode_into(item, payload)
        self.conn.execute(
            "INSERT INTO working_memory "
            "(conversation_id, order_idx, source_message_id, created_at, payload) VALUES (?, "
            "(SELECT COALESCE(MAX(order_idx), 0) + 1 FROM working_memory WHERE conversation_id=?),"
            " ?, ?, ?)", (conversation_id, conversation_id, source, self.now, payload))

    def forget(self, conversation_id: str, from_idx: int) -> None:
        self.conn.execute("DELETE FROM working_memory WHERE conversation_id=? AND order_idx >= ?",
                          (conversation_id, from_idx))

    def compact(self, conversation_id: str, before_idx: int, summary: WorkingItem | None) -> None:
        conn = self.conn
        first = conn.execute(
            "SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=? AND order_idx > "
            "(SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=?)",
            (conversation_id, conversation_id)).fetchone()[0]
        conn.execute(
            "DELETE FROM working_memory WHERE conversation_id=? AND order_idx >= ? AND order_idx < ?",
            (conversation_id, first if first is not None else before_idx, before_idx))
        if summary is not None and first is not None:
            conn.execute(
                "INSERT INTO working_memory "
                "(conversation_id, order_idx, source_message_id, created_at, payload) "
                "VALUES (?, ?, NULL, ?, ?)", (conversation_id, first, self.now, encode(summary)))

    def open_turn(self, conversation_id: str, turn_id: str, running: bool,
                  user: MessageRecord) -> None:
        self.tx.turns += (conversation_id, turn_id, RUNNING if running else QUEUED, user.seq)

    def run_turn(self, conversation_id: str, turn_id: str, *, waiting: bool = False) -> None:
        self.conn.execute("UPDATE turn SET state=? WHERE conversation_id=? AND id=?",
                          ("waiting" if waiting else "running", conversation_id, turn_id))

    def close_turn(self, conversation_id: str, turn_id: str) -> None:
        self.conn.execute("DELETE FROM turn WHERE conversation_id=? AND id=?",
                          (conversation_id, turn_id))

    def drop_turns(self, conversation_id: str | None) -> None:
        gone = "(state = 'running' OR conversation_id NOT IN (SELECT id FROM conversation))"
        if conversation_id is None:
            self.conn.execute(f"DELETE FROM turn WHERE {gone}")
        else:
            self.conn.execute(f"DELETE FROM turn WHERE conversation_id = ? AND {gone}",
                              (conversation_id,))

    def drop_conversation(self, conversation_id: str) -> str:
        row = self.conn.execute("SELECT agent FROM conversation WHERE id=?",
                                (conversation_id,)).fetchone()
        # its A2A tasks' push configs (docs/WEBHOOKS.md) and their logs go with the tasks
        tasks = "SELECT id FROM a2a_task WHERE conversation_id=?"
        self.conn.execute("DELETE FROM webhook_delivery WHERE webhook_id IN (SELECT id FROM "
                          f"webhook WHERE task_id IN ({tasks}))", (conversation_id,))
        self.conn.execute(f"DELETE FROM webhook WHERE task_id IN ({tasks})", (conversation_id,))
        for table in ("message", "working_memory", "turn", "a2a_task"):  # its A2A tasks go too
            self.conn.execute(f"DELETE FROM {table} WHERE conversation_id=?", (conversation_id,))
        self.conn.execute("DELETE FROM conversation WHERE id=?", (conversation_id,))
        self.tx.seqs.pop(conversation_id, None)
        return str(row[0]) if row else "default"

    def put_task(self, op: ops.PutA2ATask, seq: int) -> None:
        self.conn.execute(
            "INSERT INTO a2a_task (id, context_id, conversation_id, state, created_at, updated_at, "
            "first_seq, seq, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?6, ?7) "
            "ON CONFLICT (id) DO UPDATE SET conversation_id=?3, state=?4, updated_at=?5, seq=?6, "
            "payload=?7",
            (op.task_id, op.context_id, op.conversation_id, op.state, self.now, seq, op.task))

    def webhook_exists(self, webhook_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM webhook WHERE id=?",
                                 (webhook_id,)).fetchone() is not None

    def put_webhook(self, op: ops.PutWebhook, new: bool) -> None:
        spec = op.spec
        self.conn.execute(
            "INSERT INTO webhook (id, url, events, agent, conversation_id, task_id, secret, "
            'source, config, created_at, "after") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, '
            "?10, ?11) ON CONFLICT (id) DO UPDATE SET url=?2, events=?3, agent=?4, "
            "conversation_id=?5, task_id=?6, secret=?7, source=?8, config=?9",
            (spec.id, spec.url, ",".join(spec.events), spec.agent, spec.conversation_id,
             spec.task_id, spec.secret, spec.source, spec.config, self.now, op.after))

    def drop_webhook(self, webhook_id: str) -> None:
        self.conn.execute("DELETE FROM webhook WHERE id=?", (webhook_id,))
        self.conn.execute("DELETE FROM webhook_delivery WHERE webhook_id=?", (webhook_id,))

    def webhook_progress(self, op: ops.WebhookProgress) -> None:
        hook, now = op.webhook_id, self.now
        self.conn.execute(
            'UPDATE webhook SET "after"=?, attempts=?, next_at=?, failing_since=CASE WHEN ?=0 '
            "THEN NULL ELSE COALESCE(failing_since, ?) END WHERE id=?",
            (op.after, op.attempts, now + op.retry_in, op.attempts, now, hook))
        if not op.log:
            return
        self.conn.executemany(
            'INSERT INTO webhook_delivery (webhook_id, "offset", type, attempt, outcome, status, '
            "error, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(hook, a.offset, a.type, a.attempt, a.outcome, a.status, a.error, now)
             for a in op.log])
        self.conn.execute(
            "DELETE FROM webhook_delivery WHERE webhook_id=?1 AND n <= (SELECT n FROM "
            "webhook_delivery WHERE webhook_id=?1 ORDER BY n DESC LIMIT 1 OFFSET ?2)",
            (hook, ops.DELIVERY_LOG_KEEP))

    def keep_key(self, idem: ops.Idempotency, result_id: str) -> None:
        self.conn.execute(
            "INSERT INTO idempotency_key (key, fingerprint, result_id, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (idem.key, idem.fingerprint, result_id, self.now, self.now + idem.ttl))

    def own(self, conversation_id: str, user: str) -> None:
        self.conn.execute("INSERT INTO conversation_user (conversation_id, user_id) VALUES (?, ?)",
                          (conversation_id, user))

    def count_tokens(self, conversation_id: str, tokens: int) -> None:
        self.conn.execute(
            "INSERT INTO user_usage (user_id, day, tokens) SELECT user_id, ?, ? "
            "FROM conversation_user WHERE conversation_id=? "
            "ON CONFLICT (user_id, day) DO UPDATE SET tokens = tokens + excluded.tokens",
            (utc_day(self.now), tokens, conversation_id))

    # --- results --------------------------------------------------------------------------------

    def value(self, value: object) -> object:
        return value

    def conversation(self, conversation_id: str) -> object:
        return read_record(self.conn, conversation_id)

    def offset(self, seq: int) -> object:
        return seq


def apply_op(target: SqliteTarget, op: ops.AnyOp) -> object:
    """Apply one op inside the open transaction (``target.tx``); returns its result. Raises
    AgentikError for a refused op (rolled back alone) and sqlite3.Error for a storage failure
    (fails the batch). :func:`apply_all` for one op (the rule on pending rows lives there)."""
    return apply_all(target, [op])[0]


def apply_all(target: SqliteTarget, batch: list[ops.AnyOp]) -> list[object]:
    """Every op of ``batch`` in order (``apply.APPLY``), their results. The journal and turn
    rows the ops before left pending are written first (``write_rows``) unless the op is an
    AppendUserMessage, the one op that reads neither table. Raises what an op raises, at the
    first op that raises it."""
    t: Target[MessageRecord] = target  # (mypy: it is one)
    conn, tx = target.conn, target.tx
    results: list[object] = []
    append = results.append
    table, user = apply.APPLY, ops.AppendUserMessage
    for op in batch:
        kind = type(op)
        if kind is not user and (tx.messages or tx.turns):
            write_rows(conn, tx)
        append(table[kind](t, op))
    return results
