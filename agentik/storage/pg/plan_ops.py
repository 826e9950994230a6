"""Planning a PostgreSQL batch, op by op (``pg.plan``): one function per op, each checking
first (a refusal, AgentikError, takes nothing, so it leaves no hole), then adding its rows to the
:class:`~agentik.storage.pg.plan.Plan`. :func:`plan_op` dispatches by the op's exact type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import psycopg

from agentik.errors import (
    ConflictError,
    IdempotencyKeyReusedError,
    NotFoundError,
    StorageError,
)
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.pg.plan import Conv, Found, Plan, Result, const
from agentik.wire import (
    AssistantMessageEvent,
    CompactionTriggered,
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
    WorkingItem,
    decode_message,
    decode_working_item,
)


def _create(p: Plan, op: ops.CreateConversation) -> Result:
    if p.conv.get(op.conversation_id) is not None:
        raise StorageError(f"conversation {op.conversation_id!r} already exists")
    rel = p.alloc()
    conv = Conv(op.conversation_id, op.title, op.is_temporal, p.now, p.now, None, rel,
                 in_db=False, max_order=0)
    p.conv[conv.id] = conv
    p.remember(conv.id, SystemItem(text=op.system_prompt), None)
    p.emit(rel, conv.id, Created(conversation=conv.record(-rel)), "agent")
    p.created.append(conv.id)
    return lambda base: conv.record(base)


def _delete_op(p: Plan, op: ops.DeleteConversation) -> Result:
    if p.conv.get(op.conversation_id) is None:
        return const(False)
    p.delete(op.conversation_id, "deleted")
    return const(True)


def _rename(p: Plan, op: ops.RenameConversation) -> Result:
    conv = p.require(op.conversation_id)
    rel = p.alloc()
    conv = p.bump(conv, rel, touch=True, rename=(op.title,))
    p.emit(rel, conv.id, Renamed(conversation_id=conv.id, title=op.title, updated_at=p.now),
           "agent")
    return lambda base: conv.record(base)


def _append_user(p: Plan, op: ops.AppendUserMessage) -> Result:
    cid = op.conversation_id
    conv = p.conv.get(cid)
    if conv is None:
        raise NotFoundError(f"conversation {cid!r} not found")
    rel = p.journal(conv, op.message_id, op.message, UserMessageEvent)
    p.turns[op.message_id] = (cid, "queued" if op.start is None else "running", rel)
    if op.start is not None:  # started with its message (ops.AppendUserMessage.start)
        p.remember(cid, op.start, op.message_id)
    return rel


_NONE = const(None)


def _start_turn(p: Plan, op: ops.StartTurn) -> Result:
    p.require(op.conversation_id)
    if op.recheck and (op.conversation_id, op.turn_id) in _found(p).started:
        return _NONE  # stored: its user item is in working memory
    p.remember(op.conversation_id, op.item, op.turn_id)
    queued = p.turns.get(op.turn_id)
    if queued is not None:
        p.turns[op.turn_id] = (queued[0], "running", queued[2])
    else:
        p.turns_running.append((op.conversation_id, op.turn_id))
    return _NONE


def _found(p: Plan) -> Found:
    assert p.found is not None  # read with a batch holding a recheck (PgWriter._plan)
    return p.found


def _stored(p: Plan, op: ops.Recheckable) -> Result | None:
    """A rechecked op's result when its first attempt is stored (``ops.rechecked``): one of its
    records is in the journal, or (a FinishTurn) its turn row is gone; else None."""
    found = _found(p)
    records = [found.records[i] for i in ops.journal_ids(op) if i in found.records]
    if not records:
        if type(op) is not ops.FinishTurn or op.turn_id is None:
            return None
        if (op.conversation_id, op.turn_id) in found.turns or op.turn_id in p.turns:
            return None  # still open: not stored
    return const(records[0] if type(op) is ops.AppendToolResult else records)


def read_found(conn: psycopg.Connection[Any], batch: list[ops.AnyOp]) -> Found | None:
    """The one read the rechecked ops of ``batch`` (``ops.rechecked``) need (``PgWriter._load``):
    their records already stored, which of their FinishTurns' turns are still open, which of
    their StartTurns' items and Compacts are stored; None (nothing read) when it has none. A
    retry after an unknown outcome is planned only once that outcome's session has ended
    (``PgWriter._settle``), so this sees whatever it left."""
    rechecks: list[ops.Recheckable] = [
        op for op in batch if type(op) in ops.RECHECKABLE and op.recheck]  # type: ignore[misc,union-attr]
    if not rechecks:
        return None
    found = Found()
    ids = [i for op in rechecks for i in ops.journal_ids(op)]
    if ids:
        for r in conn.execute("SELECT id, seq, conversation_id, created_at, payload FROM message "
                              "WHERE id = ANY(%s::text[])", (ids,)):
            found.records[r[0]] = MessageRecord(id=r[0], seq=int(r[1]), conversation_id=r[2],
                                                created_at=r[3], message=decode_message(r[4]))
    found.turns = _pairs(conn, "turn", "id", [(op.conversation_id, op.turn_id) for op in rechecks
                                              if type(op) is ops.FinishTurn and op.turn_id])
    found.started = _pairs(conn, "working_memory", "source_message_id", [
        (op.conversation_id, op.turn_id) for op in rechecks if type(op) is ops.StartTurn])
    found.compacted = {(op.conversation_id, op.before_order_idx) for op in rechecks
                       if type(op) is ops.Compact and ops.compacted(op, _kept(conn, op))}
    return found


def _kept(conn: psycopg.Connection[Any], op: ops.Compact) -> list[WorkingItem]:
    """The first two working-memory items between the system prompt and ``op``'s cut."""
    return [decode_working_item(r[0]) for r in conn.execute(
        "SELECT payload FROM working_memory WHERE conversation_id = %(c)s AND order_idx < %(b)s "
        "AND order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %(c)s) "
        "ORDER BY order_idx LIMIT 2", {"c": op.conversation_id, "b": op.before_order_idx})]


