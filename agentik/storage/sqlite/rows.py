"""Row-level writes of the SQLite engine's primitives (``sqlite.ops.SqliteTarget``), inside the
batch transaction: a durable event with its outbox row (``emit``), a journal record, a working
memory item, the conversation's seq bump.

Every time stored is ``tx.now`` (the writer's clock at this batch). Conversation existence is
checked by the row count of the conversation UPDATE that every seq-taking op performs, i.e.
after the op took its seqs: an op refused so raises NotFoundError and its SAVEPOINT hands the
seqs back. A conversation bumped again in the same transaction needs no UPDATE: ``Tx.seqs``
holds its latest seq, written once at the end (``write_seqs``). The outbox rows are written at
the end too (``write_outbox``): the batch's ops read neither. Journal and turn rows are kept
pending in ``Tx`` and written together (``write_rows``) before the next op that is not an
AppendUserMessage, and at the end: only an AppendUserMessage may run with rows pending.
"""

from __future__ import annotations

import sqlite3
import typing
from dataclasses import dataclass, field
from typing import Any

from agentik.errors import NotFoundError
from agentik.storage.types import CONVERSATION_COLUMNS, KINDS, StoredEvent, conversation_of
from agentik.wire import (
    AgentEvent,
    CommonEvent,
    ConversationRecord,
    Cursor,
    DurableEvent,
    Message,
    encode,
)


@dataclass
class Tx:
    """One batch transaction's state: its epoch, the next seq and the clock value."""

    epoch: str
    next_seq: int
    now: float
    events: list[StoredEvent] = field(default_factory=list)
    #: the conversations this transaction has found by a ``bump`` and not deleted since: id ->
    #: the seq their row must still be given (0: the row has its latest seq already). An op that
    #: sets a conversation's seq itself (a rename) sets 0 here, or an older seq would win.
    seqs: dict[str, int] = field(default_factory=dict)
    #: rows not written yet, one flat list of values a table (``RowsInsert``, the batch's time
    #: bound once for all): the journal's (``journal``, 5 a row) and the new turns' (4 a row),
    #: written by ``write_rows``; the outbox's (``emit``, ``journal``: 4 a row, one an event of
    #: ``events``), by ``write_outbox``
    messages: list[Any] = field(default_factory=list)
    turns: list[Any] = field(default_factory=list)
    outbox: list[Any] = field(default_factory=list)


#: an outbox row's kind (``types.kind_of``), bound as its index here (``RowsInsert``: a small int
#: binds for a tenth of a string, which sqlite3 copies), by the event's class
KIND_NAMES = ("agent", "conversation", "a2a")
KIND_INDEX = {cls: KIND_NAMES.index(kind) for cls, kind in KINDS.items()}
#: a journal row's type (the message's tag), bound as its index likewise
_MESSAGE_TYPES = typing.get_args(Message)
TYPE_INDEX = {cls: i for i, cls in enumerate(_MESSAGE_TYPES)}
#: a turn's state: queued (its message waits behind a running turn) or running
QUEUED, RUNNING = 0, 1


def _case(values: typing.Iterable[str]) -> str:
    """``CASE {} WHEN 0 THEN 'a' WHEN 1 THEN 'b' ... END``: the text of a bound index."""
    whens = " ".join(f"WHEN {i} THEN '{v}'" for i, v in enumerate(values))
    return f"CASE {{}} {whens} END"


def emit(tx: Tx, seq: int, conversation_id: str | None, event: DurableEvent | AgentEvent) -> None:
    """The event at ``seq``, kept in ``tx.events``: its outbox row is written with the batch's
    (``write_outbox``)."""
    common = CommonEvent(
        cursor=Cursor(epoch=tx.epoch, offset=seq), conversation_id=conversation_id, event=event
    )
    raw = encode(common)
    index = KIND_INDEX[type(event)]
    tx.events.append(StoredEvent(seq, conversation_id, KIND_NAMES[index], common, raw))
    tx.outbox += (seq, conversation_id, index, bytearray(raw))


