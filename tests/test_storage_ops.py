"""The per-op contract, on both engines: a case for every field of every op (``ops.AnyOp``),
each run through the StorageActor on SQLite and on PostgreSQL and checked by what the read side
returns. An op's field with no case fails :func:`test_every_field_of_every_op_has_a_case`, so a
field added to an op is one change in ``storage/apply.py`` and one case here."""

from __future__ import annotations

import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import msgspec
import pytest
import trio

from agentik.errors import (
    ConflictError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    NotFoundError,
)
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.types import StoredEvent
from agentik.wire import (
    ApprovalAnswer,
    ApprovalRequest,
    AssistantItem,
    AssistantMessage,
    BranchPoint,
    Deleted,
    Error,
    InputAnswer,
    InputRequest,
    MessageRecord,
    SummaryItem,
    SystemItem,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserItem,
    UserMessage,
    WorkingItem,
)
from tests.conftest import StorageTarget

Case = Callable[[Storage], Awaitable[None]]
#: (op class, field) -> the case that shows the field does what it says, on either engine
CASES: dict[tuple[type, str], Case] = {}


def case(op: type, *fields: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        for field in fields or ("",):
            CASES[(op, field)] = fn
        return fn
    return register


def test_every_field_of_every_op_has_a_case() -> None:
    wanted = {(cls, f.name) for cls in typing.get_args(ops.AnyOp)
              for f in msgspec.structs.fields(cls)} | {(ops.PurgeTemporary, "")}
    assert wanted - set(CASES) == set()


@asynccontextmanager
async def open_storage(target: StorageTarget) -> AsyncIterator[Storage]:
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(
            partial(run_storage, target.path, database_url=target.url))
        yield storage
        nursery.cancel_scope.cancel()


# --- helpers -------------------------------------------------------------------------------------


def user(text: str = "q") -> UserItem:
    return UserItem(content=[Text(body=text)])


async def create(st: Storage, cid: str = "c", *, temporal: bool = False) -> None:
    await st.write(ops.CreateConversation(conversation_id=cid, title=None, is_temporal=temporal,
                                          system_prompt="sys"))


async def send(st: Storage, mid: str, cid: str = "c", *, start: bool = False) -> MessageRecord:
    record = await st.write(ops.AppendUserMessage(
        conversation_id=cid, message_id=mid, message=UserMessage(content=[Text(body=mid)]),
        start=user(mid) if start else None))
    assert isinstance(record, MessageRecord)
    return record


async def memory(st: Storage, cid: str = "c") -> list[WorkingItem]:
    return [item for _, item in await st.reader.working_memory(cid)]


async def journal(st: Storage, cid: str = "c") -> list[MessageRecord]:
    return await st.reader.journal(cid, 0, None, 1000)


async def events(st: Storage, after: int = 0) -> list[StoredEvent]:
    _, _, page = await st.reader.outbox_page(after, None, None, 1000)
    return page


async def open_turns(st: Storage, cid: str = "c") -> int:
    """How many turns of ``cid`` are open: running (closing them: RecoverTurns returns them)
    and queued (which RecoverTurns leaves)."""
    closed = await st.write(ops.RecoverTurns(conversation_id=cid))
    assert isinstance(closed, list)
    return len(closed) + len(await st.reader.queued_turns(cid))


def call(mid: str) -> tuple[str, ToolCall]:
    return (mid, ToolCall(call_id=f"k-{mid}", name="add", arguments="{}"))


def calls_item(*mids: str) -> AssistantItem:
    return AssistantItem(content=[], tool_calls=[
        ToolCallSpec(call_id=f"k-{m}", name="add", arguments="{}") for m in mids])


def key(fingerprint: str) -> ops.Idempotency:
    return ops.Idempotency(key="k1", fingerprint=fingerprint, ttl=60.0)


# --- CreateConversation, DeleteConversation, RenameConversation ----------------------------------


@case(ops.CreateConversation, "conversation_id", "title", "is_temporal", "system_prompt")
async def _create(st: Storage) -> None:
    made = await st.write(ops.CreateConversation(conversation_id="c", title="t", is_temporal=True,
                                                 system_prompt="be brief"))
    stored = await st.reader.get_conversation("c")
    assert stored is not None and (stored.id, stored.title, stored.is_temporal) == ("c", "t", True)
    assert made == stored and stored.seq == 1
    assert await memory(st) == [SystemItem(text="be brief")]
    (created,) = await events(st)
    assert (created.kind, created.type, created.offset) == ("agent", "created", 1)
    assert created.event.event.conversation == stored  # type: ignore[union-attr]


@case(ops.CreateConversation, "agent", "instructions")
async def _create_for_an_agent(st: Storage) -> None:
    made = await st.write(ops.CreateConversation(conversation_id="c", title=None,
                                                 is_temporal=False, system_prompt="s",
                                                 agent="helper", instructions="be brief"))
    stored = await st.reader.get_conversation("c")
    assert stored is not None and (stored.agent, stored.instructions) == ("helper", "be brief")
    assert made == stored
    await st.write(ops.RenameConversation(conversation_id="c", title="t"))  # kept by a change
    renamed = await st.reader.get_conversation("c")
    assert renamed is not None and (renamed.agent, renamed.instructions) == ("helper", "be brief")
    await create(st, "d")
    plain = await st.reader.get_conversation("d")
    assert plain is not None and (plain.agent, plain.instructions) == ("default", None)


@case(ops.CreateConversation, "idempotency")
async def _create_idempotent(st: Storage) -> None:
    op = ops.CreateConversation(conversation_id="c", title=None, is_temporal=False,
                                system_prompt="s", idempotency=key("f"))
    await st.write(op)
    assert await st.write(msgspec.structs.replace(op, conversation_id="c2")) == ops.Replayed(
        result_id="c")
    with pytest.raises(IdempotencyKeyReusedError):
        await st.write(msgspec.structs.replace(op, conversation_id="c3", idempotency=key("g")))
    assert [c.id for c in await st.reader.list_conversations(0, 10)] == ["c"]
    assert await st.reader.idempotency_key("k1", 0.0) == ("f", "c")


@case(ops.DeleteConversation, "conversation_id")
async def _delete(st: Storage) -> None:
    await create(st)
    await send(st, "m")
    await st.write(ops.PutA2ATask(task_id="t", context_id="x", conversation_id="c",
                                  state="working", task=b"{}", update=b"{}", expect_seq=None))
    assert await st.write(ops.DeleteConversation(conversation_id="c")) is True
    assert await st.reader.get_conversation("c") is None
    assert await journal(st) == [] and await memory(st) == []
    assert await st.reader.get_a2a_task("t") is None
    assert [(e.kind, e.type) for e in (await events(st))[-2:]] == [
        ("conversation", "conversation_closing"), ("agent", "deleted")]
    assert await st.write(ops.DeleteConversation(conversation_id="c")) is False
    # the Deleted event names the agent the conversation belonged to
    await st.write(ops.CreateConversation(conversation_id="s", title=None, is_temporal=False,
                                          system_prompt="sys", agent="support"))
    await st.write(ops.DeleteConversation(conversation_id="s"))
    assert (await events(st))[-1].event.event == Deleted(conversation_id="s", agent="support")


@case(ops.RenameConversation, "conversation_id", "title")
async def _rename(st: Storage) -> None:
    await create(st)
    renamed = await st.write(ops.RenameConversation(conversation_id="c", title="new"))
    assert renamed == await st.reader.get_conversation("c")
    assert renamed.title == "new" and renamed.seq == 2
    last = (await events(st))[-1]
    assert (last.kind, last.type, last.offset) == ("agent", "renamed", 2)
    with pytest.raises(NotFoundError):
        await st.write(ops.RenameConversation(conversation_id="nope", title="x"))
    await send(st, "m")  # a refusal leaves no hole
    assert [e.offset for e in await events(st)] == [1, 2, 3]


# --- a turn's writes -----------------------------------------------------------------------------


@case(ops.AppendUserMessage, "conversation_id", "message_id", "message")
async def _append_user(st: Storage) -> None:
    await create(st)
    record = await send(st, "m1")
    assert await journal(st) == [record] and record.seq == 2
    assert record.message == UserMessage(content=[Text(body="m1")])
    conversation = await st.reader.get_conversation("c")
    assert conversation is not None and conversation.seq == 2
    last = (await events(st))[-1]
    assert (last.kind, last.type, last.offset) == ("conversation", "user_message", 2)
    assert await memory(st) == [SystemItem(text="sys")]  # not before its turn starts
    with pytest.raises(NotFoundError):
        await send(st, "m2", "nope")
    assert (await send(st, "m3")).seq == 3  # no hole
    assert await open_turns(st) == 2


@case(ops.AppendUserMessage, "idempotency")
async def _append_user_idempotent(st: Storage) -> None:
    await create(st)
    op = ops.AppendUserMessage(conversation_id="c", message_id="m1", idempotency=key("f"),
                               message=UserMessage(content=[Text(body="x")]))
    await st.write(op)
    assert await st.write(msgspec.structs.replace(op, message_id="m2")) == ops.Replayed(
        result_id="m1")
    with pytest.raises(IdempotencyKeyReusedError):
        await st.write(msgspec.structs.replace(op, message_id="m3", idempotency=key("g")))
    assert [r.id for r in await journal(st)] == ["m1"]


@case(ops.AppendUserMessage, "start")
async def _append_user_start(st: Storage) -> None:
    await create(st)
    await send(st, "m1", start=True)
    rows = await st.reader.working_memory("c")
    assert rows == [(1, SystemItem(text="sys")), (2, user("m1"))]
    assert await open_turns(st) == 1


@case(ops.StartTurn, "conversation_id", "turn_id", "item")
async def _start_turn(st: Storage) -> None:
    await create(st)
    await send(st, "m1")
    assert await st.write(ops.StartTurn(conversation_id="c", turn_id="m1", item=user())) is None
    assert await memory(st) == [SystemItem(text="sys"), user()]
    assert len(await events(st)) == 2  # takes no offset
    with pytest.raises(NotFoundError):
        await st.write(ops.StartTurn(conversation_id="nope", turn_id="m1", item=user()))


@case(ops.StartTurn, "recheck")
async def _start_turn_recheck(st: Storage) -> None:
    await create(st)
    await send(st, "m1")
    op = ops.StartTurn(conversation_id="c", turn_id="m1", item=user())
    await st.write(op)
    await st.write(ops.rechecked(op))  # stored already: nothing again
    assert await memory(st) == [SystemItem(text="sys"), user()]
    await send(st, "m2")
    await st.write(ops.rechecked(msgspec.structs.replace(op, turn_id="m2")))  # not stored: it is
    assert len(await memory(st)) == 3


@case(ops.AppendToolCalls, "conversation_id", "calls", "item")
async def _tool_calls(st: Storage) -> None:
    await create(st)
    made = await st.write(ops.AppendToolCalls(conversation_id="c", calls=(call("a"), call("b")),
                                              item=calls_item("a", "b")))
    assert made == await journal(st) and [r.id for r in made] == ["a", "b"]
    assert [r.seq for r in made] == [2, 3]
    assert [e.type for e in await events(st)][1:] == ["tool_call", "tool_call"]
    assert await memory(st) == [SystemItem(text="sys"), calls_item("a", "b")]
    # a round with no calls takes no offset but is checked
    assert await st.write(ops.AppendToolCalls(conversation_id="c", calls=(),
                                              item=calls_item())) == []
    with pytest.raises(NotFoundError):
        await st.write(ops.AppendToolCalls(conversation_id="nope", calls=(), item=calls_item()))


@case(ops.AppendToolCalls, "recheck")
async def _tool_calls_recheck(st: Storage) -> None:
    await create(st)
    op = ops.AppendToolCalls(conversation_id="c", calls=(call("a"),), item=calls_item("a"))
    first = await st.write(op)
    assert await st.write(ops.rechecked(op)) == first
    assert len(await journal(st)) == 1 and len(await memory(st)) == 2


def _approval(mid: str) -> tuple[str, ApprovalRequest]:
    return (f"p-{mid}", ApprovalRequest(call_id=f"k-{mid}", tool="add", arguments="{}",
                                        deadline=5.0, turn_id="m1"))


@case(ops.AppendToolCalls, "pauses", "turn_id")
async def _tool_calls_pausing(st: Storage) -> None:
    """A round whose calls wait for a person: the requests journaled after the calls, and the
    turn stored waiting, which RecoverTurns leaves (start-up, a takeover) and reads find."""
    await create(st)
    await send(st, "m1", start=True)
    question = InputRequest(call_id="k-b", question="which?", choices=["x"], turn_id="m1")
    made = await st.write(ops.AppendToolCalls(
        conversation_id="c", calls=(call("a"), call("b")), item=calls_item("a", "b"),
        pauses=(_approval("a"), ("p-b", question)), turn_id="m1"))
    assert [r.id for r in made] == ["a", "b", "p-a", "p-b"]
    assert [r.message for r in made[2:]] == [_approval("a")[1], question]
    assert [e.type for e in await events(st)][-4:] == [
        "tool_call", "tool_call", "approval_requested", "input_requested"]
    assert await st.reader.waiting_turn("c") == ("m1", 2)
    assert await st.write(ops.RecoverTurns()) == []  # a waiting turn is not ended
    assert await st.reader.waiting_turn("c") == ("m1", 2)
    assert await st.reader.conversations_with_queued_turns() == ["c"]
    # without a turn id (or without pauses) no turn row changes
    await st.write(ops.AppendToolCalls(conversation_id="c", calls=(call("c"),),
                                       item=calls_item("c"), pauses=(_approval("c"),)))
    assert await st.reader.waiting_turn("c") == ("m1", 2)


@case(ops.AnswerPause, "conversation_id", "message_id", "answer", "turn_id", "resume")
async def _answer_pause(st: Storage) -> None:
    """An answer is journaled with its event; with ``resume`` the waiting turn runs again (a
    restart then ends it as any running turn), without it the turn still waits."""
    await create(st)
    await send(st, "m1", start=True)
    await st.write(ops.AppendToolCalls(
        conversation_id="c", calls=(call("a"), call("b")), item=calls_item("a", "b"),
        pauses=(_approval("a"), _approval("b")), turn_id="m1"))
    yes = ApprovalAnswer(call_id="k-a", approve=True, turn_id="m1")
    record = await st.write(ops.AnswerPause(conversation_id="c", message_id="g-a", answer=yes,
                                            turn_id="m1", resume=False))
    assert record == (await journal(st))[-1] and record.message == yes
    assert await st.reader.waiting_turn("c") == ("m1", 2)  # b still waits
    text = InputAnswer(call_id="k-b", text="no", turn_id="m1")
    await st.write(ops.AnswerPause(conversation_id="c", message_id="g-b", answer=text,
                                   turn_id="m1"))
    assert [e.type for e in await events(st)][-2:] == ["approval_given", "input_given"]
    assert await st.reader.waiting_turn("c") is None
    assert await st.write(ops.RecoverTurns()) == [("c", "m1")]  # running again
    with pytest.raises(NotFoundError):
        await st.write(ops.AnswerPause(conversation_id="nope", message_id="g-c", answer=yes))


@case(ops.AnswerPause, "recheck")
async def _answer_pause_recheck(st: Storage) -> None:
    await create(st)
    op = ops.AnswerPause(conversation_id="c", message_id="g-a",
                         answer=ApprovalAnswer(call_id="k-a", approve=False, reason="no"))
    first = await st.write(op)
    assert await st.write(ops.rechecked(op)) == first
    assert len(await journal(st)) == 1


def _result(error: bool) -> ToolResult:
    return ToolResult(call_id="k-a", name="add", content="3", is_error=error)


@case(ops.AppendToolResult, "conversation_id", "message_id", "result", "item")
async def _tool_result(st: Storage) -> None:
    await create(st)
    item = ToolItem(call_id="k-a", name="add", content="3")
    for mid, error in (("r1", False), ("r2", True)):
        record = await st.write(ops.AppendToolResult(conversation_id="c", message_id=mid,
                                                     result=_result(error), item=item))
        assert record == (await journal(st))[-1] and record.message == _result(error)
    assert [e.type for e in await events(st)][1:] == ["tool_result", "tool_failed"]
    assert await memory(st) == [SystemItem(text="sys"), item, item]


@case(ops.AppendToolResult, "recheck")
async def _tool_result_recheck(st: Storage) -> None:
    await create(st)
    op = ops.AppendToolResult(conversation_id="c", message_id="r1", result=_result(False),
                              item=ToolItem(call_id="k-a", name="add", content="3"))
    first = await st.write(op)
    assert await st.write(ops.rechecked(op)) == first
    assert len(await journal(st)) == 1 and len(await memory(st)) == 2


def _answer(text: str = "a") -> tuple[str, AssistantMessage]:
    return (f"a-{text}", AssistantMessage(content=[Text(body=text)]))


@case(ops.FinishTurn, "conversation_id", "turn_id", "assistant", "item")
async def _finish(st: Storage) -> None:
    await create(st)
    await send(st, "m1", start=True)
    item = AssistantItem(content=[Text(body="a")])
    made = await st.write(ops.FinishTurn(conversation_id="c", turn_id="m1", assistant=_answer(),
                                         item=item))
    assert made == (await journal(st))[-1:] and made[0].id == "a-a"
    assert [(e.kind, e.type) for e in (await events(st))[-2:]] == [
        ("conversation", "assistant_message"), ("agent", "touched")]
    assert await memory(st) == [SystemItem(text="sys"), user("m1"), item]
    assert await open_turns(st) == 0  # its turn is closed


@case(ops.FinishTurn, "interrupted", "error")
async def _finish_interrupted(st: Storage) -> None:
    await create(st)
    await send(st, "m1", start=True)
    error = ("e1", Error(message="boom", code="x", turn_id="m1"))
    made = await st.write(ops.FinishTurn(conversation_id="c", turn_id="m1", interrupted=True,
                                         error=error))
    assert [r.id for r in made] == ["e1"] and made[0].message == error[1]
    assert [e.type for e in (await events(st))[-3:]] == ["interrupted", "error", "touched"]
    assert (await events(st))[-3].event.event.turn_id == "m1"  # type: ignore[union-attr]


@case(ops.FinishTurn, "forget_from")
async def _finish_forget_from(st: Storage) -> None:
    """A turn too big for the context window: its items leave working memory (the journal keeps
    them), and the next turn's item comes right after what is left."""
    await create(st)
    await send(st, "big", start=True)
    await st.write(ops.FinishTurn(conversation_id="c", turn_id="big", forget_from=2,
                                  error=("e1", Error(message="too big", turn_id="big"))))
    assert await memory(st) == [SystemItem(text="sys")]
    assert [r.id for r in await journal(st)] == ["big", "e1"]
    await send(st, "next", start=True)
    assert await st.reader.working_memory("c") == [(1, SystemItem(text="sys")), (2, user("next"))]


@case(ops.FinishTurn, "recheck")
async def _finish_recheck(st: Storage) -> None:
    await create(st)
    await send(st, "m1", start=True)
    op = ops.FinishTurn(conversation_id="c", turn_id="m1", assistant=_answer())
    first = await st.write(op)
    assert await st.write(ops.rechecked(op)) == first
    assert [r.id for r in await journal(st)] == ["m1", "a-a"]
    # with no record of its own, a closed turn is what says it is stored
    await send(st, "m2", start=True)
    bare = ops.FinishTurn(conversation_id="c", turn_id="m2")
    await st.write(bare)
    before = len(await events(st))
    assert await st.write(ops.rechecked(bare)) == []
    assert len(await events(st)) == before


@case(ops.Compact, "conversation_id", "before_order_idx", "summary", "dropped")
async def _compact(st: Storage) -> None:
    await create(st)
    for mid in ("m1", "m2", "m3"):
        await send(st, mid, start=True)
    summary = SummaryItem(text="so far")
    await st.write(ops.Compact(conversation_id="c", before_order_idx=4, summary=summary,
                               dropped=2))
    assert await memory(st) == [SystemItem(text="sys"), summary, user("m3")]
    last = (await events(st))[-1]
    assert (last.kind, last.type) == ("conversation", "compaction_triggered")
    assert (last.event.event.dropped_items, last.event.event.summary) == (2, "so far")  # type: ignore[union-attr]
    await st.write(ops.Compact(conversation_id="c", before_order_idx=4, summary=None, dropped=1))
    assert await memory(st) == [SystemItem(text="sys"), user("m3")]


@case(ops.Compact, "recheck")
async def _compact_recheck(st: Storage) -> None:
    await create(st)
    for mid in ("m1", "m2"):
        await send(st, mid, start=True)
    op = ops.Compact(conversation_id="c", before_order_idx=3, summary=SummaryItem(text="s"),
                     dropped=1)
    await st.write(op)
    before = len(await events(st))
    await st.write(ops.rechecked(op))
    assert len(await events(st)) == before
    assert await memory(st) == [SystemItem(text="sys"), SummaryItem(text="s"), user("m2")]


# --- start-up and recovery -----------------------------------------------------------------------


@case(ops.RecoverTurns, "conversation_id", "message", "code")
async def _recover(st: Storage) -> None:
    await create(st, "c1")
    await create(st, "c2")
    await send(st, "m1", "c1", start=True)
    await send(st, "q1", "c1")  # queued behind m1: stays, for the conversation's next actor
    await send(st, "m2", "c2", start=True)
    await send(st, "q2", "c2")
    await send(st, "q3", "c2")
    assert await st.write(ops.RecoverTurns(conversation_id="c1", message="lost", code="node")
                          ) == [("c1", "m1")]
    (_, _, error) = await journal(st, "c1")
    assert error.message == Error(message="lost", code="node", turn_id="m1")
    assert [e.type for e in (await events(st))[-2:]] == ["error", "touched"]
    assert await st.write(ops.RecoverTurns()) == [("c2", "m2")]  # every conversation: c2's
    assert (await journal(st, "c2"))[-1].message == Error(
        message="interrupted by restart", code="restart", turn_id="m2")
    assert await st.write(ops.RecoverTurns()) == []
    # the queued ones, in the order they came, with their messages
    assert [(t, m.content) for t, m in await st.reader.queued_turns("c2")] == [  # type: ignore[union-attr]
        ("q2", [Text(body="q2")]), ("q3", [Text(body="q3")])]
    assert await st.reader.conversations_with_queued_turns() == ["c1", "c2"]


async def test_recovery_fails_the_calls_a_turn_was_running(target: StorageTarget) -> None:
    """A running turn's calls without a result get a failed one, "outcome unknown" (never run
    again), in the journal and in working memory, before its Error; calls of another turn, and
    those with a result, get none."""
    async with open_storage(target) as st:
        await create(st)
        await send(st, "m1", start=True)
        made = [(m, ToolCall(call_id=f"k-{m}", name="add", arguments="{}", turn_id="m1"))
                for m in ("a", "b", "c")]
        await st.write(ops.AppendToolCalls(conversation_id="c", calls=tuple(made),
                                           item=calls_item("a", "b", "c")))
        await st.write(ops.AppendToolResult(
            conversation_id="c", message_id="r-a", item=ToolItem(call_id="k-a", name="add",
                                                                 content="3"),
            result=ToolResult(call_id="k-a", name="add", content="3", turn_id="m1")))
        assert await st.write(ops.RecoverTurns()) == [("c", "m1")]
        records = (await journal(st))[-3:]
        unknown = "outcome unknown: the server stopped while it ran"
        assert [r.message for r in records[:2]] == [
            ToolResult(call_id=f"k-{m}", name="add", content=unknown, is_error=True, turn_id="m1")
            for m in ("b", "c")]
        assert isinstance(records[2].message, Error)
        assert [e.type for e in (await events(st))[-4:]] == [
            "tool_failed", "tool_failed", "error", "touched"]
        assert (await memory(st))[-2:] == [ToolItem(call_id=f"k-{m}", name="add", content=unknown)
                                           for m in ("b", "c")]


@case(ops.PurgeTemporary)
async def _purge(st: Storage) -> None:
    await create(st, "keep")
    await create(st, "temp", temporal=True)
    assert await st.write(ops.PurgeTemporary()) == 1
    assert [c.id for c in await st.reader.list_conversations(0, 10)] == ["keep"]
    assert [e.type for e in (await events(st))[-2:]] == ["conversation_closing", "deleted"]


# --- A2A -----------------------------------------------------------------------------------------


@case(ops.PutA2ATask, "task_id", "context_id", "conversation_id", "state", "task", "update",
      "expect_seq")
async def _put_task(st: Storage) -> None:
    await create(st)
    op = ops.PutA2ATask(task_id="t", context_id="x", conversation_id="c", state="working",
                        task=b'{"v":1}', update=b'{"u":1}', expect_seq=None)
    first = await st.write(op)
    row = await st.reader.get_a2a_task("t")
    assert row is not None and (row.id, row.context_id, row.conversation_id, row.state) == (
        "t", "x", "c", "working")
    assert (row.payload, row.first_seq, row.seq) == (b'{"v":1}', first, first)
    last = (await events(st))[-1]
    assert (last.kind, last.type, last.offset) == ("a2a", "task_updated", first)
    assert last.event.event.update == msgspec.Raw(b'{"u":1}')  # type: ignore[union-attr]
    with pytest.raises(ConflictError):
        await st.write(op)  # it exists now: expect_seq None is stale
    second = await st.write(msgspec.structs.replace(op, state="done", task=b'{"v":2}',
                                                    expect_seq=first))
    row = await st.reader.get_a2a_task("t")
    assert row is not None and (row.state, row.payload, row.first_seq, row.seq) == (
        "done", b'{"v":2}', first, second)
    with pytest.raises(NotFoundError):
        await st.write(msgspec.structs.replace(op, task_id="t2", conversation_id="nope"))
    assert await st.write(msgspec.structs.replace(op, task_id="t3", conversation_id=None)) > second


# --- users (docs/USERS.md) -----------------------------------------------------------------------


@case(ops.CreateConversation, "owner")
async def _owner(st: Storage) -> None:
    from agentik.limits import utc_day
    from agentik.wire import TurnTokens

    for cid, owner in (("c", "alice"), ("d", "bob"), ("e", None)):
        await st.write(ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                              system_prompt="s", owner=owner))
    assert await st.reader.users_of(["c", "d", "e", "x"]) == {"c": "alice", "d": "bob"}
    assert [c.id for c in await st.reader.list_conversations_of("alice", 0, 10)] == ["c"]
    today = utc_day(time.time())
    for cid, mid, tokens in (("c", "m1", (7, 3)), ("c", "m2", (20, 5)), ("e", "m3", (100, 1))):
        await send(st, mid, cid)
        answer = AssistantMessage(content=[Text(body="a")],
                                  tokens=TurnTokens(prompt=tokens[0], completion=tokens[1]))
        await st.write(ops.FinishTurn(conversation_id=cid, turn_id=mid,
                                      assistant=(f"a-{mid}", answer)))
    await send(st, "open", "c")
    # alice: one conversation kept, one turn open, 7 + 3 + 20 + 5 tokens; "e" has no user
    assert await st.reader.user_standing("alice", today) == (1, 1, 35)
    assert await st.reader.user_standing("bob", today) == (1, 0, 0)
    assert await st.reader.user_standing("alice", "1999-01-01") == (1, 1, 0)
    assert [r.id for r in await st.reader.journal_of("alice", 0, None, 100)] == [
        "m1", "a-m1", "m2", "a-m2", "open"]
    assert await st.reader.journal_count_of("bob", 0) == 0
    await st.write(ops.PutA2ATask(task_id="t", context_id="x", conversation_id="c",
                                  state="working", task=b"{}", update=b"{}", expect_seq=None))
    assert [r.id for r in (await st.reader.list_a2a_tasks(None, None, None, 10, "alice"))[0]
            ] == ["t"]
    assert await st.reader.list_a2a_tasks(None, None, None, 10, "bob") == ([], 0)
    # deleted, the conversation is still known to be alice's (a replay filters by it)
    await st.write(ops.DeleteConversation(conversation_id="c"))
    assert await st.reader.users_of(["c"]) == {"c": "alice"}
    assert await st.reader.user_standing("alice", today) == (0, 0, 35)
