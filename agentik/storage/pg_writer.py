"""The PostgreSQL writer: one connection (autocommit), used from one worker thread at a time.
Row arrays go as binary parameters (``%(x)b``): dumping them as text costs several times more.

A batch is committed by ONE statement: a data-modifying CTE that bumps the counter row by the
number of offsets the batch uses and inserts every row at ``base + rel``, then NOTIFYs the schema's
channel (a wake-up hint carrying the head). One statement is one round trip, and the counter's row
lock is held only while the server executes it, never across a round trip or Python work, so
offsets are dense and in commit order across nodes at full speed (SCALEOUT.md).

Before the statement, the batch is *planned* in Python from one read of the rows it touches (the
conversations, their working-memory length, ...): each op is checked first and refused
(AgentikError) before it takes anything, so a refusal never leaves a hole; then it adds rows with
batch-relative offsets ``rel``. Because the offset is only known inside the statement, outbox
payloads are stored with offset 0 in their cursor and records, and readers stamp the real offset
on read (``pg_reader.stamp``); results go back to callers built from ``base`` after commit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgspec
import psycopg

from agentik.errors import (
    AgentikError,
    ConflictError,
    IdempotencyKeyReusedError,
    NotFoundError,
    StorageError,
)
from agentik.storage import ops
from agentik.storage.pg_schema import channel, migrate
from agentik.storage.writer import BatchResult
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

_COMMIT = """
WITH f AS (
    SELECT x.conversation_id FROM conv_owner x
    JOIN unnest(%(f_cid)b::text[], %(f_fence)b::bigint[]) AS r(cid, fence) ON x.conversation_id = r.cid
    WHERE x.node_id = %(me)s AND x.fence = r.fence
    FOR SHARE OF x
), g AS (
    SELECT x.conversation_id FROM conv_owner x JOIN nodes y ON y.node_id = x.node_id
    WHERE x.conversation_id = ANY(%(u_cid)b::text[]) AND x.node_id <> %(me)s
      AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s)
    FOR SHARE OF x
), c AS (
    UPDATE counter SET v = v + %(n)s
    WHERE id = 1 AND (SELECT count(*) FROM f) = %(f_n)s AND NOT EXISTS (SELECT 1 FROM g)
    RETURNING v - %(n)s AS base
), oi AS (
    INSERT INTO conv_owner (conversation_id, node_id, fence)
    SELECT r.id, %(me)s, 1 FROM c, unnest(%(new)b::text[]) AS r(id)
    ON CONFLICT (conversation_id) DO NOTHING
), od AS (
    DELETE FROM conv_owner USING c WHERE conv_owner.conversation_id = ANY(%(del)b::text[])
), o AS (
    INSERT INTO outbox ("offset", conversation_id, kind, created_at, payload)
    SELECT c.base + r.rel, r.cid, r.kind, %(now)s, r.payload FROM c,
        unnest(%(o_rel)b::bigint[], %(o_cid)b::text[], %(o_kind)b::text[], %(o_payload)b::bytea[])
        AS r(rel, cid, kind, payload)
), m AS (
    INSERT INTO message (seq, id, conversation_id, type, created_at, payload)
    SELECT c.base + r.rel, r.id, r.cid, r.type, %(now)s, r.payload FROM c,
        unnest(%(m_rel)b::bigint[], %(m_id)b::text[], %(m_cid)b::text[], %(m_type)b::text[],
               %(m_payload)b::bytea[]) AS r(rel, id, cid, type, payload)
), cv AS (
    INSERT INTO conversation (id, title, is_temporal, created_at, updated_at, seq)
    SELECT r.id, r.title, r.temp, r.created, r.updated, c.base + r.rel FROM c,
        unnest(%(c_id)b::text[], %(c_title)b::text[], %(c_temp)b::boolean[],
               %(c_created)b::float8[], %(c_updated)b::float8[], %(c_rel)b::bigint[])
        AS r(id, title, temp, created, updated, rel)
    ON CONFLICT (id) DO UPDATE
        SET title = EXCLUDED.title, updated_at = EXCLUDED.updated_at, seq = EXCLUDED.seq
), w AS (
    INSERT INTO working_memory (conversation_id, order_idx, source_message_id, created_at, payload)
    SELECT r.cid, r.idx, r.src, %(now)s, r.payload FROM c,
        unnest(%(w_cid)b::text[], %(w_idx)b::int[], %(w_src)b::text[], %(w_payload)b::bytea[])
        AS r(cid, idx, src, payload)
), wd AS (
    DELETE FROM working_memory x USING c,
        unnest(%(wd_cid)b::text[], %(wd_lo)b::int[], %(wd_hi)b::int[]) AS r(cid, lo, hi)
    WHERE x.conversation_id = r.cid AND x.order_idx >= r.lo AND x.order_idx < r.hi
), ti AS (
    INSERT INTO turn (id, conversation_id, state, seq)
    SELECT r.id, r.cid, r.state, c.base + r.rel FROM c,
        unnest(%(t_id)b::text[], %(t_cid)b::text[], %(t_state)b::text[], %(t_rel)b::bigint[])
        AS r(id, cid, state, rel)
), tr AS (
    UPDATE turn SET state = 'running' FROM c WHERE turn.id = ANY(%(t_run)b::text[])
), td AS (
    DELETE FROM turn USING c
    WHERE turn.id = ANY(%(t_del)b::text[]) OR turn.conversation_id = ANY(%(del)b::text[])
), dm AS (
    DELETE FROM message USING c WHERE message.conversation_id = ANY(%(del)b::text[])
), dw AS (
    DELETE FROM working_memory USING c WHERE working_memory.conversation_id = ANY(%(del)b::text[])
), dc AS (
    DELETE FROM conversation USING c WHERE conversation.id = ANY(%(del)b::text[])
), a AS (
    INSERT INTO a2a_task (id, context_id, conversation_id, state, created_at, updated_at,
                          first_seq, seq, payload)
    SELECT r.id, r.ctx, r.cid, r.state, %(now)s, %(now)s, c.base + r.rel, c.base + r.rel, r.payload
    FROM c, unnest(%(a_id)b::text[], %(a_ctx)b::text[], %(a_cid)b::text[], %(a_state)b::text[],
                   %(a_rel)b::bigint[], %(a_payload)b::bytea[]) AS r(id, ctx, cid, state, rel, payload)
    ON CONFLICT (id) DO UPDATE
        SET conversation_id = EXCLUDED.conversation_id, state = EXCLUDED.state,
            updated_at = EXCLUDED.updated_at, seq = EXCLUDED.seq, payload = EXCLUDED.payload
), ik AS (
    DELETE FROM idempotency_key USING c WHERE idempotency_key.expires_at <= %(now)s
        AND NOT idempotency_key.key = ANY(%(i_key)b::text[])  -- those ii overwrites
), ii AS (
    INSERT INTO idempotency_key (key, fingerprint, result_id, created_at, expires_at)
    SELECT r.key, r.fp, r.rid, %(now)s, r.exp
    FROM c, unnest(%(i_key)b::text[], %(i_fp)b::text[], %(i_rid)b::text[],
                   %(i_exp)b::float8[]) AS r(key, fp, rid, exp)
    ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
        result_id = EXCLUDED.result_id, created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at
), tc AS (
    DELETE FROM outbox USING c WHERE outbox."offset" <= c.base + %(n)s - %(cap)s
), tt AS (
    DELETE FROM outbox
    WHERE "offset" <= (SELECT max("offset") FROM outbox WHERE created_at < %(cutoff)s)
)
SELECT c.base, CASE WHEN %(n)s > 0 THEN pg_notify(%(chan)s, (c.base + %(n)s)::text) END FROM c
"""

_LOAD_CONVERSATIONS = """
SELECT c.id, c.title, c.is_temporal, c.created_at, c.updated_at, c.seq,
       (SELECT COALESCE(MAX(order_idx), 0) FROM working_memory w WHERE w.conversation_id = c.id)
