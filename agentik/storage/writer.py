"""The synchronous half of the StorageActor: one sqlite3 connection, used from one worker thread at a
time (the actor awaits each batch before it starts the next).

``commit_batch`` applies a batch of ops in ONE transaction. Each op runs inside its own SAVEPOINT:
an op that fails on purpose (NotFoundError, ...) is rolled back alone and its seqs are handed back,
so the counter stays gap-free; any sqlite3 error fails the whole batch, which is rolled back and
acknowledged to nobody.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgspec

from agentik.errors import (
    AgentikError,
    ConflictError,
    IdempotencyKeyReusedError,
    NotFoundError,
    StorageError,
)
from agentik.storage import ops
from agentik.storage.dblock import lock_database
from agentik.storage.schema import migrate
from agentik.wire import (
    AgentEvent,
    AssistantMessageEvent,
    CommonEvent,
    CompactionTriggered,
    ConversationClosing,
    ConversationRecord,
    Created,
    Cursor,
    Deleted,
    DurableEvent,
    Error,
    ErrorEvent,
    Interrupted,
    Message,
    MessageRecord,
    Renamed,
    SystemItem,
    TaskUpdated,
    ToolCallEvent,
    ToolFailed,
    ToolResultEvent,
    Touched,
    UserMessageEvent,
    WorkingItem,
    encode,
    event_type,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A committed durable event with its encoded CommonEvent JSON (what SSE sends as data)."""

    offset: int
    conversation_id: str | None
    kind: str  # "agent", "conversation" or "a2a"
    event: CommonEvent
    raw: bytes


@dataclass
class BatchResult:
    results: list[Any]  # per op: a value, or an AgentikError instance
    events: list[StoredEvent]
    oldest: int  # lowest retained offset (head + 1 when the outbox is empty)
    head: int


@dataclass
class _Tx:
    epoch: str
    next_seq: int
    now: float
    events: list[StoredEvent] = field(default_factory=list)


def open_connection(path: str, *, synchronous: str = "FULL", readonly: bool = False) -> sqlite3.Connection:
    """Open a connection with agentik's pragmas. Raises sqlite3.Error."""
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


