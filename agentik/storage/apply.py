"""Each storage op, defined once for both engines: what it checks, reads and writes.

An op is written against :class:`Target` (``storage/target.py``), the primitives an engine
provides inside one batch: checks and reads first (a refused op raises AgentikError before it
writes anything: PostgreSQL plans a batch without savepoints, so a refusal must take nothing),
then writes (an offset from ``alloc``, a durable event from ``emit``, a journal record, working
memory, turn rows, ...), then its result. SQLite (``sqlite/ops.py``) runs each primitive as SQL
inside the batch transaction; PostgreSQL (``pg/plan_ops.py``) plans it into the rows of the
batch's one statement. Adding an op or a field is a change here (and, for a new primitive, one
method an engine: ``mypy`` refuses an engine that lacks it, ``tests/test_storage_ops.py`` runs
every op on both engines).

``Rec`` is how an engine hands back a journal record it wrote (SQLite: the record; PostgreSQL:
its batch-relative offset, the record is made after commit); an op's result is such a record, a
list of them, or what ``value``, ``conversation`` and ``offset`` make (SQLite: the value;
PostgreSQL: what makes it from the batch's base offset).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from agentik.errors import ConflictError, StorageError
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.target import Rec, RecordEvent, Target
from agentik.storage.types import OUTCOME_UNKNOWN, unanswered
from agentik.wire import (
    ApprovalAnswer,
    ApprovalGiven,
    ApprovalRequest,
    ApprovalRequested,
    AssistantMessage,
    AssistantMessageEvent,
    BranchChanged,
    BranchPoint,
    CompactionTriggered,
    ConversationClosing,
    Created,
    Deleted,
    Error,
    ErrorEvent,
    InputGiven,
    InputRequested,
    Interrupted,
    PauseAnswer,
    Renamed,
    SystemItem,
    TaskUpdated,
    ToolCall,
    ToolCallEvent,
    ToolFailed,
    ToolItem,
    ToolResult,
    ToolResultEvent,
    Touched,
    UserMessage,
    UserMessageEvent,
)

# --- shared steps --------------------------------------------------------------------------------


def touch(t: Target[Rec], cid: str) -> None:
    seq = t.alloc()
    t.bump(cid, seq, touch=True)
    t.emit(seq, cid, Touched(conversation_id=cid, updated_at=t.now))


def delete(t: Target[Rec], cid: str, reason: str) -> None:
    t.emit(t.alloc(), cid, ConversationClosing(reason=reason))
    agent = t.drop_conversation(cid)
    t.emit(t.alloc(), cid, Deleted(conversation_id=cid, agent=agent))


def idempotent(t: Target[Rec], idem: ops.Idempotency | None, result_id: str,
               write: Callable[[], object]) -> object:
    """``write`` stored with its key, or the key's replay (``ops.replay``)."""
    if idem is None:
        return write()
    replayed = ops.replay(t.idempotency(idem.key), idem)
    if replayed is not None:
        return t.value(replayed)
    result = write()
    t.keep_key(idem, result_id)
    return result


def _stored(t: Target[Rec], op: ops.Recheckable) -> object | None:
    """A rechecked op's result when its first attempt is stored (``ops.rechecked``): one of its
    records is in the journal, or (a FinishTurn) its turn row is gone; else None."""
    records = t.stored_records(ops.journal_ids(op))
    if not records and (type(op) is not ops.FinishTurn or op.turn_id is None
                        or t.turn_open(op.conversation_id, op.turn_id)):
        return None
    one = type(op) is ops.AppendToolResult or type(op) is ops.AnswerPause
    return t.value(records[0] if one else records)


# --- the ops -------------------------------------------------------------------------------------


def _create(t: Target[Rec], op: ops.CreateConversation) -> object:
    cid = op.conversation_id
    if t.exists(cid):
        raise StorageError(f"conversation {cid!r} already exists")
    seq = t.alloc()
    record = t.new_conversation(op, seq)
    if op.owner is not None:
        t.own(cid, op.owner)
    t.remember(cid, SystemItem(text=op.system_prompt), None)
    t.emit(seq, cid, Created(conversation=record))
    return t.conversation(cid)