FROM conversation c WHERE c.id = ANY(%s::text[])
"""


@dataclass(frozen=True, slots=True)
class _Conv:
    id: str
    title: str | None
    is_temporal: bool
    created_at: float
    updated_at: float
    #: absolute seq as read, or None once the batch changed it (then ``rel`` is its offset)
    seq: int | None
    rel: int | None
    in_db: bool
    max_order: int

    def record(self, base: int) -> ConversationRecord:
        seq = self.seq if self.rel is None else base + self.rel
        return ConversationRecord(id=self.id, title=self.title, is_temporal=self.is_temporal,
                                  created_at=self.created_at, updated_at=self.updated_at,
                                  seq=seq if seq is not None else 0)


#: a result known once the batch's base offset is: ``fn(base)``
_Result = Callable[[int], Any]


def _const(value: Any) -> _Result:
    return lambda base: value


@dataclass
class _Plan:
    epoch: str
    now: float
    n: int = 0
    conv: dict[str, _Conv | None] = field(default_factory=dict)
    #: (rel, conversation_id, kind, CommonEvent stored with offset 0)
    outbox: list[tuple[int, str | None, str, bytes]] = field(default_factory=list)
    messages: list[tuple[int, str, str, str, bytes]] = field(default_factory=list)
    memory: list[tuple[str, int, str | None, bytes]] = field(default_factory=list)
    memory_cut: list[tuple[str, int, int]] = field(default_factory=list)
    #: turns inserted by this batch: id -> (conversation_id, state, rel)
    turns: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    turns_running: list[str] = field(default_factory=list)
    turns_deleted: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: A2A task seqs as read (absolute) or written by this batch ("rel", r)
    tasks: dict[str, int | tuple[str, int] | None] = field(default_factory=dict)
    task_rows: list[tuple[str, str, str | None, str, int, bytes]] = field(default_factory=list)
    #: pre-read for ops that need more than the conversation rows
    compact_first: dict[str, int | None] = field(default_factory=dict)
    #: RecoverTurns' open turns by its conversation filter: (turn id, conversation id), orphans
    open_turns: dict[str | None, tuple[list[tuple[str, str]], list[str]]] = field(
        default_factory=dict)
    temporary: list[str] | None = None
    #: conversations created by this batch (their owner row is this node's, fence 1)
    created: list[str] = field(default_factory=list)
    #: Idempotency-Keys of the batch's ops: key -> (fingerprint, result id) stored and not
    #: expired, or planned by an earlier op of this batch; None when free
    idem: dict[str, tuple[str, str] | None] = field(default_factory=dict)
    #: (key, fingerprint, result id, expires_at) to insert with the batch
    idem_rows: list[tuple[str, str, str, float]] = field(default_factory=list)
    #: ops refused before planning (lease checks): index -> error
    refused: dict[int, AgentikError] = field(default_factory=dict)

    # --- building blocks -------------------------------------------------------------------------

    def alloc(self) -> int:
        """The next batch-relative offset, 1..n (the stored offset is base + rel)."""
        self.n += 1
        return self.n

    def require(self, conversation_id: str) -> _Conv:
        conv = self.conv.get(conversation_id)
        if conv is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        return conv

    def bump(self, conv: _Conv, rel: int, *, touch: bool = False, **changes: Any) -> _Conv:
        if touch:
            changes["updated_at"] = self.now
        new = dataclasses.replace(conv, seq=None, rel=rel, **changes)
        self.conv[conv.id] = new
        return new

    def emit(self, rel: int, conversation_id: str | None, event: DurableEvent | AgentEvent,
             kind: str) -> None:
        common = CommonEvent(cursor=Cursor(epoch=self.epoch, offset=0),
                             conversation_id=conversation_id, event=event)
        self.outbox.append((rel, conversation_id, kind, encode(common)))

    def journal(self, conv: _Conv, message_id: str, message: Message) -> tuple[int, MessageRecord]:
        rel = self.alloc()
        self.bump(conv, rel)
        record = MessageRecord(id=message_id, seq=0, conversation_id=conv.id, created_at=self.now,
                               message=message)
        self.messages.append((rel, message_id, conv.id, event_type(message), encode(message)))  # type: ignore[arg-type]
        return rel, record

    def remember(self, conversation_id: str, item: WorkingItem, source: str | None,
                 order_idx: int | None = None) -> None:
        conv = self.require(conversation_id)
        if order_idx is None:
            order_idx = conv.max_order + 1
            self.conv[conversation_id] = dataclasses.replace(conv, max_order=order_idx)
        self.memory.append((conversation_id, order_idx, source, encode(item)))

    def touch(self, conversation_id: str) -> None:
        rel = self.alloc()
        self.bump(self.require(conversation_id), rel, touch=True)
        self.emit(rel, conversation_id,
                  Touched(conversation_id=conversation_id, updated_at=self.now), "agent")

    def delete(self, conversation_id: str, reason: str) -> None:
        conv = self.require(conversation_id)
        self.emit(self.alloc(), conversation_id, ConversationClosing(reason=reason), "conversation")
        # rows this batch planned for it go too (the statement cannot see its own inserts)
        self.messages = [m for m in self.messages if m[2] != conversation_id]
        self.memory = [m for m in self.memory if m[0] != conversation_id]
        self.turns = {k: v for k, v in self.turns.items() if v[0] != conversation_id}
        if conv.in_db:
            self.deleted.append(conversation_id)
        self.conv[conversation_id] = None
        self.emit(self.alloc(), conversation_id, Deleted(conversation_id=conversation_id), "agent")


def _stamped(record: MessageRecord, rel: int) -> _Result:
    return lambda base: msgspec.structs.replace(record, seq=base + rel)


# --- one function per op: check first (refusals take nothing), then plan --------------------------


def _create(p: _Plan, op: ops.CreateConversation) -> _Result:
    if p.conv.get(op.conversation_id) is not None:
        raise StorageError(f"conversation {op.conversation_id!r} already exists")
    rel = p.alloc()
    conv = _Conv(op.conversation_id, op.title, op.is_temporal, p.now, p.now, None, rel,
                 in_db=False, max_order=0)
    p.conv[conv.id] = conv
    p.remember(conv.id, SystemItem(text=op.system_prompt), None)
    p.emit(rel, conv.id, Created(conversation=conv.record(-rel)), "agent")
    p.created.append(conv.id)
    return lambda base: conv.record(base)


def _delete_op(p: _Plan, op: ops.DeleteConversation) -> _Result:
    if p.conv.get(op.conversation_id) is None:
        return _const(False)
    p.delete(op.conversation_id, "deleted")
    return _const(True)


def _rename(p: _Plan, op: ops.RenameConversation) -> _Result:
    conv = p.require(op.conversation_id)
    rel = p.alloc()
    conv = p.bump(conv, rel, touch=True, title=op.title)
    p.emit(rel, conv.id, Renamed(conversation_id=conv.id, title=op.title, updated_at=p.now),
           "agent")
    return lambda base: conv.record(base)


def _append_user(p: _Plan, op: ops.AppendUserMessage) -> _Result:
    rel, record = p.journal(p.require(op.conversation_id), op.message_id, op.message)
    p.turns[op.message_id] = (op.conversation_id, "queued", rel)
    p.emit(rel, op.conversation_id, UserMessageEvent(record=record), "conversation")
    return _stamped(record, rel)


def _start_turn(p: _Plan, op: ops.StartTurn) -> _Result:
    p.require(op.conversation_id)
    p.remember(op.conversation_id, op.item, op.turn_id)
    queued = p.turns.get(op.turn_id)
    if queued is not None:
        p.turns[op.turn_id] = (queued[0], "running", queued[2])
    else:
        p.turns_running.append(op.turn_id)
    return _const(None)


def _tool_calls(p: _Plan, op: ops.AppendToolCalls) -> _Result:
    p.require(op.conversation_id)
    made: list[_Result] = []
    for message_id, call in op.calls:
        rel, record = p.journal(p.require(op.conversation_id), message_id, call)
        p.emit(rel, op.conversation_id, ToolCallEvent(record=record), "conversation")
        made.append(_stamped(record, rel))
    p.remember(op.conversation_id, op.item, None)
    return lambda base: [fn(base) for fn in made]


def _tool_result(p: _Plan, op: ops.AppendToolResult) -> _Result:
    rel, record = p.journal(p.require(op.conversation_id), op.message_id, op.result)
    event: DurableEvent = (
        ToolFailed(record=record) if op.result.is_error else ToolResultEvent(record=record)
    )
    p.emit(rel, op.conversation_id, event, "conversation")
    p.remember(op.conversation_id, op.item, op.message_id)
    return _stamped(record, rel)


def _finish_turn(p: _Plan, op: ops.FinishTurn) -> _Result:
    cid = op.conversation_id
    p.require(cid)
    made: list[_Result] = []
    if op.assistant is not None:
        message_id, answer = op.assistant
        rel, record = p.journal(p.require(cid), message_id, answer)
        p.emit(rel, cid, AssistantMessageEvent(record=record), "conversation")
        if op.item is not None:
            p.remember(cid, op.item, message_id)
        made.append(_stamped(record, rel))
    if op.interrupted:
        rel = p.alloc()
        p.bump(p.require(cid), rel)
        p.emit(rel, cid, Interrupted(turn_id=op.turn_id), "conversation")
    if op.error is not None:
        message_id, error = op.error
        rel, record = p.journal(p.require(cid), message_id, error)
        p.emit(rel, cid, ErrorEvent(record=record), "conversation")
        made.append(_stamped(record, rel))
    if op.turn_id is not None:
        if p.turns.pop(op.turn_id, None) is None:
            p.turns_deleted.append(op.turn_id)
    p.touch(cid)
    return lambda base: [fn(base) for fn in made]


def _compact(p: _Plan, op: ops.Compact) -> _Result:
    cid = op.conversation_id
    p.require(cid)
    first = p.compact_first.get(cid)
    p.memory_cut.append((cid, first if first is not None else op.before_order_idx,
                         op.before_order_idx))
    if op.summary is not None and first is not None:
        p.remember(cid, op.summary, None, order_idx=first)
    rel = p.alloc()
    p.bump(p.require(cid), rel)
    p.emit(rel, cid, CompactionTriggered(dropped_items=op.dropped,
                                         summary=getattr(op.summary, "text", None)),
           "conversation")
    return _const(None)


def _recover_turns(p: _Plan, op: ops.RecoverTurns) -> _Result:
    open_turns, orphans = p.open_turns.pop(op.conversation_id, ([], []))
    closed = 0
    for turn_id, cid in open_turns:
        if p.conv.get(cid) is None:
            continue
        error = Error(message=op.message, code=op.code, turn_id=turn_id)
        rel, record = p.journal(p.require(cid), uuid.uuid4().hex, error)
        p.emit(rel, cid, ErrorEvent(record=record), "conversation")
        p.touch(cid)
        p.turns_deleted.append(turn_id)
        closed += 1
    p.turns_deleted.extend(orphans)
    return _const(closed)


def _purge_temporary(p: _Plan, op: ops.PurgeTemporary) -> _Result:
    ids, p.temporary = p.temporary or [], []
    for cid in ids:
        if p.conv.get(cid) is not None:
            p.delete(cid, "temporary conversation ended by restart")
    return _const(len(ids))


def _put_a2a_task(p: _Plan, op: ops.PutA2ATask) -> _Result:
    stored = p.tasks.get(op.task_id)
    if isinstance(stored, tuple) or stored != op.expect_seq:
        shown = "changed in this batch" if isinstance(stored, tuple) else f"at seq {stored}"
        raise ConflictError(f"task {op.task_id!r} is {shown}, the change expected {op.expect_seq}")
    rel = p.alloc()
    p.tasks[op.task_id] = ("rel", rel)
    p.task_rows.append((op.task_id, op.context_id, op.conversation_id, op.state, rel, op.task))
    p.emit(rel, op.conversation_id,
           TaskUpdated(task_id=op.task_id, context_id=op.context_id, state=op.state,
                       update=msgspec.Raw(op.update)), "a2a")
    return lambda base: base + rel


def _idempotent(p: _Plan, idem: ops.Idempotency | None, result_id: str,
                write: Callable[[], _Result]) -> _Result:
    """The SQLite writer's ``_idempotent``, planned: a stored (or earlier in this batch) key
    replays its first answer, another body with it is refused, a free key is stored with
    the write in the batch's one statement."""
    if idem is None:
        return write()
    known = p.idem.get(idem.key)
    if known is not None:
        if known[0] != idem.fingerprint:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was already used with another request"
            )
        return _const(ops.Replayed(result_id=known[1]))
    result = write()
    p.idem[idem.key] = (idem.fingerprint, result_id)
    p.idem_rows.append((idem.key, idem.fingerprint, result_id, p.now + idem.ttl))
    return result