async def test_text_with_a_nul_is_refused_alone(target: StorageTarget) -> None:
    """Text a client gave (an id in a URL, a title) with a NUL character, which PostgreSQL's text
    cannot hold, is refused on both engines before the engine sees it: the request gets
    InvalidInputError, the writes batched with it are stored, a read with it finds nothing."""
    with trio.fail_after(30):
        async with open_storage(target) as st:
            await create(st)
            bad = ops.RenameConversation(conversation_id="c", title="a\x00b")
            results: list[object] = []

            async def write(op: ops.AnyOp) -> None:
                try:
                    results.append(await st.write(op))
                except InvalidInputError as exc:
                    results.append(exc)

            async with trio.open_nursery() as nursery:  # one batch, as far as the actor goes
                nursery.start_soon(write, bad)
                nursery.start_soon(write, ops.RenameConversation(conversation_id="c", title="ok"))
                nursery.start_soon(write, ops.DeleteConversation(conversation_id="x\x00"))
            assert sum(isinstance(r, InvalidInputError) for r in results) == 2
            stored = await st.reader.get_conversation("c")
            assert stored is not None and stored.title == "ok"
            with pytest.raises(InvalidInputError):
                await st.reader.get_conversation("c\x00")


@case(ops.PutA2ATask, "chunk")
async def _put_task_chunk(st: Storage) -> None:
    """A chunk stores its event only: the row keeps the last whole change and its seq, which
    the next change (a chunk or a whole one) still expects."""
    await create(st)
    op = ops.PutA2ATask(task_id="t", context_id="x", conversation_id="c", state="working",
                        task=b'{"v":1}', update=b"{}", expect_seq=None)
    first = await st.write(op)
    chunk = msgspec.structs.replace(op, task=b"", update=b'{"c":1}', expect_seq=first, chunk=True)
    offsets = [await st.write(chunk), await st.write(chunk)]
    row = await st.reader.get_a2a_task("t")
    assert row is not None and (row.payload, row.seq) == (b'{"v":1}', first)
    assert [(e.offset, e.type) for e in (await events(st))[-2:]] == [
        (o, "task_updated") for o in offsets]
    with pytest.raises(ConflictError):
        await st.write(msgspec.structs.replace(chunk, expect_seq=offsets[-1]))
    last = await st.write(msgspec.structs.replace(op, task=b'{"v":2}', expect_seq=first))
    row = await st.reader.get_a2a_task("t")
    assert row is not None and (row.payload, row.seq) == (b'{"v":2}', last)


