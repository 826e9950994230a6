"""A turn's write retried after a commit of unknown outcome (issue 17, ``ops.rechecked``): its
plan first reads whether the first attempt was stored and then stores nothing and returns what
is, else stores it as a first attempt would. Planned the same on both engines; only the retry
pays the read (a first attempt still follows the batch in flight, ``pg_flight``). The real cut
connection is ``tests/test_pg_unknown_outcome.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from agentik.actors import turn as logic
from agentik.actors.ending import TurnEndings
from agentik.errors import StorageOutcomeUnknownError, StorageUnavailableError
from agentik.storage import ops
from agentik.storage import queries as q
from agentik.storage.actor import Storage, run_storage
from agentik.storage.health import StorageHealth, retry_until_stored
from agentik.storage.pg_flight import Flight, seed_after
from agentik.storage.pg_plan import Conv, Found, Plan
from agentik.storage.pg_plan_ops import plan_op, read_found
from agentik.wire import (
    AssistantItem,
    AssistantMessage,
    Error,
    MessageRecord,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserMessage,
)
from tests.conftest import StorageTarget


def answer(cid: str = "c1", turn_id: str = "m1", mid: str = "a1") -> ops.FinishTurn:
    return ops.FinishTurn(conversation_id=cid, turn_id=turn_id,
                          assistant=(mid, AssistantMessage(content=[Text(body=mid)])),
                          item=AssistantItem(content=[Text(body=mid)]))


def failed(cid: str = "c1", turn_id: str = "m1") -> ops.FinishTurn:
    return ops.FinishTurn(conversation_id=cid, turn_id=turn_id, interrupted=True,
                          assistant=("p1", AssistantMessage(content=[])),
                          error=("e1", Error(message="x", turn_id=turn_id)))


def tool_result(cid: str = "c1", mid: str = "r1") -> ops.AppendToolResult:
    return ops.AppendToolResult(conversation_id=cid, message_id=mid,
                                result=ToolResult(call_id=mid, name="t", content="42"),
                                item=ToolItem(call_id=mid, name="t", content="42"))


def tool_calls(cid: str = "c1") -> ops.AppendToolCalls:
    return ops.AppendToolCalls(conversation_id=cid, item=AssistantItem(content=[]), calls=(
        ("t1", ToolCall(call_id="1", name="n", arguments="{}")),
        ("t2", ToolCall(call_id="2", name="n", arguments="{}"))))


def record(mid: str, seq: int) -> MessageRecord:
    return MessageRecord(id=mid, seq=seq, conversation_id="c1", created_at=1.0,
                         message=AssistantMessage(content=[Text(body=mid)]))


def test_rechecked_flags_only_a_turn_s_journal_writes() -> None:
    for op in (answer(), tool_result(), tool_calls()):
        again = ops.rechecked(op)
        assert again.recheck and not op.recheck  # type: ignore[union-attr]
        assert ops.rechecked(again) is again
        assert again == type(op)(**{**{f: getattr(op, f) for f in op.__struct_fields__},
                                    "recheck": True})
    start = ops.StartTurn(conversation_id="c1", turn_id="m1", item=AssistantItem(content=[]))
    assert ops.rechecked(start) is start
    assert ops.journal_ids(failed()) == ("p1", "e1")
    assert ops.journal_ids(tool_calls()) == ("t1", "t2")
    assert ops.journal_ids(tool_result()) == ("r1",)


def _plan(found: Found | None) -> Plan:
    p = Plan(epoch="e", now=5.0)
    p.conv["c1"] = Conv("c1", None, False, 1.0, 2.0, 7, None, True, 3)
    p.found = found
    return p


def _rows(p: Plan) -> tuple[Any, ...]:
    return (p.n, list(p.m_id), len(p.memory), list(p.turns_deleted), list(p.o_kind))


@pytest.mark.parametrize("op", [answer(), failed(), tool_result(), tool_calls()],
                         ids=["answer", "failed", "tool_result", "tool_calls"])
def test_a_recheck_that_finds_its_records_plans_nothing_and_returns_them(op: Any) -> None:
    ids = ops.journal_ids(op)
    records = {mid: record(mid, 10 + i) for i, mid in enumerate(ids)}
    p = _plan(Found(records=records, turns={("c1", "m1")}))
    result = plan_op(p, ops.rechecked(op))
    assert _rows(p) == (0, [], 0, [], [])  # nothing to store
    expected = [records[i] for i in ids]
    assert callable(result)
    assert result(123) == (expected[0] if type(op) is ops.AppendToolResult else expected)


@pytest.mark.parametrize("op", [answer(), failed(), tool_result(), tool_calls()],
                         ids=["answer", "failed", "tool_result", "tool_calls"])
def test_a_recheck_that_finds_nothing_plans_what_a_first_attempt_plans(op: Any) -> None:
    first = _plan(None)
    plain = plan_op(first, op)
    p = _plan(Found(turns={("c1", "m1")}))  # the turn is still open
    assert plan_op(p, ops.rechecked(op)) == plain
    assert _rows(p) == _rows(first) and p.n > 0


def test_a_rechecked_ending_of_a_turn_closed_meanwhile_stores_nothing() -> None:
    """Its turn row is gone (the ending is stored, or another closed the turn): a second
    terminal record would be one too many."""
    p = _plan(Found())
    assert plan_op(p, ops.rechecked(answer()))(0) == []  # type: ignore[operator]
    assert _rows(p) == (0, [], 0, [], [])


def test_only_a_retry_needs_a_read_first() -> None:
    class NoReads:
        def execute(self, *args: object) -> None:
            raise AssertionError("a batch without a recheck read something")

    batch: list[ops.AnyOp] = [answer(), tool_result(), tool_calls()]
    assert read_found(NoReads(), batch) is None  # type: ignore[arg-type]
    after = Flight([], _plan(None), [])
    assert seed_after(Plan(epoch="e", now=1.0), batch, after, {}) is not None  # follows
    for i in range(len(batch)):
        again = list(batch)
        again[i] = ops.rechecked(batch[i])
        assert seed_after(Plan(epoch="e", now=1.0), again, after, {}) is None


async def test_a_retry_after_an_unknown_outcome_is_rechecked() -> None:
    health = StorageHealth()
    written: list[ops.AnyOp] = []
    errors = [StorageUnavailableError("full"), StorageOutcomeUnknownError("unknown"),
              StorageUnavailableError("refused")]

    async def write(op: ops.AnyOp) -> str:
        written.append(op)
        if errors:
            raise errors.pop(0)
        return "stored"

    with trio.fail_after(10):
        assert await retry_until_stored(write, health, answer()) == "stored"
    # as it is until the outcome is unknown, rechecked from then on
    assert written == [answer(), answer()] + [ops.rechecked(answer())] * 2


async def test_an_ending_handed_over_after_a_cancel_goes_rechecked() -> None:
    """The actor is stopped while its turn's ending is retried: the op it attempted may be
    stored (an unknown outcome), so the registry gets it rechecked; those after it as they
    are."""
    handed: list[Any] = []

    class Keeper:
        def unsettled(self, h: Any, pending: Any) -> None:
            handed.extend(pending)

    class Handle:
        conversation_id = "c1"
        keeper = Keeper()

    class Memory:
        async def write(self, op: ops.AnyOp) -> None:
            await trio.sleep_forever()  # an outage: retried until cancelled

    class Actor(TurnEndings):
        async def close_llm(self) -> None:
            pass

        def online(self, event: Any) -> None:
            pass

    actor = Actor()
    actor.h, actor.memory = Handle(), Memory()  # type: ignore[assignment]
    state = logic.TurnState(conversation_id="c1", turn_id="m1")
    call = ToolCallSpec(call_id="k", name="n", arguments="{}")
    state.pending_calls = [call]
    closing = logic.end(logic.TurnState(conversation_id="c1", turn_id="m1"), logic.Cancelled())
    with trio.move_on_after(0.1):
        await actor._end(state, logic.Cancelled())
    assert [type(op) for op in handed] == [ops.AppendToolResult, ops.FinishTurn]
    assert handed[0].recheck and not handed[1].recheck
    assert handed[1].error[1] == closing[-1].error[1]  # type: ignore[union-attr]

    handed.clear()
    with trio.move_on_after(0.1):
        await actor._store_answer(state, answer())
    assert handed == [ops.rechecked(answer())]


@asynccontextmanager
async def _storage(target: StorageTarget) -> AsyncIterator[Storage]:
    async with trio.open_nursery() as nursery:
        st: Storage = await nursery.start(partial(run_storage, target.path,
                                                  database_url=target.url))
        yield st
        nursery.cancel_scope.cancel()


async def _turn(st: Storage, cid: str, mid: str) -> None:
    await st.write(ops.AppendUserMessage(conversation_id=cid, message_id=mid,
                                         message=UserMessage(content=[Text(body=mid)])))


async def test_both_engines_plan_a_recheck_alike(target: StorageTarget) -> None:
    async with _storage(target) as st:
        await st.write(ops.CreateConversation(conversation_id="c1", title=None,
                                              is_temporal=False, system_prompt="s"))
        await _turn(st, "c1", "m1")
        for op in (tool_calls(), tool_result()):
            first = await st.write(op)
            head = st.hub.head
            assert await st.write(ops.rechecked(op)) == first  # found: nothing more stored
            assert st.hub.head == head
        first = await st.write(answer())
        head = st.hub.head
        assert await st.write(ops.rechecked(answer())) == first
        # a turn closed without this op's records (recovery, say): nothing stored either
        await _turn(st, "c1", "m2")
        await st.write(ops.RecoverTurns(conversation_id="c1"))
        head = st.hub.head
        assert await st.write(ops.rechecked(answer(turn_id="m2", mid="a2"))) == []
        assert st.hub.head == head
        # not stored yet: a recheck stores it as a first attempt does
        await _turn(st, "c1", "m3")
        stored = await st.write(ops.rechecked(failed(turn_id="m3")))
        assert [r.id for r in stored] == ["p1", "e1"]
        journal = await st.reader.run(q.get_messages, "c1", 0, 0, 100)
        assert [m.id for m in journal if m.id in ("p1", "e1", "a1", "r1", "t1", "t2")] == [
            "t1", "t2", "r1", "a1", "p1", "e1"]
        assert stored == [m for m in journal if m.id in ("p1", "e1")]
        memory = await st.reader.run(q.working_memory, "c1")
        assert [type(item).__name__ for _, item in memory] == [
            "SystemItem", "AssistantItem", "ToolItem", "AssistantItem"]  # each once