def _plan_op(p: _Plan, op: ops.AnyOp) -> _Result:
    match op:
        case ops.CreateConversation():
            return _idempotent(p, op.idempotency, op.conversation_id, lambda: _create(p, op))
        case ops.DeleteConversation():
            return _delete_op(p, op)
        case ops.RenameConversation():
            return _rename(p, op)
        case ops.AppendUserMessage():
            return _idempotent(p, op.idempotency, op.message_id, lambda: _append_user(p, op))
        case ops.StartTurn():
            return _start_turn(p, op)
        case ops.AppendToolCalls():
            return _tool_calls(p, op)
        case ops.AppendToolResult():
            return _tool_result(p, op)
        case ops.FinishTurn():
            return _finish_turn(p, op)
        case ops.Compact():
            return _compact(p, op)
        case ops.RecoverTurns():
            return _recover_turns(p, op)
        case ops.PurgeTemporary():
            return _purge_temporary(p, op)
        case ops.PutA2ATask():
            return _put_a2a_task(p, op)
        case _:
            assert_never(op)


_LIVE_OTHER_OWNER = (
    "EXISTS (SELECT 1 FROM conv_owner x JOIN nodes y ON y.node_id = x.node_id "
    "WHERE x.conversation_id = c.id AND x.node_id <> %(me)s "
    "AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s))"
)