# --- webhooks (docs/WEBHOOKS.md) -----------------------------------------------------------------

HOOK = ops.WebhookSpec(id="h", url="http://127.0.0.1:9/in", events=("turn.completed",),
                       secret="whsec_AAAA")


@case(ops.PutWebhook, "spec", "after", "replace")
async def _put_webhook(st: Storage) -> None:
    """A new subscription starts after ``after``; the same id again changes nothing unless
    ``replace`` (its definition then, never its progress)."""
    spec = msgspec.structs.replace(
        HOOK, events=("turn.completed", "turn.failed"), agent="a", conversation_id="c",
        task_id="t", source="a2a", config=b'{"id":"h"}')
    assert await st.write(ops.PutWebhook(spec=spec, after=7)) is True
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.spec, row.after, row.attempts, row.failing_since) == (
        spec, 7, 0, None)
    assert row.created_at > 0
    other = msgspec.structs.replace(spec, url="http://127.0.0.1:9/other", events=("x",))
    assert await st.write(ops.PutWebhook(spec=other, after=0)) is False
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.spec, row.after) == (spec, 7)
    await st.write(ops.WebhookProgress(webhook_id="h", after=9))
    assert await st.write(ops.PutWebhook(spec=other, after=0, replace=True)) is False
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.spec, row.after) == (other, 9)
    assert [r.spec.id for r in await st.reader.webhooks()] == ["h"]
    assert [r.spec.id for r in await st.reader.webhooks("t")] == ["h"]
    assert await st.reader.webhooks("t2") == []
    with pytest.raises(InvalidInputError):
        await st.write(ops.PutWebhook(spec=msgspec.structs.replace(spec, id="x\x00"), after=0))