class Writer:
    """The SQLite :class:`~agentik.storage.engine.WriterEngine`: owns the single writer connection.
    Constructed in a worker thread; raises StorageError."""

    publishes_commits = True

    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        outbox_cap: int,
        outbox_ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        #: the one clock of every stored time (created_at, updated_at, outbox TTL)
        self.clock = clock
        self.outbox_cap = outbox_cap
        self.outbox_ttl = outbox_ttl
        self._lock = lock_database(path)
        try:
            self.conn = open_connection(path, synchronous=synchronous)
            migrate(self.conn)
            self.epoch = self._meta("epoch")
            self.next_seq = int(self._meta("next_seq"))
            self.oldest = self._oldest(self.next_seq)
        except sqlite3.Error as exc:
            self._lock.release()
            raise StorageError(f"cannot open database {path!r}: {exc}") from exc

    def _meta(self, key: str) -> str:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        if row is None:
            raise sqlite3.DatabaseError(f"meta.{key} is missing")
        return str(row[0])

    def _oldest(self, next_seq: int) -> int:
        row = self.conn.execute('SELECT MIN("offset") FROM outbox').fetchone()
        return int(row[0]) if row and row[0] is not None else next_seq

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:  # pragma: no cover - closing never matters more than the cause
            log.exception("closing the writer connection failed")
        finally:
            self._lock.release()

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult:
        """Apply ``batch`` in one transaction. Raises StorageError if nothing was committed."""
        tx = _Tx(epoch=self.epoch, next_seq=self.next_seq, now=self.clock())
        results: list[Any] = []
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in batch:
                mark = (tx.next_seq, len(tx.events))
                conn.execute("SAVEPOINT op")
                try:
                    results.append(apply_op(conn, tx, op))
                    conn.execute("RELEASE op")
                except AgentikError as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    tx.next_seq, n_events = mark
                    del tx.events[n_events:]
                    results.append(exc)
            if tx.next_seq != self.next_seq:
                conn.execute("UPDATE meta SET value=? WHERE key='next_seq'", (str(tx.next_seq),))
                self._trim(tx)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("rollback after a failed batch failed")
            raise StorageError(f"write failed, nothing stored: {exc}") from exc
        self.next_seq = tx.next_seq
        self.oldest = self._oldest(self.next_seq)
        return BatchResult(results, tx.events, self.oldest, self.next_seq - 1)

    def probe(self) -> None:
        """A small write that must reach the disk (see ``engine.probe_write``): a row of a few
        pages put in ``meta`` and committed (new pages, new WAL frames: what a full disk or
        database refuses), then removed. Raises StorageError; nothing else is touched."""
        conn = self.conn
        size = 4 * int(conn.execute("PRAGMA page_size").fetchone()[0])
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)",
                         ("0" * size,))
            conn.execute("COMMIT")
            conn.execute("DELETE FROM meta WHERE key = 'probe'")
        except sqlite3.Error as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("rollback after a failed probe failed")
            raise StorageError(f"probe write failed: {exc}") from exc

    def _trim(self, tx: _Tx) -> None:
        # Trimming only ever removes a prefix of offsets, so what is retained stays contiguous:
        # that is what lets a replaying reader detect eviction as a jump.
        head = tx.next_seq - 1
        self.conn.execute('DELETE FROM outbox WHERE "offset" <= ?', (head - self.outbox_cap,))
        cutoff = tx.now - self.outbox_ttl
        self.conn.execute(
            'DELETE FROM outbox WHERE "offset" <= '
            '(SELECT MAX("offset") FROM outbox INDEXED BY outbox_by_time WHERE created_at < ?)',
            (cutoff,),
        )


# --- ops -----------------------------------------------------------------------------------------
#
# One function per op, dispatched by ``apply_op``. Every time stored is ``tx.now`` (the writer's
# clock at this batch). An op refused on purpose raises AgentikError: the batch's SAVEPOINT rolls
# back its rows and hands its seqs back. Conversation existence is checked by the row count of the
# conversation UPDATE that every seq-taking op performs, i.e. after the op took its seqs.


def _emit(
    conn: sqlite3.Connection,
    tx: _Tx,
    seq: int,
    conversation_id: str | None,
    event: DurableEvent | AgentEvent,
    *,
    kind: str,
) -> None:
    common = CommonEvent(
        cursor=Cursor(epoch=tx.epoch, offset=seq), conversation_id=conversation_id, event=event
    )
    raw = encode(common)
    conn.execute(
        'INSERT INTO outbox ("offset", conversation_id, kind, created_at, payload) '
        "VALUES (?, ?, ?, ?, ?)",
        (seq, conversation_id, kind, tx.now, raw),
    )
    tx.events.append(StoredEvent(seq, conversation_id, kind, common, raw))


def _alloc(tx: _Tx) -> int:
    seq = tx.next_seq
    tx.next_seq += 1
    return seq


def _not_found(conversation_id: str) -> NotFoundError:
    return NotFoundError(f"conversation {conversation_id!r} not found")


def _conversation_exists(conn: sqlite3.Connection, conversation_id: str) -> None:
    if conn.execute("SELECT 1 FROM conversation WHERE id=?", (conversation_id,)).fetchone() is None:
        raise _not_found(conversation_id)


def _bump(conn: sqlite3.Connection, conversation_id: str, seq: int, updated_at: float | None = None) -> None:
    """Set the conversation's seq (and updated_at); NotFoundError if it does not exist."""
    if updated_at is None:
        cur = conn.execute("UPDATE conversation SET seq=? WHERE id=?", (seq, conversation_id))
    else:
        cur = conn.execute(
            "UPDATE conversation SET seq=?, updated_at=? WHERE id=?",
            (seq, updated_at, conversation_id),
        )
    if cur.rowcount == 0:
        raise _not_found(conversation_id)