class RowsInsert:
    """An INSERT of many rows, written as multi-row ``VALUES`` statements of 64, 32, ..., 1 rows
    (a batch of n rows takes at most one statement of 64 per 64 rows and one of each power of
    two in the rest, so seven statement shapes a table stay in the connection's cache). One
    statement of 64 rows costs ~0.8 us a row less than ``executemany`` (a step, a reset and a
    GIL release a row, in Python's sqlite3); the rows and a constraint error are the same.

    ``row`` is a row's SQL with ``{}`` for each of its parameters (``width`` of them) and, if it
    has one, ``?1`` for the parameter every row shares (the batch's time: bound once a statement,
    not once a row). The rows come as one flat list of their values, sliced into parameters
    (after the shared one).

    The tables' inserts are ``OR ROLLBACK``: a row's constraint error ends the whole transaction,
    which is what the writer does after any error anyway (the batch fails, nothing is stored),
    and SQLite then keeps no statement journal to undo the statement alone."""

    CHUNK = 64

    def __init__(self, head: str, row: str) -> None:
        self.width = width = row.count("{}")
        self.shared = shared = "?1" in row
        self.sql: dict[int, str] = {}
        n = self.CHUNK
        while n:
            rows = ", ".join(row.format(*(f"?{1 + shared + r * width + i}" for i in range(width)))
                             for r in range(n))
            self.sql[n] = f"{head} VALUES {rows}"
            n //= 2

    def __call__(self, conn: sqlite3.Connection, values: list[Any], shared: Any = None) -> None:
        width = self.width
        head = [shared] if self.shared else []
        i, total, chunk = 0, len(values) // width, self.CHUNK
        if total <= chunk and total & (total - 1) == 0:  # 0, 1, 2, 4, ... 64 rows: as they are
            if total:
                conn.execute(self.sql[total], head + values if head else values)
            return
        while i < total:
            left = total - i
            size = chunk if left >= chunk else 1 << (left.bit_length() - 1)
            conn.execute(self.sql[size], head + values[i * width:(i + size) * width])
            i += size


_insert_outbox = RowsInsert(
    'INSERT OR ROLLBACK INTO outbox ("offset", conversation_id, kind, created_at, payload)',
    f"({{}}, {{}}, {_case(KIND_NAMES)}, ?1, {{}})")
_insert_message = RowsInsert(
    "INSERT OR ROLLBACK INTO message (seq, id, conversation_id, type, created_at, payload)",
    "({}, {}, {}, " + _case(c.__struct_config__.tag for c in _MESSAGE_TYPES) + ", ?1, {})")
_insert_turn = RowsInsert("INSERT OR ROLLBACK INTO turn (conversation_id, id, state, seq)",
                          "({}, {}, " + _case(("queued", "running")) + ", {})")


def write_outbox(conn: sqlite3.Connection, tx: Tx) -> None:
    """The outbox rows of every event the transaction emitted (``tx.outbox``), in one statement,
    and the batch's mark (``schema``: ``outbox_mark``, the TTL trim's bound): an op reads no
    outbox row, so they are written together at the end of the batch (before its trim)."""
    _insert_outbox(conn, tx.outbox, tx.now)
    # its last event's offset (events are emitted in offset order)
    conn.execute('INSERT INTO outbox_mark ("offset", created_at) VALUES (?, ?)',
                 (tx.events[-1].offset, tx.now))


def not_found(conversation_id: str) -> NotFoundError:
    return NotFoundError(f"conversation {conversation_id!r} not found")


def conversation_exists(conn: sqlite3.Connection, conversation_id: str) -> None:
    if conn.execute("SELECT 1 FROM conversation WHERE id=?", (conversation_id,)).fetchone() is None:
        raise not_found(conversation_id)


def bump(
    conn: sqlite3.Connection, tx: Tx, conversation_id: str, seq: int,
    updated_at: float | None = None,
) -> None:
    """Set the conversation's seq (and updated_at); NotFoundError if it does not exist. A seq
    alone, for a conversation this transaction already found, is only noted in ``tx.seqs``."""
    if updated_at is None:
        if conversation_id in tx.seqs:
            tx.seqs[conversation_id] = seq
            return
        cur = conn.execute("UPDATE conversation SET seq=? WHERE id=?", (seq, conversation_id))
    else:
        cur = conn.execute(
            "UPDATE conversation SET seq=?, updated_at=? WHERE id=?",
            (seq, updated_at, conversation_id),
        )
    if cur.rowcount == 0:
        raise not_found(conversation_id)
    tx.seqs[conversation_id] = 0


def write_seqs(conn: sqlite3.Connection, tx: Tx) -> None:
    """Give the rows of ``tx.seqs`` their latest seq (at the end of the batch)."""
    pending = [(seq, cid) for cid, seq in tx.seqs.items() if seq]
    if pending:
        conn.executemany("UPDATE conversation SET seq=? WHERE id=?", pending)


def write_rows(conn: sqlite3.Connection, tx: Tx) -> None:
    """Write the pending journal and turn rows, a few statements a table (``RowsInsert``: a row
    through ``execute`` costs a cursor, a statement-cache look-up and a reset more). ``apply_op``
    calls it before every op but an AppendUserMessage (which reads neither table), the writer at
    the end of the batch, or of each op in the SAVEPOINT pass (so an op's rows are in its
    SAVEPOINT); a row's constraint error (a message id taken) fails the batch either way."""
    if tx.messages:
        _insert_message(conn, tx.messages, tx.now)
        tx.messages.clear()
    if tx.turns:
        _insert_turn(conn, tx.turns)
        tx.turns.clear()


def read_record(conn: sqlite3.Connection, conversation_id: str) -> ConversationRecord:
    """The conversation's row (its seq as stored: only ever read right after the op set it)."""
    row = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversation WHERE id=?", (conversation_id,)
    ).fetchone()
    if row is None:
        raise not_found(conversation_id)
    return conversation_of(row)