@case(ops.DeleteWebhook, "webhook_id")
async def _delete_webhook(st: Storage) -> None:
    await st.write(ops.PutWebhook(spec=HOOK, after=0))
    await st.write(ops.PutWebhook(spec=msgspec.structs.replace(HOOK, id="k"), after=0))
    line = ops.WebhookAttempt(offset=1, type="turn.completed", attempt=1, outcome="delivered")
    await st.write(ops.WebhookProgress(webhook_id="h", after=1, log=(line,)))
    assert await st.write(ops.DeleteWebhook(webhook_id="h")) is True
    assert await st.write(ops.DeleteWebhook(webhook_id="h")) is False
    assert await st.reader.get_webhook("h") is None
    assert await st.reader.webhook_deliveries("h", 10) == []
    assert [r.spec.id for r in await st.reader.webhooks()] == ["k"]
    assert await st.write(ops.WebhookProgress(webhook_id="h", after=2)) is False


@case(ops.WebhookProgress, "webhook_id", "after", "attempts", "retry_in")
async def _webhook_progress(st: Storage) -> None:
    """Progress: its cursor, its failed attempts, the next one ``retry_in`` after the write (the
    writer's clock), failing since its first failure; back to none once delivered."""
    await st.write(ops.PutWebhook(spec=HOOK, after=0))
    before = time.time()
    assert await st.write(ops.WebhookProgress(webhook_id="h", after=3, attempts=1,
                                              retry_in=100.0)) is True
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.after, row.attempts) == (3, 1)
    assert row.failing_since is not None and before - 1 <= row.failing_since <= time.time()
    assert row.failing_since + 99 <= row.next_at <= time.time() + 101
    since = row.failing_since
    await st.write(ops.WebhookProgress(webhook_id="h", after=3, attempts=2, retry_in=0.0))
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.attempts, row.failing_since) == (2, since)
    assert row.next_at <= time.time()
    await st.write(ops.WebhookProgress(webhook_id="h", after=4))
    row = await st.reader.get_webhook("h")
    assert row is not None and (row.after, row.attempts, row.failing_since) == (4, 0, None)