def create(t: Target[Rec], op: ops.CreateConversation) -> object:
    return idempotent(t, op.idempotency, op.conversation_id, lambda: _create(t, op))


def delete_conversation(t: Target[Rec], op: ops.DeleteConversation) -> object:
    if not t.exists(op.conversation_id):
        return t.value(False)
    delete(t, op.conversation_id, "deleted")
    return t.value(True)


def rename(t: Target[Rec], op: ops.RenameConversation) -> object:
    cid = op.conversation_id
    t.require(cid)
    seq = t.alloc()
    t.rename(cid, op.title, seq)
    t.emit(seq, cid, Renamed(conversation_id=cid, title=op.title, updated_at=t.now))
    return t.conversation(cid)


def append_user(t: Target[Rec], op: ops.AppendUserMessage) -> object:
    """The user message, its turn and, if it starts with it (``ops.AppendUserMessage.start``),
    its working-memory item; under an Idempotency-Key, that stored with the key, or the key's
    replay. (One function for the common case: a call a message fewer.)"""
    if op.idempotency is not None:
        plain = msgspec.structs.replace(op, idempotency=None)
        return idempotent(t, op.idempotency, op.message_id, lambda: append_user(t, plain))
    cid, mid, start = op.conversation_id, op.message_id, op.start
    if op.edit_of is not None:  # the tree's rule reads it first (actors/branches.py)
        t.journal(cid, new_id(), BranchPoint(kind="edit", message_id=op.edit_of), BranchChanged)
    record = t.journal(cid, mid, op.message, UserMessageEvent)
    t.open_turn(cid, mid, start is not None, record)
    if start is not None:
        t.remember(cid, start, mid)
    return record


def start_turn(t: Target[Rec], op: ops.StartTurn) -> object:
    cid = op.conversation_id
    t.require(cid)
    if op.recheck and t.started(cid, op.turn_id):  # stored: its user item is in working memory
        return t.value(None)
    if op.item is not None:  # (a regenerate's: its user message is in working memory)
        t.remember(cid, op.item, op.turn_id)
    t.run_turn(cid, op.turn_id)
    return t.value(None)


def tool_calls(t: Target[Rec], op: ops.AppendToolCalls) -> object:
    cid = op.conversation_id
    if op.recheck:
        t.require(cid)
        if (stored := _stored(t, op)) is not None:
            return stored
    elif not op.calls:
        t.require(cid)  # an empty round takes no seq: checked here
    made = [t.journal(cid, message_id, call, ToolCallEvent)
            for message_id, call in op.calls]
    if op.item is not None:
        t.remember(cid, op.item, None)
    for message_id, pause in op.pauses:
        made.append(t.journal(cid, message_id, pause, ApprovalRequested
                              if type(pause) is ApprovalRequest else InputRequested))
    if op.pauses and op.turn_id is not None:
        t.run_turn(cid, op.turn_id, waiting=True)
    return made


def answer_pause(t: Target[Rec], op: ops.AnswerPause) -> object:
    cid = op.conversation_id
    t.require(cid)
    if op.recheck and (stored := _stored(t, op)) is not None:
        return stored
    answer: PauseAnswer = op.answer
    record = t.journal(cid, op.message_id, answer,
                       ApprovalGiven if type(answer) is ApprovalAnswer else InputGiven)
    if op.resume and op.turn_id is not None:
        t.run_turn(cid, op.turn_id)
    return record


def tool_result(t: Target[Rec], op: ops.AppendToolResult) -> object:
    cid = op.conversation_id
    if op.recheck:
        t.require(cid)
        if (stored := _stored(t, op)) is not None:
            return stored
    record = t.journal(cid, op.message_id, op.result,
                       ToolFailed if op.result.is_error else ToolResultEvent)
    t.remember(cid, op.item, op.message_id)
    return record


