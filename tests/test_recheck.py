"""A turn's write retried after a commit of unknown outcome (issue 17, ``ops.rechecked``): its
plan first reads whether the first attempt was stored and then stores nothing and returns what
is, else stores it as a first attempt would. Planned the same on both engines; only the retry
pays the read (a first attempt still follows the batch in flight, ``pg.flight``). The real cut
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
from agentik.errors import NotFoundError, StorageOutcomeUnknownError, StorageUnavailableError
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.health import StorageHealth, retry_until_stored
from agentik.storage.pg.flight import Flight, seed_after
from agentik.storage.pg.plan import Conv, Found, Plan
from agentik.storage.pg.plan_ops import plan_op, read_found
from agentik.wire import (
    AssistantItem,
    AssistantMessage,
    Error,
    MessageRecord,
    SummaryItem,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserItem,
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


def start(cid: str = "c1", turn_id: str = "m1") -> ops.StartTurn:
    return ops.StartTurn(conversation_id=cid, turn_id=turn_id,
                         item=UserItem(content=[Text(body=turn_id)]))


def compact(before: int = 4, summary: str | None = "sum", dropped: int = 2) -> ops.Compact:
    return ops.Compact(conversation_id="c1", before_order_idx=before, dropped=dropped,
                       summary=None if summary is None else SummaryItem(text=summary))


def test_rechecked_flags_only_a_turn_s_writes() -> None:
    for op in (answer(), tool_result(), tool_calls(), start(), compact()):
        again = ops.rechecked(op)
        assert again.recheck and not op.recheck  # type: ignore[union-attr]
        assert ops.rechecked(again) is again
        assert again == type(op)(**{**{f: getattr(op, f) for f in op.__struct_fields__},
                                    "recheck": True})
    rename = ops.RenameConversation(conversation_id="c1", title="t")
    assert ops.rechecked(rename) is rename
    assert ops.journal_ids(failed()) == ("p1", "e1")
    assert ops.journal_ids(tool_calls()) == ("t1", "t2")
    assert ops.journal_ids(tool_result()) == ("r1",)
    assert ops.journal_ids(start()) == ops.journal_ids(compact()) == ()


def test_a_compaction_is_stored_when_its_range_holds_its_summary_alone() -> None:
    """Before it, the range held the items it drops (``dropped`` of them); after it, its
    summary alone (none without one)."""
    summary, other = SummaryItem(text="sum"), UserItem(content=[Text(body="q")])
    assert ops.compacted(compact(), [summary])
    assert not ops.compacted(compact(), [summary, other])
    assert not ops.compacted(compact(), [other])
    assert not ops.compacted(compact(), [SummaryItem(text="an older one")])
    assert not ops.compacted(compact(), [])
    assert ops.compacted(compact(summary=None), [])
    assert not ops.compacted(compact(summary=None), [other])
    # one that drops nothing changes nothing there: it cannot tell, so planned as a first one
    assert not ops.compacted(compact(summary=None, dropped=0), [])


def _plan(found: Found | None) -> Plan:
    p = Plan(epoch="e", now=5.0)
    p.conv["c1"] = Conv("c1", None, False, 1.0, 2.0, 7, None, True, 3, "default", None)
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


def _all_rows(p: Plan) -> tuple[Any, ...]:
    return (*_rows(p), list(p.memory), list(p.memory_cut), list(p.turns_running), dict(p.turns))


def _cut_plan(found: Found | None) -> Plan:
    p = _plan(found)
    p.compact_first["c1"] = 2  # the first item after the system prompt (PgWriter._load)
    return p


@pytest.mark.parametrize("op", [start(), compact()], ids=["start", "compact"])
def test_a_recheck_of_a_memory_write_found_stored_plans_nothing(op: Any) -> None:
    """A StartTurn whose user item is in working memory (else it would be there twice), a
    Compact whose cut is (else a second CompactionTriggered): nothing planned, None returned
    as by a first success."""
    p = _cut_plan(Found(started={("c1", "m1")}, compacted={("c1", 4)}))
    empty = _all_rows(p)
    result = plan_op(p, ops.rechecked(op))
    assert _all_rows(p) == empty and p.n == 0
    assert callable(result) and result(123) is None


@pytest.mark.parametrize("op", [start(), compact()], ids=["start", "compact"])
def test_a_recheck_of_a_memory_write_not_stored_plans_a_first_attempt(op: Any) -> None:
    first = _cut_plan(None)
    plain = plan_op(first, op)
    # not stored: another turn started, another cut made, nothing of this one
    p = _cut_plan(Found(started={("c1", "m0"), ("c2", "m1")}, compacted={("c1", 3)}))
    again = plan_op(p, ops.rechecked(op))
    assert _all_rows(p) == _all_rows(first) and (p.memory or p.memory_cut)
    assert again(0) is plain(0) is None  # type: ignore[operator]


def test_only_a_retry_needs_a_read_first() -> None:
    class NoReads:
        def execute(self, *args: object) -> None:
            raise AssertionError("a batch without a recheck read something")

    batch: list[ops.AnyOp] = [answer(), tool_result(), tool_calls(), start()]
    assert read_found(NoReads(), [*batch, compact()]) is None  # type: ignore[arg-type]
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


async def _turn(st: Storage, cid: str, mid: str, *, running: bool = False) -> None:
    await st.write(ops.AppendUserMessage(
        conversation_id=cid, message_id=mid, message=UserMessage(content=[Text(body=mid)]),
        start=UserItem(content=[Text(body=mid)]) if running else None))


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
        await _turn(st, "c1", "m2", running=True)
        await st.write(ops.RecoverTurns(conversation_id="c1"))
        head = st.hub.head
        assert await st.write(ops.rechecked(answer(turn_id="m2", mid="a2"))) == []
        assert st.hub.head == head
        # not stored yet: a recheck stores it as a first attempt does
        await _turn(st, "c1", "m3")
        stored = await st.write(ops.rechecked(failed(turn_id="m3")))
        assert [r.id for r in stored] == ["p1", "e1"]
        journal = await st.reader.get_messages("c1", 0, 0, 100)
        assert [m.id for m in journal if m.id in ("p1", "e1", "a1", "r1", "t1", "t2")] == [
            "t1", "t2", "r1", "a1", "p1", "e1"]
        assert stored == [m for m in journal if m.id in ("p1", "e1")]
        memory = await st.reader.working_memory("c1")
        assert [type(item).__name__ for _, item in memory] == [
            "SystemItem", "AssistantItem", "ToolItem", "AssistantItem", "UserItem"]  # each once


def test_a_recheck_of_memory_writes_reads_working_memory_alone() -> None:
    """A rechecked StartTurn or Compact reads nothing of the journal nor the turn rows."""
    read: list[str] = []

    class Conn:
        def execute(self, sql: str, args: object) -> list[Any]:
            read.append(sql.split(" WHERE ")[0])
            return []

    found = read_found(Conn(), [ops.rechecked(start()), ops.rechecked(compact())])  # type: ignore[arg-type]
    assert found == Found()
    assert read == ["SELECT conversation_id, source_message_id FROM working_memory",
                    "SELECT payload FROM working_memory"]


async def test_both_engines_recheck_a_start_and_a_compaction_alike(target: StorageTarget) -> None:
    async with _storage(target) as st:
        await st.write(ops.CreateConversation(conversation_id="c1", title=None,
                                              is_temporal=False, system_prompt="s"))

        async def memory() -> list[tuple[int, str]]:
            items = await st.reader.working_memory("c1")
            return [(i, getattr(item, "text", None) or item.content[0].body)  # type: ignore[union-attr]
                    for i, item in items]

        await _turn(st, "c1", "m1")
        assert await st.write(start(turn_id="m1")) is None
        head = st.hub.head
        assert await st.write(ops.rechecked(start(turn_id="m1"))) is None  # found: no 2nd item
        assert await memory() == [(1, "s"), (2, "m1")] and st.hub.head == head
        await _turn(st, "c1", "m2")
        assert await st.write(ops.rechecked(start(turn_id="m2"))) is None  # not stored: stored
        assert await memory() == [(1, "s"), (2, "m1"), (3, "m2")]

        assert await st.write(compact(before=3, summary="sum", dropped=1)) is None
        head = st.hub.head
        assert await st.write(ops.rechecked(compact(before=3, summary="sum", dropped=1))) is None
        assert await memory() == [(1, "s"), (2, "sum"), (3, "m2")]
        assert st.hub.head == head  # no second CompactionTriggered
        # not stored: a recheck cuts as a first attempt does (and tells it)
        assert await st.write(ops.rechecked(compact(before=4, summary=None, dropped=2))) is None
        assert await memory() == [(1, "s")] and st.hub.head == head + 1
        assert await st.write(ops.rechecked(compact(before=4, summary=None, dropped=2))) is None
        assert st.hub.head == head + 1
        # its conversation gone: refused as a first attempt is
        assert await st.write(ops.DeleteConversation(conversation_id="c1"))
        for op in (compact(before=4, summary=None, dropped=2), start(turn_id="m2")):
            with pytest.raises(NotFoundError):
                await st.write(ops.rechecked(op))