@case(ops.WebhookProgress, "log")
async def _webhook_log(st: Storage) -> None:
    """The log keeps its newest lines, newest first, each subscription its own."""
    await st.write(ops.PutWebhook(spec=HOOK, after=0))
    await st.write(ops.PutWebhook(spec=msgspec.structs.replace(HOOK, id="k"), after=0))
    lines = [ops.WebhookAttempt(offset=i, type="turn.failed", attempt=1, outcome="failed",
                                status=503, error="down") for i in range(1, 151)]
    await st.write(ops.WebhookProgress(webhook_id="k", after=0, log=(lines[0],)))
    for i in range(0, 150, 50):
        await st.write(ops.WebhookProgress(webhook_id="h", after=i, log=tuple(lines[i:i + 50])))
    await st.write(ops.WebhookProgress(webhook_id="h", after=150, log=tuple(lines[:100])))
    await st.write(ops.WebhookProgress(webhook_id="h", after=150, log=(lines[-1],)))
    got = await st.reader.webhook_deliveries("h", 1000)
    # cut to the newest KEEP (PostgreSQL cuts what was stored before the write: one more)
    assert ops.DELIVERY_LOG_KEEP <= len(got) <= ops.DELIVERY_LOG_KEEP + 1
    assert [d.attempt for d in got[:101]] == [lines[-1], *lines[:100][::-1]]
    assert [d.attempt for d in got[101:200]] == lines[51:150][::-1]
    assert got[0].at > 0
    assert [d.attempt for d in await st.reader.webhook_deliveries("k", 10)] == [lines[0]]
    assert len(await st.reader.webhook_deliveries("h", 5)) == 5