def _journal(
    conn: sqlite3.Connection, tx: _Tx, conversation_id: str, message_id: str, message: Message
) -> MessageRecord:
    seq = _alloc(tx)
    _bump(conn, conversation_id, seq)
    record = MessageRecord(
        id=message_id, seq=seq, conversation_id=conversation_id, created_at=tx.now, message=message
    )
    conn.execute(
        "INSERT INTO message (seq, id, conversation_id, type, created_at, payload) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (seq, message_id, conversation_id, event_type(message), tx.now, encode(message)),  # type: ignore[arg-type]
    )
    return record


def _append_memory(
    conn: sqlite3.Connection,
    tx: _Tx,
    conversation_id: str,
    item: WorkingItem,
    source_message_id: str | None,
) -> None:
    conn.execute(
        "INSERT INTO working_memory "
        "(conversation_id, order_idx, source_message_id, created_at, payload) VALUES "
        "(?, (SELECT COALESCE(MAX(order_idx), 0) + 1 FROM working_memory WHERE conversation_id=?), "
        "?, ?, ?)",
        (conversation_id, conversation_id, source_message_id, tx.now, encode(item)),
    )


def _touch(conn: sqlite3.Connection, tx: _Tx, conversation_id: str) -> None:
    seq = _alloc(tx)
    _bump(conn, conversation_id, seq, tx.now)
    _emit(conn, tx, seq, conversation_id,
          Touched(conversation_id=conversation_id, updated_at=tx.now), kind="agent")


def _delete(conn: sqlite3.Connection, tx: _Tx, conversation_id: str, reason: str) -> None:
    seq = _alloc(tx)
    _emit(conn, tx, seq, conversation_id, ConversationClosing(reason=reason), kind="conversation")
    for table in ("message", "working_memory", "turn"):
        conn.execute(f"DELETE FROM {table} WHERE conversation_id=?", (conversation_id,))
    conn.execute("DELETE FROM conversation WHERE id=?", (conversation_id,))
    seq = _alloc(tx)
    _emit(conn, tx, seq, conversation_id, Deleted(conversation_id=conversation_id), kind="agent")


def _record(conn: sqlite3.Connection, conversation_id: str) -> ConversationRecord:
    row = conn.execute(
        "SELECT id, title, is_temporal, created_at, updated_at, seq FROM conversation WHERE id=?",
        (conversation_id,),
    ).fetchone()
    if row is None:
        raise _not_found(conversation_id)
    return row_to_conversation(row)


def row_to_conversation(row: tuple[Any, ...]) -> ConversationRecord:
    return ConversationRecord(
        id=row[0], title=row[1], is_temporal=bool(row[2]), created_at=row[3], updated_at=row[4],
        seq=row[5],
    )


def _create(conn: sqlite3.Connection, tx: _Tx, op: ops.CreateConversation) -> ConversationRecord:
    seq = _alloc(tx)
    conn.execute(
        "INSERT INTO conversation (id, title, is_temporal, created_at, updated_at, seq) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (op.conversation_id, op.title, int(op.is_temporal), tx.now, tx.now, seq),
    )
    _append_memory(conn, tx, op.conversation_id, SystemItem(text=op.system_prompt), None)
    created = _record(conn, op.conversation_id)
    _emit(conn, tx, seq, op.conversation_id, Created(conversation=created), kind="agent")
    return created


def _delete_op(conn: sqlite3.Connection, tx: _Tx, op: ops.DeleteConversation) -> bool:
    exists = conn.execute("SELECT 1 FROM conversation WHERE id=?", (op.conversation_id,))
    if exists.fetchone() is None:
        return False
    _delete(conn, tx, op.conversation_id, "deleted")
    return True