class PgWriter:
    """The PostgreSQL :class:`~agentik.storage.engine.WriterEngine`. Constructed in a worker
    thread; raises StorageError.

    With ``leases`` set (a cluster node), every batch is checked inside its statement: a
    conversation this node holds must still carry this node's fence (else LeaseLostError), and a
    conversation it does not hold must not be owned by another live node (else NotOwnerError);
    a batch failing a check stores nothing, and is planned again without the refused ops."""

    publishes_commits = False

    def __init__(
        self, url: str, *, outbox_cap: int, outbox_ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.clock = clock
        self.outbox_cap = outbox_cap
        self.outbox_ttl = outbox_ttl
        #: the node's leases (``pg_lease.Leases``); None: no ownership checks (one node)
        self.leases: Any = None
        try:
            self.conn = self._connect()
            self.schema = migrate(self.conn)
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            assert row is not None
            self.epoch = str(row[0])
            head, lo = self.conn.execute(
                'SELECT (SELECT v FROM counter WHERE id = 1), (SELECT min("offset") FROM outbox)'
            ).fetchone() or (0, None)
        except psycopg.Error as exc:
            raise StorageError(f"cannot open database {_safe(url)}: {exc}") from exc
        self.channel = channel(self.schema)
        self.next_seq = int(head) + 1
        self.oldest = int(lo) if lo is not None else self.next_seq

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    @property
    def _me(self) -> tuple[str, float]:
        if self.leases is None:
            return "", 0.0
        return str(self.leases.node_id), float(self.leases.ttl)

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg.Error:  # pragma: no cover - closing never matters more than the cause
            log.exception("closing the writer connection failed")

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult:
        """Plan ``batch`` and commit it in one statement. Raises StorageError if nothing was
        committed (the connection is then re-opened for the next batch)."""
        refused: dict[int, AgentikError] = {}
        try:
            if self.conn.closed or self.conn.broken:
                self.conn = self._connect()
            for _ in range(3):
                plan = _Plan(epoch=self.epoch, now=self.clock())
                live = [op for i, op in enumerate(batch) if i not in refused]
                self._load(plan, live)
                results: list[Any] = []
                for i, op in enumerate(batch):
                    if i in refused:
                        results.append(refused[i])
                        continue
                    try:
                        results.append(_plan_op(plan, op))
                    except AgentikError as exc:
                        results.append(exc)
                base = self._execute(plan)
                if base is not None:
                    break
                refused.update(self._ownership_refusals(batch, refused))
            else:
                raise StorageError("write failed, nothing stored: conversation ownership kept "
                                   "changing under the batch")
        except psycopg.Error as exc:
            raise StorageError(f"write failed, nothing stored: {exc}") from exc
        self.next_seq = base + plan.n + 1
        return BatchResult(
            [r if isinstance(r, AgentikError) else r(base) for r in results], [],
            self.oldest, self.next_seq - 1,
        )

    def _load(self, p: _Plan, batch: list[ops.AnyOp]) -> None:
        """The one read a batch's plan starts from (more only for start-up and A2A ops)."""
        conn = self.conn
        me, ttl = self._me
        cids: set[str] = set()
        tasks: list[str] = []
        compacts: list[str] = []
        for op in batch:
            if isinstance(op, ops.RecoverTurns) and op.conversation_id not in p.open_turns:
                sql = ("SELECT t.id, t.conversation_id, c.id IS NOT NULL FROM turn t "
                       "LEFT JOIN conversation c ON c.id = t.conversation_id ")
                if op.conversation_id is not None:
                    sql += "WHERE t.conversation_id = %(cid)s "
                else:  # a cluster's start-up leaves the turns of live nodes alone
                    sql += f"WHERE NOT (c.id IS NOT NULL AND {_LIVE_OTHER_OWNER}) "
                rows = conn.execute(
                    sql + "ORDER BY t.seq",
                    {"cid": op.conversation_id, "me": me, "ttl": ttl},
                ).fetchall()
                p.open_turns[op.conversation_id] = (
                    [(r[0], r[1]) for r in rows if r[2]], [r[0] for r in rows if not r[2]])
                cids.update(r[1] for r in rows if r[2])
            elif isinstance(op, ops.PurgeTemporary) and p.temporary is None:
                p.temporary = [r[0] for r in conn.execute(
                    "SELECT id FROM conversation c WHERE is_temporal "
                    f"AND NOT {_LIVE_OTHER_OWNER} ORDER BY seq", {"me": me, "ttl": ttl})]
                cids.update(p.temporary)
            elif isinstance(op, ops.PutA2ATask):
                tasks.append(op.task_id)
            elif isinstance(op, ops.Compact):
                compacts.append(op.conversation_id)
            cid = getattr(op, "conversation_id", None)
            if isinstance(cid, str):
                cids.add(cid)
        if cids:
            for r in conn.execute(_LOAD_CONVERSATIONS, (list(cids),)):
                p.conv[r[0]] = _Conv(r[0], r[1], bool(r[2]), r[3], r[4], r[5], None, True, r[6])
        keys = [idem.key for op in batch
                if isinstance(op, ops.CreateConversation | ops.AppendUserMessage)
                and (idem := op.idempotency) is not None]
        if keys:
            stored = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT key, fingerprint, result_id FROM idempotency_key "
                "WHERE key = ANY(%s::text[]) AND expires_at > %s", (keys, p.now))}
            p.idem.update({k: stored.get(k) for k in keys})
        if tasks:
            found = dict(conn.execute(
                "SELECT id, seq FROM a2a_task WHERE id = ANY(%s::text[])", (tasks,)).fetchall())
            p.tasks.update({t: found.get(t) for t in tasks})
        for cid in compacts:
            row = conn.execute(
                "SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s AND "
                "order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s)",
                (cid, cid),
            ).fetchone()
            p.compact_first[cid] = row[0] if row else None

    def _ownership(self, p: _Plan) -> dict[str, Any]:
        """The statement's lease checks: the fences this node holds for the batch's
        conversations, and the conversations it holds none for."""
        if self.leases is None:
            return {"f_cid": [], "f_fence": [], "f_n": 0, "u_cid": []}
        fenced: list[str] = []
        fences: list[int] = []
        unfenced: list[str] = []
        created = set(p.created)
        for cid in p.conv:
            if cid in created:
                continue
            fence = self.leases.fences.get(cid)
            if fence is None:
                unfenced.append(cid)
            else:
                fenced.append(cid)
                fences.append(fence)
        return {"f_cid": fenced, "f_fence": fences, "f_n": len(fenced), "u_cid": unfenced}

    def _ownership_refusals(
        self, batch: list[ops.AnyOp], refused: dict[int, AgentikError]
    ) -> dict[int, AgentikError]:
        """After a batch failed its lease checks: which ops to refuse, and why."""
        from agentik.errors import LeaseLostError, NotOwnerError

        me, ttl = self._me
        cids = sorted({cid for op in batch
                       if isinstance(cid := getattr(op, "conversation_id", None), str)})
        rows = self.conn.execute(
            "SELECT x.conversation_id, x.node_id, x.fence, y.addr, "
            "COALESCE(y.heartbeat_at > now() - make_interval(secs => %s), false) "
            "FROM conv_owner x LEFT JOIN nodes y ON y.node_id = x.node_id "
            "WHERE x.conversation_id = ANY(%s::text[])", (ttl, cids),
        ).fetchall()
        owners = {r[0]: r for r in rows}
        out: dict[int, AgentikError] = {}
        for i, op in enumerate(batch):
            cid = getattr(op, "conversation_id", None)
            if i in refused or not isinstance(cid, str) or isinstance(op, ops.CreateConversation):
                continue
            row = owners.get(cid)
            fence = self.leases.fences.get(cid) if self.leases is not None else None
            if fence is not None:
                if row is None or row[1] != me or row[2] != fence:
                    out[i] = LeaseLostError(f"this node's lease on conversation {cid!r} was taken")
            elif row is not None and row[1] != me and row[4]:
                out[i] = NotOwnerError(f"conversation {cid!r} is owned by node {row[1]!r}",
                                       node_id=row[1], addr=row[3])
        if not out:  # e.g. a start-up op over many conversations met a fresh owner: retry whole
            out = {i: NotOwnerError("a conversation of this op is owned by another node",
                                    node_id="", addr=None)
                   for i, op in enumerate(batch)
                   if i not in refused and isinstance(op, ops.RecoverTurns | ops.PurgeTemporary)}
        return out

    def _execute(self, p: _Plan) -> int | None:
        """Run the one statement; the head before this batch, or None when a lease check
        failed (then nothing was stored)."""
        me, ttl = self._me
        dirty = [c for c in p.conv.values() if c is not None and c.rel is not None]
        turns = list(p.turns.items())
        args: dict[str, Any] = {
            "n": p.n, "now": p.now, "chan": self.channel, "cap": self.outbox_cap,
            "cutoff": p.now - self.outbox_ttl, "me": me, "ttl": ttl, "new": p.created,
            **self._ownership(p),
            "o_rel": [o[0] for o in p.outbox], "o_cid": [o[1] for o in p.outbox],
            "o_kind": [o[2] for o in p.outbox], "o_payload": [o[3] for o in p.outbox],
            "m_rel": [m[0] for m in p.messages], "m_id": [m[1] for m in p.messages],
            "m_cid": [m[2] for m in p.messages], "m_type": [m[3] for m in p.messages],
            "m_payload": [m[4] for m in p.messages],
            "c_id": [c.id for c in dirty], "c_title": [c.title for c in dirty],
            "c_temp": [c.is_temporal for c in dirty], "c_created": [c.created_at for c in dirty],
            "c_updated": [c.updated_at for c in dirty], "c_rel": [c.rel for c in dirty],
            "w_cid": [w[0] for w in p.memory], "w_idx": [w[1] for w in p.memory],
            "w_src": [w[2] for w in p.memory], "w_payload": [w[3] for w in p.memory],
            "wd_cid": [w[0] for w in p.memory_cut], "wd_lo": [w[1] for w in p.memory_cut],
            "wd_hi": [w[2] for w in p.memory_cut],
            "t_id": [t[0] for t in turns], "t_cid": [t[1][0] for t in turns],
            "t_state": [t[1][1] for t in turns], "t_rel": [t[1][2] for t in turns],
            "t_run": p.turns_running, "t_del": p.turns_deleted, "del": p.deleted,
            "a_id": [a[0] for a in p.task_rows], "a_ctx": [a[1] for a in p.task_rows],
            "a_cid": [a[2] for a in p.task_rows], "a_state": [a[3] for a in p.task_rows],
            "a_rel": [a[4] for a in p.task_rows], "a_payload": [a[5] for a in p.task_rows],
            "i_key": [i[0] for i in p.idem_rows], "i_fp": [i[1] for i in p.idem_rows],
            "i_rid": [i[2] for i in p.idem_rows], "i_exp": [i[3] for i in p.idem_rows],
        }
        row = self.conn.execute(_COMMIT, args).fetchone()
        return None if row is None else int(row[0])


def _safe(url: str) -> str:
    """The URL without its password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "(unparsable URL)"
    info.pop("password", None)
    return repr(psycopg.conninfo.make_conninfo(**info))  # type: ignore[arg-type]