# --- branches (docs/PROTOCOL.md "Branches") ------------------------------------------------------


@case(ops.AppendUserMessage, "edit_of")
async def _edit(st: Storage) -> None:
    await create(st)
    first = await send(st, "m")
    edit = await st.write(ops.AppendUserMessage(
        conversation_id="c", message_id="m2", message=UserMessage(content=[Text(body="m2")]),
        edit_of="m"))
    assert isinstance(edit, MessageRecord) and edit.seq == first.seq + 2
    point, message = (await journal(st))[1:]
    assert point.message == BranchPoint(kind="edit", message_id="m") and message == edit
    assert [e.type for e in (await events(st))[-2:]] == ["branch_changed", "user_message"]
    assert [turn_id for turn_id, _ in await st.reader.queued_turns("c")] == ["m", "m2"]
    assert await st.reader.branched("c") and not await st.reader.branched("nope")


@case(ops.Regenerate, "conversation_id", "turn_id", "of")
async def _regenerate(st: Storage) -> None:
    await create(st)
    await send(st, "m")
    record = await st.write(ops.Regenerate(conversation_id="c", turn_id="r", of="m"))
    assert isinstance(record, MessageRecord) and record.id == "r"
    assert record.message == BranchPoint(kind="regenerate", message_id="m")
    assert (await events(st))[-1].type == "branch_changed"
    # its turn is queued with the record; a StartTurn without an item starts it
    queued = await st.reader.queued_turns("c")
    assert queued[-1] == ("r", record.message)
    await st.write(ops.StartTurn(conversation_id="c", turn_id="r", item=None))
    assert await memory(st) == [SystemItem(text="sys")]
    assert [t for t, _ in await st.reader.queued_turns("c")] == ["m"]
    with pytest.raises(NotFoundError):
        await st.write(ops.Regenerate(conversation_id="nope", turn_id="r2", of="m"))