def finish_turn(t: Target[Rec], op: ops.FinishTurn) -> object:
    """The turn's terminal records (answer, Interrupted, Error), its working memory past
    ``forget_from`` removed, its turn row closed, then Touched."""
    cid = op.conversation_id
    t.require(cid)
    if op.recheck and (stored := _stored(t, op)) is not None:
        return stored
    made: list[Rec] = []
    if op.assistant is not None:
        message_id, answer = op.assistant
        made.append(t.journal(cid, message_id, answer, AssistantMessageEvent))
        if op.item is not None:
            t.remember(cid, op.item, message_id)
        if tokens := ops.tokens_of(op):
            t.count_tokens(cid, tokens)
    if op.interrupted:
        seq = t.alloc()
        t.bump(cid, seq)
        t.emit(seq, cid, Interrupted(turn_id=op.turn_id))
    if op.error is not None:
        message_id, error = op.error
        made.append(t.journal(cid, message_id, error, ErrorEvent))
    if op.forget_from is not None:
        t.forget(cid, op.forget_from)
    if op.turn_id is not None:
        t.close_turn(cid, op.turn_id)
    touch(t, cid)
    return made


def compact(t: Target[Rec], op: ops.Compact) -> object:
    cid = op.conversation_id
    t.require(cid)
    if op.recheck and t.compacted(op):
        return t.value(None)
    t.compact(cid, op.before_order_idx, op.summary)
    seq = t.alloc()
    t.bump(cid, seq)
    t.emit(seq, cid, CompactionTriggered(dropped_items=op.dropped,
                                         summary=getattr(op.summary, "text", None)))
    return t.value(None)


def recover_turns(t: Target[Rec], op: ops.RecoverTurns) -> object:
    """The running turns get a failed result for each call without one (never run again) and
    their Error; queued and waiting ones stay, for the conversation's next actor (a message
    accepted is answered: ``Registry._start``; a pause waits on: ``actors/pausing.py``)."""
    turns = t.open_turns(op.conversation_id)
    for cid, turn_id in turns:
        for call in unanswered(turn_id, t.turn_calls(cid, turn_id)):
            result = ToolResult(call_id=call.call_id, name=call.name, content=OUTCOME_UNKNOWN,
                                is_error=True, turn_id=turn_id)
            message_id = new_id()
            t.journal(cid, message_id, result, ToolFailed)
            t.remember(cid, ToolItem(call_id=call.call_id, name=call.name,
                                     content=OUTCOME_UNKNOWN), message_id)
        error = Error(message=op.message, code=op.code, turn_id=turn_id)
        t.journal(cid, new_id(), error, ErrorEvent)
        touch(t, cid)
    t.drop_turns(op.conversation_id)
    return t.value(turns)


def purge_temporary(t: Target[Rec], op: ops.PurgeTemporary) -> object:
    ids = t.temporary()
    for cid in ids:
        if t.exists(cid):
            delete(t, cid, "temporary conversation ended by restart")
    return t.value(len(ids))


def put_a2a_task(t: Target[Rec], op: ops.PutA2ATask) -> object:
    if op.conversation_id is not None:  # its tasks went with it: none outlives it
        t.require(op.conversation_id)
    stored = t.task_seq(op.task_id)
    if stored != op.expect_seq:
        shown = stored if isinstance(stored, str) else f"at seq {stored}"
        raise ConflictError(f"task {op.task_id!r} is {shown}, the change expected {op.expect_seq}")
    seq = t.alloc()
    if not op.chunk:  # a chunk leaves the row as it is (ops.PutA2ATask.chunk)
        t.put_task(op, seq)
    t.emit(seq, op.conversation_id, TaskUpdated(task_id=op.task_id, context_id=op.context_id,
                                                state=op.state, update=msgspec.Raw(op.update)))
    return t.offset(seq)


def put_webhook(t: Target[Rec], op: ops.PutWebhook) -> object:
    if (new := not t.webhook_exists(op.spec.id)) or op.replace:
        t.put_webhook(op, new)
    return t.value(new)


def delete_webhook(t: Target[Rec], op: ops.DeleteWebhook) -> object:
    if found := t.webhook_exists(op.webhook_id):
        t.drop_webhook(op.webhook_id)
    return t.value(found)


