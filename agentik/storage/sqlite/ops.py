"""The ops of the SQLite writer (``writer.Writer``), applied inside its batch transaction.

One function per op, dispatched by :func:`apply_op` (the PostgreSQL engine plans the same ops in
``pg.writer``); the rows they write are ``sqlite.rows``'. An op refused on purpose raises
AgentikError: the batch's SAVEPOINT rolls back its rows and hands its seqs back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

from agentik.errors import ConflictError, IdempotencyKeyReusedError
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.sqlite.rows import (
    QUEUED,
    RUNNING,
    Tx,
    alloc,
    append_memory,
    bump,
    conversation_exists,
    delete_conversation,
    emit,
    journal,
    not_found,
    read_record,
    touch,
    write_rows,
)
from agentik.wire import (
    AssistantMessageEvent,
    CompactionTriggered,
    ConversationRecord,
    Created,
    Error,
    ErrorEvent,
    Interrupted,
    MessageRecord,
    Renamed,
    SystemItem,
    TaskUpdated,
    ToolCallEvent,
    ToolFailed,
    ToolResultEvent,
    UserMessageEvent,
    decode_message,
    decode_working_item,
    encode,
)


def _create(conn: sqlite3.Connection, tx: Tx, op: ops.CreateConversation) -> ConversationRecord:
    seq = alloc(tx)
    conn.execute(
        "INSERT INTO conversation (id, title, is_temporal, created_at, updated_at, seq) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (op.conversation_id, op.title, int(op.is_temporal), tx.now, tx.now, seq),
    )
    append_memory(conn, tx, op.conversation_id, SystemItem(text=op.system_prompt), None)
    created = read_record(conn, op.conversation_id)
    emit(tx, seq, op.conversation_id, Created(conversation=created), kind="agent")
    return created


def _delete_op(conn: sqlite3.Connection, tx: Tx, op: ops.DeleteConversation) -> bool:
    exists = conn.execute("SELECT 1 FROM conversation WHERE id=?", (op.conversation_id,))
    if exists.fetchone() is None:
        return False
    delete_conversation(conn, tx, op.conversation_id, "deleted")
    return True


def _rename(conn: sqlite3.Connection, tx: Tx, op: ops.RenameConversation) -> ConversationRecord:
    seq = alloc(tx)
    cur = conn.execute(
        "UPDATE conversation SET title=?, updated_at=?, seq=? WHERE id=?",
        (op.title, tx.now, seq, op.conversation_id),
    )
    if cur.rowcount == 0:
        raise not_found(op.conversation_id)
    tx.seqs[op.conversation_id] = 0  # its row has its latest seq
    emit(tx, seq, op.conversation_id,
          Renamed(conversation_id=op.conversation_id, title=op.title, updated_at=tx.now),
          kind="agent")
    return read_record(conn, op.conversation_id)


def _append_user(conn: sqlite3.Connection, tx: Tx, op: ops.AppendUserMessage) -> Any:
    """The user message (``journal``), its turn (written by ``write_rows``) and, if it starts
    with it, its working memory item. Under an Idempotency-Key: that (the op without its key)
    stored with the key, or the key's replay. (The op's function in ``_APPLY`` itself: one
    call an event fewer.)"""
    if op.idempotency is not None:
        plain = msgspec.structs.replace(op, idempotency=None)
        return _idempotent(conn, tx, op.idempotency, lambda: _append_user(conn, tx, plain))
    cid, mid, start = op.conversation_id, op.message_id, op.start
    record = journal(conn, tx, cid, mid, op.message, UserMessageEvent)
    tx.turns += (cid, mid, QUEUED if start is None else RUNNING, record.seq)  # by write_rows
    if start is not None:  # started with its message (ops.AppendUserMessage.start)
        append_memory(conn, tx, cid, start, mid)
    return record


def _start_turn(conn: sqlite3.Connection, tx: Tx, op: ops.StartTurn) -> None:
    conversation_exists(conn, op.conversation_id)  # takes no seq: checked up front
    if op.recheck and conn.execute(  # stored: its user item is in working memory
            "SELECT 1 FROM working_memory WHERE conversation_id=? AND source_message_id=?",
            (op.conversation_id, op.turn_id)).fetchone() is not None:
        return
    append_memory(conn, tx, op.conversation_id, op.item, op.turn_id)
    conn.execute("UPDATE turn SET state='running' WHERE conversation_id=? AND id=?",
                 (op.conversation_id, op.turn_id))


def _stored(conn: sqlite3.Connection, op: ops.Recheckable) -> Any:
    """A rechecked op's result when its first attempt is stored (``ops.rechecked``; planned as
    ``pg.plan_ops._stored``): one of its records is in the journal, or (a FinishTurn) its turn
    row is gone; else None."""
    conversation_exists(conn, op.conversation_id)
    ids = ops.journal_ids(op)
    rows = {r[0]: r for r in conn.execute(
        "SELECT id, seq, conversation_id, created_at, payload FROM message WHERE id IN "
        f"({','.join('?' * len(ids))})", ids)} if ids else {}
    records = [MessageRecord(id=r[0], seq=r[1], conversation_id=r[2], created_at=r[3],
                             message=decode_message(r[4])) for i in ids if (r := rows.get(i))]
    if not records and (type(op) is not ops.FinishTurn or op.turn_id is None or conn.execute(
            "SELECT 1 FROM turn WHERE conversation_id=? AND id=?",
            (op.conversation_id, op.turn_id)).fetchone() is not None):
        return None  # not stored (a FinishTurn: its turn still open)
    return records[0] if type(op) is ops.AppendToolResult else records


def _tool_calls(conn: sqlite3.Connection, tx: Tx, op: ops.AppendToolCalls) -> list[MessageRecord]:
    if op.recheck and (stored := _stored(conn, op)) is not None:
        return stored
    records = []
    for message_id, call in op.calls:
        records.append(journal(conn, tx, op.conversation_id, message_id, call, ToolCallEvent))
    if not op.calls:
        conversation_exists(conn, op.conversation_id)  # an empty round takes no seq
    append_memory(conn, tx, op.conversation_id, op.item, None)
    return records


def _tool_result(conn: sqlite3.Connection, tx: Tx, op: ops.AppendToolResult) -> MessageRecord:
    if op.recheck and (stored := _stored(conn, op)) is not None:
        return stored
    record = journal(conn, tx, op.conversation_id, op.message_id, op.result,
                     ToolFailed if op.result.is_error else ToolResultEvent)
    append_memory(conn, tx, op.conversation_id, op.item, op.message_id)
    return record


def _finish_turn(conn: sqlite3.Connection, tx: Tx, op: ops.FinishTurn) -> list[MessageRecord]:
    if op.recheck and (stored := _stored(conn, op)) is not None:
        return stored
    out: list[MessageRecord] = []
    if op.assistant is not None:
        message_id, answer = op.assistant
        record = journal(conn, tx, op.conversation_id, message_id, answer, AssistantMessageEvent)
        if op.item is not None:
            append_memory(conn, tx, op.conversation_id, op.item, message_id)
        out.append(record)
    if op.interrupted:
        seq = alloc(tx)
        bump(conn, tx, op.conversation_id, seq)
        emit(tx, seq, op.conversation_id, Interrupted(turn_id=op.turn_id),
              kind="conversation")
    if op.error is not None:
        message_id, error = op.error
        out.append(journal(conn, tx, op.conversation_id, message_id, error, ErrorEvent))
    if op.forget_from is not None:
        conn.execute("DELETE FROM working_memory WHERE conversation_id=? AND order_idx >= ?",
                     (op.conversation_id, op.forget_from))
    if op.turn_id is not None:
        conn.execute("DELETE FROM turn WHERE conversation_id=? AND id=?",
                     (op.conversation_id, op.turn_id))
    touch(conn, tx, op.conversation_id)
    return out


def _compact(conn: sqlite3.Connection, tx: Tx, op: ops.Compact) -> None:
    if op.recheck and _compacted(conn, op):
        return
    first = conn.execute(
        "SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=? AND order_idx > "
        "(SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=?)",
        (op.conversation_id, op.conversation_id),
    ).fetchone()[0]
    conn.execute(
        "DELETE FROM working_memory WHERE conversation_id=? AND order_idx >= ? AND order_idx < ?",
        (op.conversation_id, first if first is not None else op.before_order_idx,
         op.before_order_idx),
    )
    if op.summary is not None and first is not None:
        conn.execute(
            "INSERT INTO working_memory "
            "(conversation_id, order_idx, source_message_id, created_at, payload) "
            "VALUES (?, ?, NULL, ?, ?)",
            (op.conversation_id, first, tx.now, encode(op.summary)),
        )
    seq = alloc(tx)
    bump(conn, tx, op.conversation_id, seq)
    summary_text = getattr(op.summary, "text", None)
    emit(tx, seq, op.conversation_id,
          CompactionTriggered(dropped_items=op.dropped, summary=summary_text),
          kind="conversation")


def _compacted(conn: sqlite3.Connection, op: ops.Compact) -> bool:
    """A rechecked Compact: whether its first attempt is stored (``ops.compacted``)."""
    conversation_exists(conn, op.conversation_id)
    rows = conn.execute(
        "SELECT payload FROM working_memory WHERE conversation_id=? AND order_idx < ? AND "
        "order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id=?) "
        "ORDER BY order_idx LIMIT 2", (op.conversation_id, op.before_order_idx, op.conversation_id))
    return ops.compacted(op, [decode_working_item(r[0]) for r in rows])


def _recover_turns(conn: sqlite3.Connection, tx: Tx, op: ops.RecoverTurns) -> int:
    sql = "SELECT t.id, t.conversation_id FROM turn t JOIN conversation c ON c.id = t.conversation_id"
    args: tuple[str, ...] = ()
    if op.conversation_id is not None:
        sql += " WHERE t.conversation_id = ?"
        args = (op.conversation_id,)
    rows = conn.execute(sql + " ORDER BY t.seq", args).fetchall()  # in the order they came
    for turn_id, conversation_id in rows:
        error = Error(message=op.message, code=op.code, turn_id=turn_id)
        journal(conn, tx, conversation_id, new_id(), error, ErrorEvent)
        touch(conn, tx, conversation_id)
    if op.conversation_id is None:
        conn.execute("DELETE FROM turn")
    else:
        conn.execute("DELETE FROM turn WHERE conversation_id = ?", (op.conversation_id,))
    return len(rows)


def _purge_temporary(conn: sqlite3.Connection, tx: Tx, op: ops.PurgeTemporary) -> int:
    ids = [r[0] for r in conn.execute("SELECT id FROM conversation WHERE is_temporal=1")]
    for conversation_id in ids:
        delete_conversation(conn, tx, conversation_id, "temporary conversation ended by restart")
    return len(ids)


def apply_op(conn: sqlite3.Connection, tx: Tx, op: ops.AnyOp) -> Any:
    """Apply one op inside the open transaction; returns its result. Raises AgentikError for a
    refused op (rolled back alone) and sqlite3.Error for a storage failure (fails the batch).

    Dispatched by the op's exact type (a dict look-up: a ``match`` on twelve classes made an
    ``isinstance`` through msgspec's metaclass per case tried, ~3k instructions an event).
    The journal and turn rows the ops before left pending are written first (``write_rows``)
    unless ``op`` is an AppendUserMessage, the one op that reads neither table (the rule lives
    in :func:`apply_all`, which this is for one op)."""
    return apply_all(conn, tx, [op])[0]


def apply_all(conn: sqlite3.Connection, tx: Tx, batch: list[ops.AnyOp]) -> list[Any]:
    """:func:`apply_op` for every op of ``batch`` in order, their results (one loop for the
    batch: no call an op to ``apply_op``). Raises what ``apply_op`` raises, at the first op
    that raises it."""
    results: list[Any] = []
    append = results.append
    table, user = _APPLY, ops.AppendUserMessage
    for op in batch:
        kind = type(op)
        if kind is not user and (tx.messages or tx.turns):
            write_rows(conn, tx)
        append(table[kind](conn, tx, op))
    return results


def _create_op(conn: sqlite3.Connection, tx: Tx, op: ops.CreateConversation) -> Any:
    if op.idempotency is None:
        return _create(conn, tx, op)
    return _idempotent(conn, tx, op.idempotency, lambda: _create(conn, tx, op))


# --- idempotency keys (ops.Idempotency; the PostgreSQL engine mirrors these) ----------------------


def _idempotent(
    conn: sqlite3.Connection, tx: Tx, idem: ops.Idempotency | None,
    write: Callable[[], MessageRecord | ConversationRecord],
) -> Any:
    """Run ``write`` and store its key with it, or answer a replay of a stored key."""
    if idem is None:
        return write()
    conn.execute("DELETE FROM idempotency_key WHERE expires_at <= ?", (tx.now,))
    row = conn.execute(
        "SELECT fingerprint, result_id FROM idempotency_key WHERE key=?", (idem.key,)
    ).fetchone()
    if row is not None:
        if row[0] != idem.fingerprint:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was already used with another request"
            )
        return ops.Replayed(result_id=row[1])
    result = write()
    conn.execute(
        "INSERT INTO idempotency_key (key, fingerprint, result_id, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (idem.key, idem.fingerprint, result.id, tx.now, tx.now + idem.ttl),
    )
    return result


def _put_a2a_task(conn: sqlite3.Connection, tx: Tx, op: ops.PutA2ATask) -> int:
    if op.conversation_id is not None:  # its tasks went with it: none outlives it
        conversation_exists(conn, op.conversation_id)
    row = conn.execute("SELECT seq FROM a2a_task WHERE id=?", (op.task_id,)).fetchone()
    stored = None if row is None else int(row[0])
    if stored != op.expect_seq:
        raise ConflictError(
            f"task {op.task_id!r} is at seq {stored}, the change expected {op.expect_seq}"
        )
    seq = alloc(tx)
    if row is None:
        conn.execute(
            "INSERT INTO a2a_task (id, context_id, conversation_id, state, created_at, updated_at, "
            "first_seq, seq, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (op.task_id, op.context_id, op.conversation_id, op.state, tx.now, tx.now, seq, seq,
             op.task),
        )
    else:
        conn.execute(
            "UPDATE a2a_task SET conversation_id=?, state=?, updated_at=?, seq=?, payload=? "
            "WHERE id=?",
            (op.conversation_id, op.state, tx.now, seq, op.task, op.task_id),
        )
    event = TaskUpdated(task_id=op.task_id, context_id=op.context_id, state=op.state,
                        update=msgspec.Raw(op.update))
    emit(tx, seq, op.conversation_id, event, kind="a2a")
    return seq


#: op type -> its function: every member of ``ops.AnyOp`` (tests/test_sqlite_cost.py checks)
_APPLY: dict[type[Any], Callable[[sqlite3.Connection, Tx, Any], Any]] = {
    ops.CreateConversation: _create_op,
    ops.DeleteConversation: _delete_op,
    ops.RenameConversation: _rename,
    ops.AppendUserMessage: _append_user,
    ops.StartTurn: _start_turn,
    ops.AppendToolCalls: _tool_calls,
    ops.AppendToolResult: _tool_result,
    ops.FinishTurn: _finish_turn,
    ops.Compact: _compact,
    ops.RecoverTurns: _recover_turns,
    ops.PurgeTemporary: _purge_temporary,
    ops.PutA2ATask: _put_a2a_task,
}