@case(ops.Regenerate, "idempotency")
async def _regenerate_idempotent(st: Storage) -> None:
    await create(st)
    await send(st, "m")
    op = ops.Regenerate(conversation_id="c", turn_id="r", of="m", idempotency=key("f"))
    await st.write(op)
    assert await st.write(msgspec.structs.replace(op, turn_id="r2")) == ops.Replayed(
        result_id="r")
    assert len(await journal(st)) == 2


@case(ops.SwitchBranch, "conversation_id", "message_id", "to", "memory_from", "items")
async def _switch(st: Storage) -> None:
    await create(st)
    await send(st, "m", start=True)
    record = await st.write(ops.SwitchBranch(
        conversation_id="c", message_id="s", to="m", memory_from=2,
        items=((user("a"), "m"), (AssistantItem(content=[Text(body="b")]), None))))
    assert isinstance(record, MessageRecord) and record.id == "s"
    assert record.message == BranchPoint(kind="switch", message_id="m")
    assert await memory(st) == [SystemItem(text="sys"), user("a"),
                                AssistantItem(content=[Text(body="b")])]
    assert (await events(st))[-1].type == "branch_changed"
    with pytest.raises(NotFoundError):
        await st.write(msgspec.structs.replace(record_op := ops.SwitchBranch(
            conversation_id="c", message_id="s2", to="m", memory_from=2, items=()),
            conversation_id="nope"))
    await st.write(record_op)
    assert await memory(st) == [SystemItem(text="sys")]