def _rename(conn: sqlite3.Connection, tx: _Tx, op: ops.RenameConversation) -> ConversationRecord:
    seq = _alloc(tx)
    cur = conn.execute(
        "UPDATE conversation SET title=?, updated_at=?, seq=? WHERE id=?",
        (op.title, tx.now, seq, op.conversation_id),
    )
    if cur.rowcount == 0:
        raise _not_found(op.conversation_id)
    _emit(conn, tx, seq, op.conversation_id,
          Renamed(conversation_id=op.conversation_id, title=op.title, updated_at=tx.now),
          kind="agent")
    return _record(conn, op.conversation_id)


def _append_user(conn: sqlite3.Connection, tx: _Tx, op: ops.AppendUserMessage) -> MessageRecord:
    record = _journal(conn, tx, op.conversation_id, op.message_id, op.message)
    conn.execute(
        "INSERT INTO turn (id, conversation_id, state) VALUES (?, ?, 'queued')",
        (op.message_id, op.conversation_id),
    )
    _emit(conn, tx, record.seq, op.conversation_id, UserMessageEvent(record=record),
          kind="conversation")
    return record


def _start_turn(conn: sqlite3.Connection, tx: _Tx, op: ops.StartTurn) -> None:
    _conversation_exists(conn, op.conversation_id)  # takes no seq: checked up front
    _append_memory(conn, tx, op.conversation_id, op.item, op.turn_id)
    conn.execute("UPDATE turn SET state='running' WHERE id=?", (op.turn_id,))


def _tool_calls(conn: sqlite3.Connection, tx: _Tx, op: ops.AppendToolCalls) -> list[MessageRecord]:
    records = []
    for message_id, call in op.calls:
        record = _journal(conn, tx, op.conversation_id, message_id, call)
        _emit(conn, tx, record.seq, op.conversation_id, ToolCallEvent(record=record),
              kind="conversation")
        records.append(record)
    if not op.calls:
        _conversation_exists(conn, op.conversation_id)  # an empty round takes no seq
    _append_memory(conn, tx, op.conversation_id, op.item, None)
    return records


def _tool_result(conn: sqlite3.Connection, tx: _Tx, op: ops.AppendToolResult) -> MessageRecord:
    record = _journal(conn, tx, op.conversation_id, op.message_id, op.result)
    event: DurableEvent = (
        ToolFailed(record=record) if op.result.is_error else ToolResultEvent(record=record)
    )
    _emit(conn, tx, record.seq, op.conversation_id, event, kind="conversation")
    _append_memory(conn, tx, op.conversation_id, op.item, op.message_id)
    return record


def _finish_turn(conn: sqlite3.Connection, tx: _Tx, op: ops.FinishTurn) -> list[MessageRecord]:
    out: list[MessageRecord] = []
    if op.assistant is not None:
        message_id, answer = op.assistant
        record = _journal(conn, tx, op.conversation_id, message_id, answer)
        _emit(conn, tx, record.seq, op.conversation_id,
              AssistantMessageEvent(record=record), kind="conversation")
        if op.item is not None:
            _append_memory(conn, tx, op.conversation_id, op.item, message_id)
        out.append(record)
    if op.interrupted:
        seq = _alloc(tx)
        _bump(conn, op.conversation_id, seq)
        _emit(conn, tx, seq, op.conversation_id, Interrupted(turn_id=op.turn_id),
              kind="conversation")
    if op.error is not None:
        message_id, error = op.error
        record = _journal(conn, tx, op.conversation_id, message_id, error)
        _emit(conn, tx, record.seq, op.conversation_id, ErrorEvent(record=record),
              kind="conversation")
        out.append(record)
    if op.forget_from is not None:
        conn.execute("DELETE FROM working_memory WHERE conversation_id=? AND order_idx >= ?",
                     (op.conversation_id, op.forget_from))
    if op.turn_id is not None:
        conn.execute("DELETE FROM turn WHERE id=?", (op.turn_id,))
    _touch(conn, tx, op.conversation_id)
    return out