def _pairs(conn: psycopg.Connection[Any], table: str, column: str,
           pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of ``pairs`` (conversation id, ``column``) that rows of ``table`` have; no read
    when there are none."""
    if not pairs:
        return set()
    return {(r[0], r[1]) for r in conn.execute(
        f"SELECT conversation_id, {column} FROM {table} WHERE (conversation_id, {column}) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([t[0] for t in pairs], [t[1] for t in pairs]))}


def _tool_calls(p: Plan, op: ops.AppendToolCalls) -> Result:
    p.require(op.conversation_id)
    if op.recheck and (stored := _stored(p, op)) is not None:
        return stored
    made = tuple(p.journal(p.require(op.conversation_id), message_id, call, ToolCallEvent)
                 for message_id, call in op.calls)
    p.remember(op.conversation_id, op.item, None)
    return made


def _tool_result(p: Plan, op: ops.AppendToolResult) -> Result:
    if op.recheck and (stored := _stored(p, op)) is not None:
        p.require(op.conversation_id)
        return stored
    rel = p.journal(p.require(op.conversation_id), op.message_id, op.result,
                    ToolFailed if op.result.is_error else ToolResultEvent)
    p.remember(op.conversation_id, op.item, op.message_id)
    return rel


def _finish_turn(p: Plan, op: ops.FinishTurn) -> Result:
    cid = op.conversation_id
    p.require(cid)
    if op.recheck and (stored := _stored(p, op)) is not None:
        return stored
    made: list[int] = []
    if op.assistant is not None:
        message_id, answer = op.assistant
        made.append(p.journal(p.require(cid), message_id, answer, AssistantMessageEvent))
        if op.item is not None:
            p.remember(cid, op.item, message_id)
    if op.interrupted:
        rel = p.alloc()
        p.bump(p.require(cid), rel)
        p.emit(rel, cid, Interrupted(turn_id=op.turn_id), "conversation")
    if op.error is not None:
        message_id, error = op.error
        made.append(p.journal(p.require(cid), message_id, error, ErrorEvent))
    if op.turn_id is not None:
        if p.turns.pop(op.turn_id, None) is None:
            p.turns_deleted.append((cid, op.turn_id))
    p.touch(cid)
    return tuple(made)


def _compact(p: Plan, op: ops.Compact) -> Result:
    cid = op.conversation_id
    p.require(cid)
    if op.recheck and (cid, op.before_order_idx) in _found(p).compacted:
        return _NONE  # stored (ops.compacted)
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
    return const(None)


def _recover_turns(p: Plan, op: ops.RecoverTurns) -> Result:
    open_turns, orphans = p.open_turns.pop(op.conversation_id, ([], []))
    closed = 0
    for cid, turn_id in open_turns:
        if p.conv.get(cid) is None:
            continue
        error = Error(message=op.message, code=op.code, turn_id=turn_id)
        p.journal(p.require(cid), new_id(), error, ErrorEvent)
        p.touch(cid)
        p.turns_deleted.append((cid, turn_id))
        closed += 1
    p.turns_deleted.extend(orphans)
    return const(closed)


def _purge_temporary(p: Plan, op: ops.PurgeTemporary) -> Result:
    ids, p.temporary = p.temporary or [], []
    for cid in ids:
        if p.conv.get(cid) is not None:
            p.delete(cid, "temporary conversation ended by restart")
    return const(len(ids))


def _put_a2a_task(p: Plan, op: ops.PutA2ATask) -> Result:
    if op.conversation_id is not None:  # its tasks went with it: none outlives it
        p.require(op.conversation_id)
    stored = p.tasks.get(op.task_id)
    if isinstance(stored, tuple) or stored != op.expect_seq:
        shown = "changed in this batch" if isinstance(stored, tuple) else f"at seq {stored}"
        raise ConflictError(f"task {op.task_id!r} is {shown}, the change expected {op.expect_seq}")
    p.tasks[op.task_id] = ("rel", rel := p.alloc())
    p.task_rows.append((op.task_id, op.context_id, op.conversation_id, op.state, rel, op.task))
    p.emit(rel, op.conversation_id, TaskUpdated(task_id=op.task_id, context_id=op.context_id,
                                                state=op.state, update=msgspec.Raw(op.update)), "a2a")
    return lambda base: base + rel


def _idempotent(p: Plan, idem: ops.Idempotency | None, result_id: str,
                write: Callable[[], Result]) -> Result:
    """The SQLite writer's ``_idempotent``, planned: a known key replays its first answer,
    another body with it is refused, a free key is stored with the write."""
    if idem is None:
        return write()
    known = p.idem.get(idem.key)
    if known is not None:
        if known[0] != idem.fingerprint:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was already used with another request"
            )
        return const(ops.Replayed(result_id=known[1]))
    result = write()
    p.idem[idem.key] = (idem.fingerprint, result_id)
    p.idem_rows.append((idem.key, idem.fingerprint, result_id, p.now + idem.ttl))
    return result


def _create_op(p: Plan, op: ops.CreateConversation) -> Result:
    if op.idempotency is None:
        return _create(p, op)
    return _idempotent(p, op.idempotency, op.conversation_id, lambda: _create(p, op))


def _append_user_op(p: Plan, op: ops.AppendUserMessage) -> Result:
    if op.idempotency is None:
        return _append_user(p, op)
    return _idempotent(p, op.idempotency, op.message_id, lambda: _append_user(p, op))


#: op type -> its function: every member of ``ops.AnyOp`` (dispatched by exact type: a
#: ``match`` made an ``isinstance`` through msgspec's metaclass per case tried)
_PLAN: dict[type[Any], Callable[[Plan, Any], Result]] = {
    ops.CreateConversation: _create_op,
    ops.DeleteConversation: _delete_op,
    ops.RenameConversation: _rename,
    ops.AppendUserMessage: _append_user_op,
    ops.StartTurn: _start_turn,
    ops.AppendToolCalls: _tool_calls,
    ops.AppendToolResult: _tool_result,
    ops.FinishTurn: _finish_turn,
    ops.Compact: _compact,
    ops.RecoverTurns: _recover_turns,
    ops.PurgeTemporary: _purge_temporary,
    ops.PutA2ATask: _put_a2a_task,
}


def plan_op(p: Plan, op: ops.AnyOp) -> Result:
    return _PLAN[type(op)](p, op)