def webhook_progress(t: Target[Rec], op: ops.WebhookProgress) -> object:
    if found := t.webhook_exists(op.webhook_id):  # (deleted while it was delivering: not)
        t.webhook_progress(op)
    return t.value(found)


# --- branches (docs/PROTOCOL.md "Branches") ------------------------------------------------------


def regenerate(t: Target[Rec], op: ops.Regenerate) -> object:
    def write() -> object:
        point = BranchPoint(kind="regenerate", message_id=op.of)
        record = t.journal(op.conversation_id, op.turn_id, point, BranchChanged)
        t.open_turn(op.conversation_id, op.turn_id, False, record)
        return record
    return idempotent(t, op.idempotency, op.turn_id, write)


def _reset(t: Target[Rec], cid: str, memory_from: int, items: ops.SourcedItems) -> None:
    t.forget(cid, memory_from)
    for item, source in items:
        t.remember(cid, item, source)


def switch_branch(t: Target[Rec], op: ops.SwitchBranch) -> object:
    def write() -> object:
        point = BranchPoint(kind="switch", message_id=op.to)
        record = t.journal(op.conversation_id, op.message_id, point, BranchChanged)
        _reset(t, op.conversation_id, op.memory_from, op.items)
        return record
    return idempotent(t, op.idempotency, op.message_id, write)


def reset_memory(t: Target[Rec], op: ops.ResetMemory) -> object:
    t.require(op.conversation_id)
    _reset(t, op.conversation_id, op.memory_from, op.items)
    return t.value(None)


#: the event of each record a fork copies (an error result's: ToolFailed)
_COPIED: dict[type, type[RecordEvent]] = {
    UserMessage: UserMessageEvent, AssistantMessage: AssistantMessageEvent,
    ToolCall: ToolCallEvent, ToolResult: ToolResultEvent, Error: ErrorEvent}


def fork(t: Target[Rec], op: ops.ForkConversation) -> object:
    """A conversation made with its history: copies of another's records (docs/PROTOCOL.md
    "Branches" says why copies) and its working memory after its system prompt."""
    def write() -> object:
        cid = op.conversation_id
        _create(t, ops.CreateConversation(
            conversation_id=cid, title=op.title, is_temporal=False, system_prompt=op.system_prompt,
            agent=op.agent, instructions=op.instructions, owner=op.owner))
        for message_id, message in op.messages:
            failed = isinstance(message, ToolResult) and message.is_error
            t.journal(cid, message_id, message, ToolFailed if failed else _COPIED[type(message)])
        for item, source in op.items:
            t.remember(cid, item, source)
        return t.value(cid)
    return idempotent(t, op.idempotency, op.conversation_id, write)


#: op type -> its definition: every member of ``ops.AnyOp`` (dispatched by exact type, a dict
#: look-up: a ``match`` made an ``isinstance`` through msgspec's metaclass per case tried)
APPLY: dict[type[Any], Callable[[Any, Any], Any]] = {
    ops.CreateConversation: create,
    ops.DeleteConversation: delete_conversation,
    ops.RenameConversation: rename,
    ops.AppendUserMessage: append_user,
    ops.StartTurn: start_turn,
    ops.AppendToolCalls: tool_calls,
    ops.AppendToolResult: tool_result,
    ops.AnswerPause: answer_pause,
    ops.FinishTurn: finish_turn,
    ops.Compact: compact,
    ops.RecoverTurns: recover_turns,
    ops.PurgeTemporary: purge_temporary,
    ops.PutA2ATask: put_a2a_task,
    ops.PutWebhook: put_webhook,
    ops.DeleteWebhook: delete_webhook,
    ops.WebhookProgress: webhook_progress,
    ops.Regenerate: regenerate,
    ops.SwitchBranch: switch_branch,
    ops.ResetMemory: reset_memory,
    ops.ForkConversation: fork,
}


def apply_op(t: Target[Rec], op: ops.AnyOp) -> object:
    """``op`` applied to ``t``: its result. Raises AgentikError when it is refused."""
    return APPLY[type(op)](t, op)