def _compact(conn: sqlite3.Connection, tx: _Tx, op: ops.Compact) -> None:
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
    seq = _alloc(tx)
    _bump(conn, op.conversation_id, seq)
    summary_text = getattr(op.summary, "text", None)
    _emit(conn, tx, seq, op.conversation_id,
          CompactionTriggered(dropped_items=op.dropped, summary=summary_text),
          kind="conversation")


def _recover_turns(conn: sqlite3.Connection, tx: _Tx, op: ops.RecoverTurns) -> int:
    sql = "SELECT t.id, t.conversation_id FROM turn t JOIN conversation c ON c.id = t.conversation_id"
    args: tuple[str, ...] = ()
    if op.conversation_id is not None:
        sql += " WHERE t.conversation_id = ?"
        args = (op.conversation_id,)
    rows = conn.execute(sql + " ORDER BY t.rowid", args).fetchall()
    for turn_id, conversation_id in rows:
        error = Error(message=op.message, code=op.code, turn_id=turn_id)
        record = _journal(conn, tx, conversation_id, uuid.uuid4().hex, error)
        _emit(conn, tx, record.seq, conversation_id, ErrorEvent(record=record),
              kind="conversation")
        _touch(conn, tx, conversation_id)
    if op.conversation_id is None:
        conn.execute("DELETE FROM turn")
    else:
        conn.execute("DELETE FROM turn WHERE conversation_id = ?", (op.conversation_id,))
    return len(rows)


def _purge_temporary(conn: sqlite3.Connection, tx: _Tx, op: ops.PurgeTemporary) -> int:
    ids = [r[0] for r in conn.execute("SELECT id FROM conversation WHERE is_temporal=1")]
    for conversation_id in ids:
        _delete(conn, tx, conversation_id, "temporary conversation ended by restart")
    return len(ids)


def apply_op(conn: sqlite3.Connection, tx: _Tx, op: ops.AnyOp) -> Any:
    """Apply one op inside the open transaction; returns its result. Raises AgentikError for a
    refused op (rolled back alone) and sqlite3.Error for a storage failure (fails the batch)."""
    match op:
        case ops.CreateConversation():
            return _idempotent(conn, tx, op.idempotency, lambda: _create(conn, tx, op))
        case ops.DeleteConversation():
            return _delete_op(conn, tx, op)
        case ops.RenameConversation():
            return _rename(conn, tx, op)
        case ops.AppendUserMessage():
            return _idempotent(conn, tx, op.idempotency, lambda: _append_user(conn, tx, op))
        case ops.StartTurn():
            return _start_turn(conn, tx, op)
        case ops.AppendToolCalls():
            return _tool_calls(conn, tx, op)
        case ops.AppendToolResult():
            return _tool_result(conn, tx, op)
        case ops.FinishTurn():
            return _finish_turn(conn, tx, op)
        case ops.Compact():
            return _compact(conn, tx, op)
        case ops.RecoverTurns():
            return _recover_turns(conn, tx, op)
        case ops.PurgeTemporary():
            return _purge_temporary(conn, tx, op)
        case ops.PutA2ATask():
            return _put_a2a_task(conn, tx, op)
        case _:
            assert_never(op)


# --- idempotency keys (ops.Idempotency; the PostgreSQL engine mirrors these) ----------------------


def _idempotent(
    conn: sqlite3.Connection, tx: _Tx, idem: ops.Idempotency | None,
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


def _put_a2a_task(conn: sqlite3.Connection, tx: _Tx, op: ops.PutA2ATask) -> int:
    row = conn.execute("SELECT seq FROM a2a_task WHERE id=?", (op.task_id,)).fetchone()
    stored = None if row is None else int(row[0])
    if stored != op.expect_seq:
        raise ConflictError(
            f"task {op.task_id!r} is at seq {stored}, the change expected {op.expect_seq}"
        )
    seq = _alloc(tx)
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
    _emit(conn, tx, seq, op.conversation_id, event, kind="a2a")
    return seq