@case(ops.SwitchBranch, "idempotency")
async def _switch_idempotent(st: Storage) -> None:
    await create(st)
    await send(st, "m")
    op = ops.SwitchBranch(conversation_id="c", message_id="s", to="m", memory_from=2,
                          items=(), idempotency=key("f"))
    await st.write(op)
    assert await st.write(msgspec.structs.replace(op, message_id="s2")) == ops.Replayed(
        result_id="s")


@case(ops.ResetMemory, "conversation_id", "memory_from", "items")
async def _reset(st: Storage) -> None:
    await create(st)
    await send(st, "m", start=True)
    await st.write(ops.ResetMemory(conversation_id="c", memory_from=2, items=((user("x"), "m"),)))
    assert await memory(st) == [SystemItem(text="sys"), user("x")]
    await st.write(ops.ResetMemory(conversation_id="c", memory_from=3, items=((user("y"), None),)))
    assert await memory(st) == [SystemItem(text="sys"), user("x"), user("y")]
    with pytest.raises(NotFoundError):
        await st.write(ops.ResetMemory(conversation_id="nope", memory_from=2, items=()))


@case(ops.ForkConversation, "conversation_id", "title", "system_prompt", "agent", "instructions",
      "owner", "messages", "items", "idempotency")
async def _fork(st: Storage) -> None:
    answer = AssistantMessage(content=[Text(body="a")], turn_id="f1")
    op = ops.ForkConversation(
        conversation_id="f", title="t", system_prompt="sys", agent="helper", instructions="i",
        owner="ann", idempotency=key("x"),
        messages=(("f1", UserMessage(content=[Text(body="q")])), ("f2", answer)),
        items=((user("q"), "f1"), (AssistantItem(content=[Text(body="a")]), "f2")))
    assert await st.write(op) == "f"
    stored = await st.reader.get_conversation("f")
    assert stored is not None and stored.seq == 3 and not stored.is_temporal
    assert (stored.title, stored.agent, stored.instructions) == ("t", "helper", "i")
    assert await st.reader.users_of(["f"]) == {"f": "ann"}
    assert [(r.id, r.message) for r in await journal(st, "f")] == [
        ("f1", UserMessage(content=[Text(body="q")])), ("f2", answer)]
    assert await memory(st, "f") == [SystemItem(text="sys"), user("q"),
                                     AssistantItem(content=[Text(body="a")])]
    assert [e.type for e in await events(st)] == ["created", "user_message", "assistant_message"]
    assert await st.reader.queued_turns("f") == []  # copies, not turns to run
    again = msgspec.structs.replace(op, conversation_id="g", messages=(), items=())
    assert await st.write(again) == ops.Replayed(result_id="f")
    with pytest.raises(InvalidInputError):
        await st.write(msgspec.structs.replace(again, title="a\x00b", idempotency=None))



async def test_a_deleted_conversation_takes_its_tasks_push_configs(target: StorageTarget) -> None:
    """Its A2A tasks go with it (``DeleteConversation``), and so do their push configs and their
    logs; another conversation's and the admin routes' subscriptions stay."""
    with trio.fail_after(30):
        async with open_storage(target) as st:
            for cid in ("c", "d"):
                await create(st, cid)
                await st.write(ops.PutA2ATask(task_id=f"t{cid}", context_id="x",
                                              conversation_id=cid, state="working",
                                              task=b"{}", update=b"{}", expect_seq=None))
                push = msgspec.structs.replace(HOOK, id=f"a2a/t{cid}/p", task_id=f"t{cid}",
                                               source="a2a")
                await st.write(ops.PutWebhook(spec=push, after=0))
                line = ops.WebhookAttempt(offset=1, type="task.updated", attempt=1,
                                          outcome="delivered")
                await st.write(ops.WebhookProgress(webhook_id=push.id, after=1, log=(line,)))
            await st.write(ops.PutWebhook(spec=HOOK, after=0))
            assert await st.write(ops.DeleteConversation(conversation_id="c")) is True
            assert sorted(r.spec.id for r in await st.reader.webhooks()) == ["a2a/td/p", "h"]
            assert await st.reader.webhook_deliveries("a2a/tc/p", 10) == []
            assert len(await st.reader.webhook_deliveries("a2a/td/p", 10)) == 1


# --- the runs (after every case is registered) -----------------------------------------------


@pytest.mark.parametrize("key", list(CASES), ids=lambda k: f"{k[0].__name__}.{k[1]}")
async def test_op_field(target: StorageTarget, key: tuple[type, str]) -> None:
    with trio.fail_after(30):
        async with open_storage(target) as st:
            await CASES[key](st)
